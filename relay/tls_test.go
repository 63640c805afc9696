package relay

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/canal"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/internal/validator"
)

// The DSN's tls parameter holds for the binlog connection too. Against a
// server with require_secure_transport=ON, --mode binlog with tls=skip-verify
// (and with tls=preferred) delivers every message once, in order, from the
// first leader term: epoch 1, no restart. (The binlog connection used to go
// out in plain TCP: refused, "binlog access denied", a new term each time.)
// tls=preferred against a server without TLS reads the binlog in plain TCP.
func TestRelayBinlogOverTLS(t *testing.T) {
	t.Parallel()
	srv := testenv.StartServer(t, testenv.ServerOptions{TLS: testenv.NewCA(t), RequireSecureTransport: true})
	for _, tc := range []struct {
		name  string
		plain bool // against the shared server, which offers no TLS
		param string
	}{
		{name: "skip-verify", param: "tls=skip-verify"},
		{name: "preferred", param: "tls=preferred"},
		{name: "preferred without TLS on the server", plain: true, param: "tls=preferred"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var db *testenv.DB
			if tc.plain {
				db = testenv.MySQL(t)
			} else {
				db = srv.CreateDatabase(t)
			}
			db.Migrate(testenv.Context(t, time.Minute), t)
			b := testenv.RabbitMQ(t)
			v := consume(t, b, b.Queue)
			ctx := testenv.WorkContext(t)
			startRelay(t, db, b, func(c *Config) {
				c.MySQLDSN, c.Mode = withParam(db.DSN, tc.param), ModeBinlog
			})
			produce(ctx, t, db, b, v, load{producers: 2, partitions: 10, total: 300, bigTxn: 50, bigShare: 0.3})
			if err := v.WaitComplete(ctx); err != nil {
				t.Fatalf("%v (%d of 300 missing)", err, v.Missing())
			}
			if err := v.Check(validator.ExactlyOnce); err != nil {
				t.Fatal(err)
			}
			for _, d := range v.Deliveries() {
				if e, _ := d.Headers["x-relay-epoch"].(int64); e != 1 {
					t.Fatalf("a message went out under epoch %d: want every one from the first term (epoch 1, no restart)", e)
				}
			}
			var epoch int64
			if err := db.SQL.QueryRowContext(ctx, "SELECT epoch FROM outbox_relay_progress WHERE relay_name = ?", relayNameFor(db.Name)).Scan(&epoch); err != nil || epoch != 1 {
				t.Fatalf("progress epoch %d (%v): want 1, one leader term without a restart", epoch, err)
			}
		})
	}
}

// withParam adds a query parameter to a go-sql-driver DSN.
func withParam(dsn, param string) string {
	if strings.Contains(dsn, "?") {
		return dsn + "&" + param
	}
	return dsn + "?" + param
}

// A TLS failure later, on the binlog connection of a running relay, sends
// an auto relay to poll mode with the TLS problem as the mode's reason (shown
// by status as mode_reason) and is not fatal in --mode binlog, where the
// term restarts and the error is recorded as last_error.
func TestTLSErrorDecisions(t *testing.T) {
	err := fmt.Errorf("canal: %w", &canal.TLSError{Addr: "db:3306",
		Problem: "the server's certificate is not signed by Config.MySQLTLSCA (server db:3306: x509: certificate signed by unknown authority)",
		Fix:     "give Config.MySQLTLSCA the CA certificate that signed the server's certificate (the server's ssl-ca)"})
	auto := &Relay{cfg: Config{Mode: ModeAuto}}
	if why := auto.fallbackReason(err); !strings.Contains(why, "not signed by Config.MySQLTLSCA") {
		t.Errorf("auto mode: fallback reason %q, want the TLS problem", why)
	}
	if isFatal(err) {
		t.Error("a TLS failure after the start: want a restart of the term, not a fatal error")
	}
	if strings.Contains(err.Error(), "access denied") || strings.Contains(err.Error(), "GRANT") {
		t.Errorf("a TLS failure reads as a grant problem: %v", err)
	}
}
