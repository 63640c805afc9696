package testenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/progress"
)

// Bounds of the waits on a private RabbitMQ node: limits for polled
// conditions, not sleeps. A node boots in about 5 s on a quiet machine
// (fresh or restarted alike; two cores) and stops cleanly in about 3 s; beside
// a whole test suite a restart has taken 90 s, so the start's bound is
// progress.Patience: only a node that is stuck fails it.
const (
	rabbitReadyTimeout = progress.Patience // start → first AMQP connection
	rabbitStopTimeout  = 60 * time.Second  // SIGTERM → exit, then SIGKILL
	rabbitPollInterval = 50 * time.Millisecond
	rabbitCtlTimeout   = time.Minute
)

// rabbitScriptDirs hold RabbitMQ's real scripts, tried before PATH: on
// Debian /usr/sbin/rabbitmq-server is a wrapper that switches to the
// rabbitmq user (when run as root) and sends the output to /var/log, so the
// test would neither own the process nor see why it failed.
var rabbitScriptDirs = []string{
	"/usr/lib/rabbitmq/bin",
	"/usr/lib/rabbitmq/lib/rabbitmq_server-*/sbin",
}

// RabbitNode is a private RabbitMQ node owned by one test: its own node name,
// AMQP port and distribution port on 127.0.0.1, its own data, log and
// Erlang-cookie directory under a temporary directory, no plugins (but see
// RabbitTLS and RabbitStreams). Unlike the
// shared broker of RabbitMQ it may be stopped and started again, which is
// what broker-outage tests need without breaking every other test.
//
// The node runs as a child process of the test binary (the foreground start
// script, which turns SIGTERM into a clean broker shutdown) and dies with it.
// Its methods are safe for concurrent use; Stop and Start may be repeated in
// any order, and the port, node name and data stay the same.
type RabbitNode struct {
	name     string // Erlang node name, unique to this node
	dir      string
	script   string // rabbitmq-server
	ctl      string // rabbitmqctl, "" when not found
	port     int    // AMQP; fixed once StartRabbitMQ returns
	distPort int
	outLog   string     // the start script's stdout and stderr
	nodeLog  string     // the broker's log file
	tls      *rabbitTLS // nil: no TLS listener
	// maxMessageSize is max_message_size in rabbitmq.conf; 0: not set.
	maxMessageSize int
	tlsPort        int      // the TLS listener's port when tls is set
	peers          []string // rabbitOptions.peers
	// streams: the rabbitmq_stream plugin is enabled, listening on
	// streamPort.
	streams    bool
	streamPort int

	mu   sync.Mutex
	proc *process // nil before the first start
}

// RabbitOption configures a node started by StartRabbitMQ.
type RabbitOption func(testing.TB, *rabbitOptions)

type rabbitOptions struct {
	tls    *rabbitTLS
	cookie string // the Erlang cookie; "" draws one (a cluster's nodes share theirs)
	// maxMessageSize is the node's max_message_size in bytes; 0 leaves
	// RabbitMQ's default (128 MiB).
	maxMessageSize int
	// peers are the nodes (running) a fresh node joins as it first boots
	// (peer discovery, classic_config); none: it forms a cluster of its own.
	peers   []string
	streams bool // enable rabbitmq_stream (RabbitStreams)
}

// RabbitStreams enables the rabbitmq_stream plugin on the node, listening on
// a free port of its own on 127.0.0.1 (see StreamURL) and advertising that
// address, so that a stream client's connection to a stream's leader comes
// back to it. Start (the first and every later one) waits until the stream
// port accepts connections too.
func RabbitStreams() RabbitOption {
	return func(_ testing.TB, o *rabbitOptions) { o.streams = true }
}

// RabbitMaxMessageSize sets the node's max_message_size: the broker closes
// a channel with 406 PRECONDITION_FAILED over a message whose body is
// larger. It is a setting of the whole node, which is why it needs a node
// of its own.
func RabbitMaxMessageSize(bytes int) RabbitOption {
	return func(_ testing.TB, o *rabbitOptions) { o.maxMessageSize = bytes }
}

// rabbitTLS is the node's TLS listener: PEM files of the CA that signs
// client certificates and of the node's own certificate.
type rabbitTLS struct{ caFile, certFile, keyFile string }

// RabbitTLS gives the node a second listener, for AMQP over TLS (see
// AMQPSURL), with a server certificate for "localhost" issued by ca. It
// verifies the client: a client must present a certificate signed by ca
// (ssl_options.verify = verify_peer, fail_if_no_peer_cert = true). It also
// enables the rabbitmq_auth_mechanism_ssl plugin and offers the EXTERNAL
// mechanism there, the user being the client certificate's common name
// (ssl_cert_login_from = common_name; see AddUser). The plain listener (URL)
// stays as it is.
func RabbitTLS(ca *CA) RabbitOption {
	return func(t testing.TB, o *rabbitOptions) {
		cert, key := ca.IssueFiles(t, "localhost")
		o.tls = &rabbitTLS{caFile: ca.CertFile, certFile: cert, keyFile: key}
	}
}

// StartRabbitMQ starts a private RabbitMQ node for this test only (own node
// name, free AMQP port, free distribution port, own mnesia and log
// directories under a temporary directory, no plugins so no management port
// clash), waits until it accepts AMQP connections as guest, and kills it and
// removes its directory at cleanup, also when the test fails. It works next
// to the machine's shared broker. When rabbitmq-server is not installed the
// test is skipped, or fails under Require.
//
// Starting takes about 5 s; prefer RabbitMQ unless the test stops the broker
// or needs an option (RabbitTLS).
func StartRabbitMQ(t testing.TB, opts ...RabbitOption) *RabbitNode {
	t.Helper()
	var o rabbitOptions
	for _, opt := range opts {
		opt(t, &o)
	}
	n, err := newRabbitNode(o)
	if err != nil {
		if errors.Is(err, errMissing) {
			unavailable(t, "cannot start a private RabbitMQ node: %v", err)
		}
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("testenv: tail of the log of RabbitMQ node %s:\n%s", n.name, n.logTail())
		}
		if err := n.destroy(); err != nil {
			t.Errorf("testenv: %v", err)
		}
	})
	return n
}

func newRabbitNode(o rabbitOptions) (_ *RabbitNode, err error) {
	script, err := findRabbitScript("rabbitmq-server")
	if err != nil {
		return nil, fmt.Errorf("%w: %v (Debian package rabbitmq-server)", errMissing, err)
	}
	ctl, _ := findRabbitScript("rabbitmqctl")
	dir, err := os.MkdirTemp(ScratchDir(), fmt.Sprintf("%s%d-rabbitmq-", serverDirPrefix, os.Getpid()))
	if err != nil {
		return nil, fmt.Errorf("create node directory: %w", err)
	}
	n := &RabbitNode{
		name:   fmt.Sprintf("outbox-test-%d-%08x@localhost", os.Getpid(), rand.Uint32()),
		dir:    dir,
		script: script,
		ctl:    ctl,
		outLog: filepath.Join(dir, "rabbitmq-server.out"),
		tls:    o.tls,

		maxMessageSize: o.maxMessageSize,
		peers:          o.peers,
		streams:        o.streams,
	}
	n.nodeLog = filepath.Join(dir, "log", n.name+".log")
	defer func() {
		if err != nil {
			_ = n.destroy()
		}
	}()
	for _, d := range []string{"mnesia", "log", "home"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o700); err != nil {
			return nil, fmt.Errorf("create node directory: %w", err)
		}
	}
	// An Erlang cookie of its own (HOME points here): nothing depends on, or
	// races to create, the invoking user's ~/.erlang.cookie.
	cookie := o.cookie
	if cookie == "" {
		cookie = fmt.Sprintf("OUTBOXTEST%016X", rand.Uint64())
	}
	var plugins []string
	if n.tls != nil {
		plugins = append(plugins, "rabbitmq_auth_mechanism_ssl")
	}
	if n.streams {
		plugins = append(plugins, "rabbitmq_stream")
	}
	files := map[string]string{
		"enabled_plugins":                       "[" + strings.Join(plugins, ",") + "].\n",
		"rabbitmq-env.conf":                     "", // instead of /etc/rabbitmq/rabbitmq-env.conf (its NODENAME)
		filepath.Join("home", ".erlang.cookie"): cookie,
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o400); err != nil {
			return nil, fmt.Errorf("write %s: %w", name, err)
		}
	}
	const startAttempts = 3 // fresh ports tried when a chosen one was taken meanwhile
	for attempt := 1; ; attempt++ {
		if err := n.pickPorts(); err != nil {
			return nil, err
		}
		err = n.start()
		if err == nil {
			return n, nil
		}
		if attempt == startAttempts || !strings.Contains(strings.ToLower(n.logTail()), "eaddrinuse") {
			return nil, err
		}
	}
}

// findRabbitScript finds one of RabbitMQ's scripts, preferring the real one
// over a distribution's wrapper.
func findRabbitScript(name string) (string, error) {
	for _, dir := range rabbitScriptDirs {
		matches, _ := filepath.Glob(filepath.Join(dir, name))
		for _, m := range matches {
			if fi, err := os.Stat(m); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
				return m, nil
			}
		}
	}
	return lookBinary(name)
}

// pickPorts chooses free ports for AMQP, distribution, TLS and streams and writes
// the configuration file (which also keeps /etc/rabbitmq/rabbitmq.conf, with
// the shared broker's listener, from being read).
func (n *RabbitNode) pickPorts() error {
	var ports [4]int
	var lns []net.Listener
	for i := range ports {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			for _, l := range lns {
				l.Close()
			}
			return fmt.Errorf("find a free port: %w", err)
		}
		lns = append(lns, l)
		ports[i] = l.Addr().(*net.TCPAddr).Port
	}
	for _, l := range lns {
		l.Close()
	}
	n.port, n.distPort = ports[0], ports[1]
	conf := fmt.Sprintf("listeners.tcp.1 = 127.0.0.1:%d\nlog.console = false\nlog.file.level = info\n", n.port)
	if n.maxMessageSize > 0 {
		conf += fmt.Sprintf("max_message_size = %d\n", n.maxMessageSize)
	}
	if len(n.peers) > 0 {
		// Read at the first boot only (an empty data directory): a restart
		// finds its cluster in its own data.
		conf += "cluster_formation.peer_discovery_backend = classic_config\n"
		for i, p := range n.peers {
			conf += fmt.Sprintf("cluster_formation.classic_config.nodes.%d = %s\n", i+1, p)
		}
	}
	if n.streams {
		n.streamPort = ports[3]
		conf += fmt.Sprintf("stream.listeners.tcp.1 = 127.0.0.1:%d\n", n.streamPort) +
			"stream.advertised_host = 127.0.0.1\n" +
			fmt.Sprintf("stream.advertised_port = %d\n", n.streamPort)
	}
	if n.tls != nil {
		n.tlsPort = ports[2]
		conf += fmt.Sprintf("listeners.ssl.1 = 127.0.0.1:%d\n", n.tlsPort) +
			"ssl_options.cacertfile = " + n.tls.caFile + "\n" +
			"ssl_options.certfile = " + n.tls.certFile + "\n" +
			"ssl_options.keyfile = " + n.tls.keyFile + "\n" +
			"ssl_options.verify = verify_peer\n" +
			"ssl_options.fail_if_no_peer_cert = true\n" +
			"auth_mechanisms.1 = PLAIN\nauth_mechanisms.2 = AMQPLAIN\nauth_mechanisms.3 = EXTERNAL\n" +
			"ssl_cert_login_from = common_name\n"
	}
	path := filepath.Join(n.dir, "rabbitmq.conf")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// env is the environment of the node's scripts: the test's own, minus any
// RabbitMQ settings, plus the node's.
func (n *RabbitNode) env() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "RABBITMQ_") || k == "HOME" || k == "NOTIFY_SOCKET" || k == "ERL_FLAGS" {
			continue
		}
		env = append(env, kv)
	}
	d := func(name string) string { return filepath.Join(n.dir, name) }
	env = append(env,
		"HOME="+d("home"),
		"RABBITMQ_CONF_ENV_FILE="+d("rabbitmq-env.conf"),
		"RABBITMQ_CONFIG_FILE="+d("rabbitmq.conf"),
		"RABBITMQ_ENABLED_PLUGINS_FILE="+d("enabled_plugins"),
		"RABBITMQ_NODENAME="+n.name,
		"RABBITMQ_NODE_IP_ADDRESS=127.0.0.1",
		"RABBITMQ_NODE_PORT="+strconv.Itoa(n.port),
		"RABBITMQ_DIST_PORT="+strconv.Itoa(n.distPort),
		"RABBITMQ_MNESIA_BASE="+d("mnesia"),
		"RABBITMQ_LOG_BASE="+d("log"),
		"RABBITMQ_PID_FILE="+d("rabbitmq.pid"),
		"RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=-kernel inet_dist_use_interface {127,0,0,1}",
		"ERL_CRASH_DUMP="+d("erl_crash.dump"),
	)
	if os.Getenv("ERL_EPMD_ADDRESS") == "" {
		// Only matters when no epmd runs yet and the node starts one.
		env = append(env, "ERL_EPMD_ADDRESS=127.0.0.1")
	}
	return env
}

// start runs the node and waits until it accepts AMQP connections. The node
// must not be running.
func (n *RabbitNode) start() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.proc != nil && !n.proc.exited() {
		return fmt.Errorf("start RabbitMQ node %s: already running (pid %d)", n.name, n.proc.cmd.Process.Pid)
	}
	out, err := os.OpenFile(n.outLog, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("start RabbitMQ node: open %s: %w", n.outLog, err)
	}
	cmd := exec.Command(n.script)
	cmd.Dir = n.dir
	cmd.Env = n.env()
	cmd.Stdout, cmd.Stderr = out, out
	// The start script runs the VM in the background and turns SIGTERM into
	// a clean shutdown of the broker. Pdeathsig sends it SIGTERM when the
	// test binary dies (also when the go test timeout kills it) so the node
	// does not outlive it; its own process group lets destroy kill the script,
	// the VM and the VM's helpers at once.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		out.Close()
		return fmt.Errorf("start %s: %w", n.script, err)
	}
	p := &process{cmd: cmd, out: out, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		out.Close()
		close(p.done)
	}()
	n.proc = p
	if err := n.waitReady(p); err != nil {
		_ = n.killLocked()
		return err
	}
	return nil
}

// waitReady polls until an AMQP connection as guest succeeds (and, with
// RabbitStreams, the stream port accepts a TCP connection: the plugin starts
// after the AMQP listener), the process exits or rabbitReadyTimeout passes. p is nil for a node whose process is
// not watched here (after rabbitmqctl start_app).
func (n *RabbitNode) waitReady(p *process) error {
	var exited chan struct{}
	if p != nil {
		exited = p.done
	}
	deadline := time.Now().Add(rabbitReadyTimeout)
	tick := time.NewTicker(rabbitPollInterval)
	defer tick.Stop()
	for {
		conn, err := dialAMQP(n.URL())
		if err == nil {
			conn.Close()
			if !n.streams {
				return nil
			}
			var sc net.Conn
			if sc, err = net.DialTimeout("tcp", n.StreamAddr(), time.Second); err == nil {
				sc.Close()
				return nil
			}
			err = fmt.Errorf("stream port: %w", err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("RabbitMQ node %s on %s accepted no AMQP connection within %v: %v\n%s",
				n.name, n.Addr(), rabbitReadyTimeout, err, n.logTail())
		}
		select {
		case <-exited:
			return fmt.Errorf("RabbitMQ node %s on %s exited during start-up (%v)\n%s", n.name, n.Addr(), p.err, n.logTail())
		case <-tick.C:
		}
	}
}

// stopLocked shuts the node down cleanly (SIGTERM to the start script, which
// stops the broker and waits for the VM), falling back to SIGKILL after
// rabbitStopTimeout. n.mu must be held.
func (n *RabbitNode) stopLocked() error {
	p := n.proc
	if p == nil || p.exited() {
		return nil
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("stop RabbitMQ node %s: %w", n.name, err)
	}
	select {
	case <-p.done:
		// The script waited for the VM; take its helpers along in case.
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		return nil
	case <-time.After(rabbitStopTimeout):
		if err := n.killLocked(); err != nil {
			return err
		}
		return fmt.Errorf("stop RabbitMQ node %s: no exit within %v of SIGTERM, killed\n%s", n.name, rabbitStopTimeout, n.logTail())
	}
}

// killLocked sends SIGKILL to the node's whole process group and waits for
// the start script to exit. n.mu must be held.
func (n *RabbitNode) killLocked() error {
	p := n.proc
	if p == nil {
		return nil
	}
	// Also when the script has exited: a VM it left behind dies too.
	if err := syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("kill RabbitMQ node %s: %w", n.name, err)
	}
	select {
	case <-p.done:
		return nil
	case <-time.After(killTimeout):
		return fmt.Errorf("kill RabbitMQ node %s: still running %v after SIGKILL", n.name, killTimeout)
	}
}

// destroy kills the node (its data is thrown away, so there is nothing to
// shut down cleanly) and removes its directory.
func (n *RabbitNode) destroy() error {
	n.mu.Lock()
	err := n.killLocked()
	n.mu.Unlock()
	if rmErr := os.RemoveAll(n.dir); rmErr != nil {
		err = errors.Join(err, fmt.Errorf("remove node directory: %w", rmErr))
	}
	return err
}

// logTail returns the last lines of the broker's log and of the start
// script's output.
func (n *RabbitNode) logTail() string {
	var b strings.Builder
	for _, f := range []string{n.nodeLog, n.outLog} {
		data, err := os.ReadFile(f)
		if err != nil || len(bytes.TrimSpace(data)) == 0 {
			continue
		}
		fmt.Fprintf(&b, "--- %s\n%s", f, tail(data, logTailLines))
	}
	return b.String()
}

// URL returns the node's AMQP URL, amqp://guest:guest@127.0.0.1:PORT/ (guest
// may log in from localhost only, which this is). It stays the same across
// Stop and Start.
func (n *RabbitNode) URL() string {
	return fmt.Sprintf("amqp://guest:guest@%s/", n.Addr())
}

// Addr returns the AMQP listener's host:port, e.g. as a Proxy upstream.
func (n *RabbitNode) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(n.port)) }

// AMQPSURL returns the URL of the node's TLS listener,
// amqps://guest:guest@localhost:PORT/ (the host its certificate names), or
// "" when the node was started without RabbitTLS. A client must present a
// certificate signed by the node's CA.
func (n *RabbitNode) AMQPSURL() string {
	if n.tls == nil {
		return ""
	}
	return fmt.Sprintf("amqps://guest:guest@localhost:%d/", n.tlsPort)
}

// TLSAddr returns the TLS listener's host:port (127.0.0.1, which its
// certificate does not name), or "" without RabbitTLS.
func (n *RabbitNode) TLSAddr() string {
	if n.tls == nil {
		return ""
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(n.tlsPort))
}

// StreamURL returns the URL of the node's stream listener,
// rabbitmq-stream://guest:guest@127.0.0.1:PORT/ (the vhost "/"), or "" when the node was
// started without RabbitStreams. It stays the same across Stop and Start.
func (n *RabbitNode) StreamURL() string {
	if !n.streams {
		return ""
	}
	return fmt.Sprintf("rabbitmq-stream://guest:guest@%s/", n.StreamAddr())
}

// StreamAddr returns the stream listener's host:port (e.g. as a Proxy
// upstream), or "" without RabbitStreams.
func (n *RabbitNode) StreamAddr() string {
	if !n.streams {
		return ""
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(n.streamPort))
}

// Name returns the Erlang node name (for rabbitmqctl -n; see Ctl).
func (n *RabbitNode) Name() string { return n.name }

// Dir returns the directory holding the node's data, logs and cookie.
func (n *RabbitNode) Dir() string { return n.dir }

// LogFile returns the path of the broker's log.
func (n *RabbitNode) LogFile() string { return n.nodeLog }

// Running reports whether the node's process is up (it may still be starting
// or stopping).
func (n *RabbitNode) Running() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.proc != nil && !n.proc.exited()
}

// Broker gives the test its own durable topic exchange and durable queue
// bound with "#" on this node, like RabbitMQ does on the shared broker. They
// are not deleted at cleanup: they go away with the node. The node must be
// running.
func (n *RabbitNode) Broker(t testing.TB) *Broker {
	t.Helper()
	conn, err := dialAMQP(n.URL())
	if err != nil {
		t.Fatalf("testenv: connect to RabbitMQ node %s at %s: %v", n.name, n.Addr(), err)
	}
	defer conn.Close()
	return newBroker(t, conn, n.URL(), n)
}

// Stop shuts the node down cleanly and waits until its process has exited:
// every connection to it is closed and new ones are refused. Durable
// exchanges and queues and the persistent messages in them are kept. A node
// that is not running is left alone.
func (n *RabbitNode) Stop(t testing.TB) {
	t.Helper()
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.stopLocked(); err != nil {
		t.Fatalf("testenv: %v", err)
	}
}

// Start starts the node again with the same name, port and data, and waits
// until it accepts AMQP connections. The node must not be running.
func (n *RabbitNode) Start(t testing.TB) {
	t.Helper()
	if err := n.start(); err != nil {
		t.Fatalf("testenv: %v", err)
	}
}

// AddUser creates user name with all permissions on the vhost "/". An
// empty password creates a user without one, who can log in only with the
// EXTERNAL mechanism (a client certificate whose common name is name, on a
// node started with RabbitTLS).
func (n *RabbitNode) AddUser(t testing.TB, name, password string) {
	t.Helper()
	if password == "" {
		// add_user wants a password; clearing it leaves EXTERNAL only.
		n.Ctl(t, "add_user", name, fmt.Sprintf("unused-%016x", rand.Uint64()))
		n.Ctl(t, "clear_password", name)
	} else {
		n.Ctl(t, "add_user", name, password)
	}
	n.Ctl(t, "set_permissions", "-p", "/", name, ".*", ".*", ".*")
}

// RabbitConnection is one AMQP connection to a node, as rabbitmqctl
// list_connections shows it.
type RabbitConnection struct {
	User          string // the user it logged in as
	AuthMechanism string // PLAIN, AMQPLAIN, EXTERNAL
	PID           string // the connection's Erlang process, for close_connection
}

// Connections lists the node's AMQP connections.
func (n *RabbitNode) Connections(t testing.TB) []RabbitConnection {
	t.Helper()
	out := n.Ctl(t, "list_connections", "-q", "--no-table-headers", "user", "auth_mechanism", "pid")
	var conns []RabbitConnection
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if f := strings.Split(line, "\t"); len(f) == 3 {
			conns = append(conns, RabbitConnection{User: f[0], AuthMechanism: f[1], PID: f[2]})
		}
	}
	return conns
}

// CloseConnections closes every AMQP connection of user on the node, as an
// operator would (rabbitmqctl close_connection), and returns how many it
// closed. The clients see a connection.close with CONNECTION_FORCED.
func (n *RabbitNode) CloseConnections(t testing.TB, user string) int {
	t.Helper()
	closed := 0
	for _, c := range n.Connections(t) {
		if c.User == user {
			n.Ctl(t, "close_connection", c.PID, "closed by the test")
			closed++
		}
	}
	return closed
}

// Ctl runs rabbitmqctl against this node (rabbitmqctl -n NAME args...) with
// the node's cookie and returns its output; a failure fails the test. For
// what AMQP cannot do, e.g. set_vm_memory_high_watermark to make the node
// block publishers, or list_queues.
func (n *RabbitNode) Ctl(t testing.TB, args ...string) string {
	t.Helper()
	out, err := n.runCtl(n.ctl, args...)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	return out
}

// runCtl runs one of RabbitMQ's CLI tools (script: rabbitmqctl,
// rabbitmq-queues) against this node with its cookie.
func (n *RabbitNode) runCtl(script string, args ...string) (string, error) {
	if script == "" {
		return "", errors.New("rabbitmqctl not found")
	}
	ctx, cancel := context.WithTimeout(context.Background(), rabbitCtlTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, script, append([]string{"-n", n.name}, args...)...)
	cmd.Dir = n.dir
	cmd.Env = n.env()
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s -n %s %s: %v\n%s", filepath.Base(script), n.name, strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// Kill sends SIGKILL to the node (the VM and the start script) and waits
// until it has exited: no clean shutdown, as at a crash or a power loss.
// Its data stays for Start.
func (n *RabbitNode) Kill(t testing.TB) {
	t.Helper()
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.killLocked(); err != nil {
		t.Fatalf("testenv: %v", err)
	}
}
