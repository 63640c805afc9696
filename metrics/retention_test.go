package metrics

import (
	"errors"
	"math"
	"testing"
	"time"
)

func TestExpiryOf(t *testing.T) {
	for _, tc := range []struct {
		name string
		vars map[string]string
		want time.Duration
		err  bool
	}{
		{"MariaDB default: never", map[string]string{"binlog_expire_logs_seconds": "0", "expire_logs_days": "0.000000"}, 0, false},
		{"MariaDB seconds", map[string]string{"binlog_expire_logs_seconds": "43200", "expire_logs_days": "0.500000"}, 12 * time.Hour, false},
		{"MariaDB fractional days only", map[string]string{"expire_logs_days": "0.250000"}, 6 * time.Hour, false},
		{"MySQL 8.0 default", map[string]string{"binlog_expire_logs_seconds": "2592000", "expire_logs_days": "0", "binlog_expire_logs_auto_purge": "ON"}, 30 * 24 * time.Hour, false},
		{"MySQL 8.0 days when seconds 0", map[string]string{"binlog_expire_logs_seconds": "0", "expire_logs_days": "7"}, 7 * 24 * time.Hour, false},
		{"seconds win over days", map[string]string{"binlog_expire_logs_seconds": "3600", "expire_logs_days": "7"}, time.Hour, false},
		{"MySQL 8.4: no expire_logs_days", map[string]string{"binlog_expire_logs_seconds": "86400", "binlog_expire_logs_auto_purge": "ON"}, 24 * time.Hour, false},
		{"MySQL auto purge off", map[string]string{"binlog_expire_logs_seconds": "86400", "binlog_expire_logs_auto_purge": "OFF"}, 0, false},
		{"old server: days only", map[string]string{"expire_logs_days": "10"}, 240 * time.Hour, false},
		{"nothing known", map[string]string{}, 0, false},
		{"garbage seconds", map[string]string{"binlog_expire_logs_seconds": "soon"}, 0, true},
		{"garbage days", map[string]string{"expire_logs_days": "-1"}, 0, true},
	} {
		got, err := expiryOf(tc.vars)
		if (err != nil) != tc.err || got != tc.want {
			t.Errorf("%s: expiryOf(%v) = %v, %v; want %v (error %v)", tc.name, tc.vars, got, err, tc.want, tc.err)
		}
	}
}

func TestCompareBinlogNames(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		cmp  int
		ok   bool
	}{
		{"mysql-bin.000002", "mysql-bin.000010", -1, true},
		{"mysql-bin.999999", "mysql-bin.1000000", -1, true}, // string order would say +1
		{"mysql-bin.000010", "mysql-bin.000010", 0, true},
		{"binlog.000011", "binlog.000010", 1, true},
		{"binlog.000011", "mysql-bin.000010", 0, false},
		{"binlog", "binlog.000001", 0, false},
		{"binlog.", "binlog.000001", 0, false},
		{"", "binlog.000001", 0, false},
		{"my.host-bin.000003", "my.host-bin.000004", -1, true},
	} {
		cmp, ok := compareBinlogNames(tc.a, tc.b)
		if cmp != tc.cmp || ok != tc.ok {
			t.Errorf("compareBinlogNames(%q, %q) = %d, %v; want %d, %v", tc.a, tc.b, cmp, ok, tc.cmp, tc.ok)
		}
	}
}

func TestHeadroom(t *testing.T) {
	now := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	files := []string{"bin.000007", "bin.000008", "bin.000009"}
	day := 24 * time.Hour
	r := BinlogRetention{Expiry: 7 * day, Files: files, Now: now}
	week := (7 * day).Seconds()

	for _, tc := range []struct {
		name      string
		r         BinlogRetention
		file      string
		writtenAt time.Time
		want      float64 // NaN: want NaN
		err       error
	}{
		{"active file: the whole expiry", r, "bin.000009", time.Time{}, week, nil},
		{"active file ignores writtenAt", r, "bin.000009", now.Add(-30 * day), week, nil},
		{"older file written 1 day ago", r, "bin.000008", now.Add(-day), (6 * day).Seconds(), nil},
		{"older file written 6d23h ago", r, "bin.000007", now.Add(-7*day + time.Hour), 3600, nil},
		{"older file past expiry, not purged yet", r, "bin.000007", now.Add(-8 * day), 0, nil},
		{"writtenAt ahead of the server clock", r, "bin.000008", now.Add(time.Hour), week, nil},
		{"older file, time unknown", r, "bin.000008", time.Time{}, math.NaN(), ErrHeadroomUnknown},
		{"purged", r, "bin.000006", now, 0, ErrBinlogPurged},
		{"purged long ago, more digits", BinlogRetention{Expiry: day, Files: []string{"bin.1000001", "bin.1000002"}, Now: now}, "bin.999999", now, 0, ErrBinlogPurged},
		{"newer than the newest: another server", r, "bin.000010", now, math.NaN(), ErrHeadroomUnknown},
		{"other base name", r, "mysql-bin.000008", now, math.NaN(), ErrHeadroomUnknown},
		{"nothing stored", r, "", now, math.NaN(), ErrHeadroomUnknown},
		{"no files listed", BinlogRetention{Expiry: day, Now: now}, "bin.000001", now, math.NaN(), ErrHeadroomUnknown},
		{"gap in the list", BinlogRetention{Expiry: day, Files: []string{"bin.000001", "bin.000003"}, Now: now}, "bin.000002", now, math.NaN(), ErrHeadroomUnknown},
		{"never expires: active", BinlogRetention{Files: files, Now: now}, "bin.000009", time.Time{}, math.Inf(1), nil},
		{"never expires: old file, time unknown", BinlogRetention{Files: files, Now: now}, "bin.000007", time.Time{}, math.Inf(1), nil},
		{"never expires, but purged by hand", BinlogRetention{Files: files, Now: now}, "bin.000001", time.Time{}, 0, ErrBinlogPurged},
	} {
		got, err := tc.r.Headroom(tc.file, tc.writtenAt)
		if !errors.Is(err, tc.err) || (tc.err == nil) != (err == nil) {
			t.Errorf("%s: error %v, want %v", tc.name, err, tc.err)
		}
		if math.IsNaN(tc.want) != math.IsNaN(got) || (!math.IsNaN(got) && got != tc.want) {
			t.Errorf("%s: headroom %v, want %v", tc.name, got, tc.want)
		}
	}
}
