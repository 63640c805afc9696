package migrations

import (
	"strings"
	"testing"
	"time"
)

func TestNormType(t *testing.T) {
	for in, want := range map[string]string{
		"bigint(20) unsigned": "bigint unsigned", "BIGINT UNSIGNED": "bigint unsigned",
		"int(10) unsigned": "int unsigned", "bigint(20)": "bigint", "varchar(255)": "varchar(255)",
		"datetime(6)": "datetime(6)", "binary(16)": "binary(16)",
	} {
		if got := normType(in); got != want {
			t.Errorf("normType(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestRender(t *testing.T) {
	data := templateData{Table: "`t`", Partitions: dailyPartitions(time.Date(2026, 2, 27, 23, 59, 0, 0, time.UTC), 3)}
	for _, p := range []bool{false, true} {
		for _, m := range plan("t", p) {
			stmts, err := render(m.file, data)
			if err != nil {
				t.Fatal(err)
			}
			// Files create their tables. 0004 first upgrades the inbox with
			// an ALTER chosen in SQL and run as a prepared statement; it
			// creates one table and also runs again when the inbox is gone.
			creates, upgrade := len(m.tables), m.version == "0004_dedup_consumer"
			if upgrade {
				creates = 1
			}
			// 0005, 0007, 0008, 0009 and 0010 only alter, in the same way; 0006
			// alters so and creates a table.
			alter := m.version == "0005_progress_mode_reason" || m.version == "0006_pause_and_instances" ||
				m.version == "0007_progress_failed_at" || m.version == "0008_progress_broker" ||
				m.version == "0009_progress_outbox_table" || m.version == "0010_progress_stream_ids"
			n := 0
			for _, s := range stmts {
				create := strings.HasPrefix(s, "CREATE TABLE IF NOT EXISTS ")
				prepared := upgrade && (strings.HasPrefix(s, "SET @dedup_") || strings.HasSuffix(s, " dedup_alter") ||
					strings.HasPrefix(s, "PREPARE dedup_alter FROM @dedup_alter")) ||
					alter && (strings.HasPrefix(s, "SET @progress_") || strings.HasSuffix(s, " progress_alter") ||
						strings.HasPrefix(s, "PREPARE progress_alter FROM @progress_alter"))
				if create {
					n++
				}
				if !create && !prepared || strings.Contains(s, "{{") || strings.Contains(s, "--") {
					t.Errorf("%s: bad statement:\n%s", m.file, s)
				}
			}
			if n != creates {
				t.Errorf("%s: %d CREATE TABLE statements, want %d", m.file, n, creates)
			}
		}
	}
	want := "    PARTITION p20260227 VALUES LESS THAN ('2026-02-28 00:00:00'),\n" +
		"    PARTITION p20260228 VALUES LESS THAN ('2026-03-01 00:00:00'),\n" +
		"    PARTITION p20260301 VALUES LESS THAN ('2026-03-02 00:00:00'),\n" +
		"    PARTITION pmax VALUES LESS THAN (MAXVALUE)"
	if data.Partitions != want {
		t.Fatalf("partitions:\n%s\nwant\n%s", data.Partitions, want)
	}
}
