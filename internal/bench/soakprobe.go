package bench

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
)

// SoakSample is the relay read at one moment of a soak.
type SoakSample struct {
	At        time.Time `json:"-"`
	ElapsedS  float64   `json:"elapsed_s"`
	Written   int64     `json:"written"`   // transactions committed by the soak's writers so far
	Published float64   `json:"published"` // outbox_relay_published_total
	// HeapLiveMiB is go_gc_heap_live_bytes (the heap the last collection
	// kept), 0 when the relay does not export it; HeapAllocLowMiB the
	// lowest go_memstats_heap_alloc_bytes read. In a sample kept every
	// report period both are the lowest of that period.
	HeapLiveMiB     float64 `json:"heap_live_mib"`
	HeapAllocLowMiB float64 `json:"heap_alloc_low_mib"`
	RSSMiB          float64 `json:"rss_mib"`
	Goroutines      float64 `json:"goroutines"`
	OpenFiles       float64 `json:"open_files"`
	RelayDBConns    float64 `json:"relay_db_connections"`     // the relay's TCP connections to the database's port
	ServerConns     float64 `json:"server_threads_connected"` // the server's Threads_connected, every client counted
	CPUSeconds      float64 `json:"relay_cpu_s"`
	LoadAvg         string  `json:"load_avg"`
}

// prober reads a relay process: its /metrics and /proc, and the database
// server's Threads_connected.
type prober struct {
	url    string
	pid    int
	dbPort int // 0: the database's port is unknown and RelayDBConns stays 0
	db     *sql.DB
	client *http.Client
}

func newProber(metricsURL string, pid int, dsn string, db *sql.DB) *prober {
	p := &prober{url: metricsURL, pid: pid, db: db, client: &http.Client{Timeout: 10 * time.Second}}
	if c, err := mysql.ParseDSN(dsn); err == nil && c.Net == "tcp" {
		if i := strings.LastIndexByte(c.Addr, ':'); i >= 0 {
			p.dbPort, _ = strconv.Atoi(c.Addr[i+1:])
		} else {
			p.dbPort = 3306
		}
	}
	return p
}

// scrape returns the relay's /metrics as the sum of each metric's series,
// by name (histograms and summaries by their series' names).
func (p *prober) scrape(ctx context.Context) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.url, nil)
	if err != nil {
		return nil, fmt.Errorf("read relay metrics: %w", err)
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("read relay metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("read relay metrics: %s", resp.Status)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		name, rest, ok := strings.Cut(line, " ")
		if i := strings.IndexByte(line, '{'); i >= 0 {
			name, rest, ok = line[:i], line[strings.LastIndexByte(line, '}')+1:], true
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
		if ok && err == nil {
			out[name] += v
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read relay metrics: %w", err)
	}
	return out, nil
}

// sample reads every figure of a SoakSample once.
func (p *prober) sample(ctx context.Context, elapsed float64) (SoakSample, error) {
	m, err := p.scrape(ctx)
	if err != nil {
		return SoakSample{}, err
	}
	const mib = 1 << 20
	s := SoakSample{At: time.Now(), ElapsedS: elapsed, Published: m["outbox_relay_published_total"],
		HeapLiveMiB: m["go_gc_heap_live_bytes"] / mib, HeapAllocLowMiB: m["go_memstats_heap_alloc_bytes"] / mib,
		Goroutines: m["go_goroutines"], LoadAvg: loadAvg()}
	if s.CPUSeconds, err = procCPU(p.pid); err != nil {
		return SoakSample{}, fmt.Errorf("read relay CPU: %w", err)
	}
	if s.RSSMiB, err = procRSSMiB(p.pid); err != nil {
		return SoakSample{}, err
	}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", p.pid))
	if err != nil {
		return SoakSample{}, fmt.Errorf("count relay open files: %w", err)
	}
	s.OpenFiles = float64(len(fds))
	s.RelayDBConns = float64(p.connsTo(fds))
	var name string
	if err := p.db.QueryRowContext(ctx, "SHOW GLOBAL STATUS LIKE 'Threads_connected'").Scan(&name, &s.ServerConns); err != nil {
		return SoakSample{}, fmt.Errorf("read Threads_connected: %w", err)
	}
	return s, nil
}

// procRSSMiB is a live process's resident set (VmRSS) in MiB.
func procRSSMiB(pid int) (float64, error) {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, fmt.Errorf("read relay process status: %w", err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
			return kb / 1024, nil
		}
	}
	return 0, fmt.Errorf("/proc/%d/status: no VmRSS", pid)
}

// connsTo counts the relay's established TCP connections to the database's
// port: its socket descriptors (fds, entries of /proc/<pid>/fd) found in
// the process's /proc/<pid>/net/tcp{,6} with that remote port.
func (p *prober) connsTo(fds []os.DirEntry) int {
	if p.dbPort == 0 {
		return 0
	}
	inodes := socketInodes(fmt.Sprintf("/proc/%d/net", p.pid), remoteAddr, p.dbPort, tcpEstablished)
	n := 0
	for _, fd := range fds {
		link, err := os.Readlink(filepath.Join(fmt.Sprintf("/proc/%d/fd", p.pid), fd.Name()))
		if err == nil && inodes[link] {
			n++
		}
	}
	return n
}
