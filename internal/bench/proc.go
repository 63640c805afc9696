package bench

import (
	"context"
	"database/sql"
	"fmt"
	"math"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// procUsage reads a live process's CPU seconds (user+system) and peak RSS in
// MiB from /proc.
func procUsage(pid int) (cpuSeconds, peakRSSMiB float64, err error) {
	if cpuSeconds, err = procCPU(pid); err != nil {
		return 0, 0, fmt.Errorf("read relay process stats: %w", err)
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, fmt.Errorf("read relay process status: %w", err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
			peakRSSMiB = kb / 1024
		}
	}
	return cpuSeconds, peakRSSMiB, nil
}

// procCPU is a live process's CPU seconds (user+system) from /proc/<pid>/stat.
func procCPU(pid int) (float64, error) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// Fields after the parenthesised command name; utime and stime are the
	// 14th and 15th fields of the whole line, in clock ticks (100 per second
	// on Linux).
	s := string(stat)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	if len(fields) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(fields))
	}
	utime, _ := strconv.ParseFloat(fields[11], 64)
	stime, _ := strconv.ParseFloat(fields[12], 64)
	return (utime + stime) / 100, nil
}

// serverPID is the pid of the MySQL/MariaDB server behind db when it runs on
// this machine (its pid file is readable here), else 0: its CPU is then not
// measured.
func serverPID(ctx context.Context, db *sql.DB) int {
	var file string
	if err := db.QueryRowContext(ctx, "SELECT @@pid_file").Scan(&file); err != nil {
		return 0
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0
	}
	if _, err := procCPU(pid); err != nil {
		return 0
	}
	return pid
}

// brokerPID is the pid of the process listening on the AMQP URL's port on
// this machine (RabbitMQ's beam.smp), else 0: its CPU is then not measured.
func brokerPID(amqpURL string) int {
	u, err := url.Parse(amqpURL)
	if err != nil {
		return 0
	}
	port := u.Port()
	if port == "" {
		port = "5672"
		if u.Scheme == "amqps" {
			port = "5671"
		}
	}
	if ip := net.ParseIP(u.Hostname()); u.Hostname() != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return 0
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		return 0
	}
	return listenerPID(p)
}

// Columns of /proc/net/tcp{,6} and the socket states socketInodes matches.
const (
	localAddr, remoteAddr = 1, 2
	tcpEstablished        = "01"
	tcpListen             = "0A"
)

// socketInodes returns the sockets of the TCP tables in dir (/proc/net, or
// /proc/<pid>/net for a process's network namespace) in state whose
// address in column addr has port, as the /proc/<pid>/fd links to them
// read ("socket:[inode]").
func socketInodes(dir string, addr, port int, state string) map[string]bool {
	inodes := map[string]bool{}
	want := fmt.Sprintf(":%04X", port)
	for _, f := range []string{"tcp", "tcp6"} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			fs := strings.Fields(line)
			// sl local_address rem_address st ... inode (10th field)
			if len(fs) >= 10 && strings.HasSuffix(fs[addr], want) && fs[3] == state {
				inodes["socket:["+fs[9]+"]"] = true
			}
		}
	}
	return inodes
}

// listenerPID finds the process owning a listening TCP socket on port: the
// socket's inode in /proc/net/tcp{,6}, then the /proc/<pid>/fd link to it.
func listenerPID(port int) int {
	inodes := socketInodes("/proc/net", localAddr, port, tcpListen)
	if len(inodes) == 0 {
		return 0
	}
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		fds, _ := filepath.Glob(p + "/fd/*")
		for _, fd := range fds {
			if link, err := os.Readlink(fd); err == nil && inodes[link] {
				pid, _ := strconv.Atoi(filepath.Base(p))
				return pid
			}
		}
	}
	return 0
}

// machineBusy is the CPU seconds every core of the machine spent busy since
// boot (user, nice, system, irq, softirq and steal of /proc/stat), NaN when
// unreadable.
func machineBusy() float64 {
	stat, err := os.ReadFile("/proc/stat")
	if err != nil {
		return math.NaN()
	}
	line, _, _ := strings.Cut(string(stat), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return math.NaN()
	}
	var busy float64
	for _, i := range []int{1, 2, 3, 6, 7, 8} { // user nice system (idle iowait) irq softirq steal
		v, _ := strconv.ParseFloat(f[i], 64)
		busy += v
	}
	return busy / 100
}
