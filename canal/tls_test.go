package canal

import (
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// Against a server that requires TLS, the tailer's own connections (go-mysql's
// client) name every TLS failure as one: Run ends with a *TLSError, never an
// *AccessError ("GRANT REPLICATION ..."), whether the connection had no TLS
// (MariaDB answers it with "access denied"), or a CA that did not sign the
// server's certificate. With the right CA, Run streams the rows. A user
// created REQUIRE SSL is named as such by CheckConnection.
func TestTailerTLS(t *testing.T) {
	ca := testenv.NewCA(t)
	srv := testenv.StartServer(t, testenv.ServerOptions{TLS: ca, RequireSecureTransport: true})
	db := srv.CreateDatabase(t)
	setupOutbox(t, db)
	from := currentPosition(t, db.SQL)

	run := func(t *testing.T, cfg Config) error {
		t.Helper()
		tl, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return tl.Run(testCtx(t), from, &collector{})
	}
	wantTLSError := func(t *testing.T, err error, want string) {
		t.Helper()
		var te *TLSError
		var ae *AccessError
		if !errors.As(err, &te) || errors.As(err, &ae) || !strings.Contains(err.Error(), want) {
			t.Fatalf("got %T %v; want a *TLSError saying %q", err, err, want)
		}
		if strings.Contains(err.Error(), "GRANT") || strings.Contains(err.Error(), "access denied") {
			t.Fatalf("a TLS failure reads as a grant problem: %v", err)
		}
	}

	t.Run("no TLS", func(t *testing.T) {
		wantTLSError(t, run(t, tailerConfig(t, db)), "requires TLS (require_secure_transport=ON)")
	})
	t.Run("CA that did not sign the server's certificate", func(t *testing.T) {
		cfg := tailerConfig(t, db)
		cfg.TLS = testenv.NewCA(t).ClientTLS("127.0.0.1")
		wantTLSError(t, run(t, cfg), "not signed by Config.MySQLTLSCA")
	})
	t.Run("the server's CA", func(t *testing.T) {
		cfg := tailerConfig(t, db)
		cfg.TLS = srv.TLSConfig()
		tl, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		c := &collector{}
		r := startRun(t, tl, from, c)
		recs := newRecords(20)
		if err := insertRecords(testCtx(t), writer(t, db.SQL), recs); err != nil {
			t.Fatal(err)
		}
		waitCovered(t, r, c, currentPosition(t, db.SQL), 30*time.Second)
		if got, _ := c.snapshot(); len(got) != len(recs) {
			t.Fatalf("%d rows over TLS, want %d", len(got), len(recs))
		}
		if err := r.stop(); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("REQUIRE SSL user", func(t *testing.T) {
		// require_secure_transport off, so only the user's requirement refuses.
		root := srv.Root(t)
		if _, err := root.ExecContext(testCtx(t), "SET GLOBAL require_secure_transport = OFF"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { root.Exec("SET GLOBAL require_secure_transport = ON") })
		user := fmt.Sprintf("ssl_%d", mrand.N(1_000_000_000))
		if _, err := root.ExecContext(testCtx(t), fmt.Sprintf("CREATE USER '%s'@'%%' IDENTIFIED BY 'pw' REQUIRE SSL", user)); err != nil {
			t.Fatal(err)
		}
		cfg := tailerConfig(t, db)
		cfg.User, cfg.Password = user, "pw"
		wantTLSError(t, CheckConnection(testCtx(t), cfg), fmt.Sprintf("user %q may connect to %s only over TLS (REQUIRE SSL)", user, srv.Addr()))
	})
}

// The TLS probe of ExplainConnectError is made only to a server that greets
// as MariaDB: the shared MariaDB does; a listener that is not a MySQL server
// does not.
func TestGreetsAsMariaDB(t *testing.T) {
	db := testenv.MySQL(t)
	ctx := testCtx(t)
	if !greetsAsMariaDB(ctx, net.JoinHostPort(db.Host, strconv.Itoa(db.Port))) {
		t.Fatal("the MariaDB server's greeting was not recognised")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err == nil {
			c.Write([]byte("SSH-2.0-OpenSSH_9.2\r\n"))
			c.Close()
		}
	}()
	if greetsAsMariaDB(ctx, ln.Addr().String()) {
		t.Fatal("a listener that is no MySQL server counted as MariaDB")
	}
}
