package mysqlconn

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/outbox-relay/outbox-relay/canal"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// writeFile writes content to a new file of the test's and returns its path.
func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// Both sides, the go-sql-driver pool and go-mysql's binlog connection, get
// the same TLS configuration: the DSN's tls parameter, or the CA and client
// certificate files, which verify the DSN's host.
func TestTLSBothSides(t *testing.T) {
	ca := testenv.NewCA(t)
	client := ca.Issue(t, "relay")
	const dsn = "u:secret@tcp(db.example:3307)/app"
	for _, tc := range []struct {
		name       string
		o          Options
		tls        bool
		skipVerify bool
		preferred  bool
		ownCA      bool
		clientCert bool
	}{
		{name: "plain", o: Options{DSN: dsn}},
		{name: "tls=true", o: Options{DSN: dsn + "?tls=true"}, tls: true},
		{name: "tls=skip-verify", o: Options{DSN: dsn + "?tls=skip-verify"}, tls: true, skipVerify: true},
		{name: "tls=preferred", o: Options{DSN: dsn + "?tls=preferred"}, tls: true, skipVerify: true, preferred: true},
		{name: "CA", o: Options{DSN: dsn, TLSCA: ca.CertFile}, tls: true, ownCA: true},
		{name: "CA with tls=true", o: Options{DSN: dsn + "?tls=true", TLSCA: ca.CertFile}, tls: true, ownCA: true},
		{name: "CA and client certificate", o: Options{DSN: dsn, TLSCA: ca.CertFile, TLSCert: client.CertFile, TLSKey: client.KeyFile},
			tls: true, ownCA: true, clientCert: true},
		{name: "client certificate alone", o: Options{DSN: dsn, TLSCert: client.CertFile, TLSKey: client.KeyFile}, tls: true, clientCert: true},
		{name: "client certificate with tls=skip-verify", o: Options{DSN: dsn + "?tls=skip-verify", TLSCert: client.CertFile, TLSKey: client.KeyFile},
			tls: true, skipVerify: true, clientCert: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			target, err := New(tc.o)
			if err != nil {
				t.Fatal(err)
			}
			d, b := target.Driver().TLS, target.Binlog()
			if b.Host != "db.example" || b.Port != 3307 || b.User != "u" || b.Password != "secret" || b.Schema != "app" {
				t.Errorf("binlog connection %s:%d user %q password %q schema %q: want the DSN's", b.Host, b.Port, b.User, b.Password, b.Schema)
			}
			if !tc.tls {
				if d != nil || b.TLS != nil {
					t.Fatalf("TLS configured (driver %v, binlog %v) without a tls parameter or a TLS flag", d != nil, b.TLS != nil)
				}
				return
			}
			if d == nil || b.TLS == nil {
				t.Fatalf("TLS on the SQL side %v, on the binlog side %v: want both", d != nil, b.TLS != nil)
			}
			for side, c := range map[string]struct {
				skip, ownCA, cert bool
				name              string
			}{
				"SQL":    {d.InsecureSkipVerify, d.RootCAs != nil, len(d.Certificates) == 1, d.ServerName},
				"binlog": {b.TLS.InsecureSkipVerify, b.TLS.RootCAs != nil, len(b.TLS.Certificates) == 1, b.TLS.ServerName},
			} {
				if c.skip != tc.skipVerify || c.ownCA != tc.ownCA || c.cert != tc.clientCert {
					t.Errorf("%s side: skip verify %v, own CA %v, client certificate %v; want %v, %v, %v",
						side, c.skip, c.ownCA, c.cert, tc.skipVerify, tc.ownCA, tc.clientCert)
				}
				if !tc.skipVerify && c.name != "db.example" {
					t.Errorf("%s side verifies the name %q, want the DSN's host db.example", side, c.name)
				}
			}
			if b.TLSPreferred != tc.preferred {
				t.Errorf("binlog TLSPreferred %v, want %v", b.TLSPreferred, tc.preferred)
			}
		})
	}
}

// A named configuration registered with mysql.RegisterTLSConfig keeps
// working, and reaches the binlog side too.
func TestTLSRegisteredConfig(t *testing.T) {
	ca := testenv.NewCA(t)
	name := fmt.Sprintf("mysqlconn-test-%d", rand.Uint32())
	if err := mysql.RegisterTLSConfig(name, ca.ClientTLS("db.example")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mysql.DeregisterTLSConfig(name) })
	target, err := New(Options{DSN: "u@tcp(db.example:3306)/app?tls=" + name})
	if err != nil {
		t.Fatal(err)
	}
	if b := target.Binlog(); b.TLS == nil || !b.TLS.RootCAs.Equal(ca.Pool()) || b.TLS.ServerName != "db.example" {
		t.Fatalf("binlog TLS %+v: want the registered configuration", b.TLS)
	}
}

// Contradicting or broken options are refused with the flag and the fix,
// never with the password.
func TestOptionsRefused(t *testing.T) {
	ca := testenv.NewCA(t)
	client := ca.Issue(t, "relay")
	notPEM := writeFile(t, "ca.pem", "not a certificate")
	pwFile := writeFile(t, "pw", "secret\n")
	const dsn = "u:hunter22@tcp(db:3306)/app"
	for _, tc := range []struct {
		name string
		o    Options
		want string
	}{
		{"CA with tls=skip-verify", Options{DSN: dsn + "?tls=skip-verify", TLSCA: ca.CertFile}, "Config.MySQLTLSCA verifies the server, but Config.MySQLDSN says tls=skip-verify"},
		{"CA with tls=preferred", Options{DSN: dsn + "?tls=preferred", TLSCA: ca.CertFile}, "says tls=preferred"},
		{"CA with tls=false", Options{DSN: dsn + "?tls=false", TLSCA: ca.CertFile}, "says tls=false"},
		{"certificate without key", Options{DSN: dsn, TLSCert: client.CertFile}, "Config.MySQLTLSCert and Config.MySQLTLSKey go together"},
		{"key without certificate", Options{DSN: dsn, TLSKey: client.KeyFile}, "Config.MySQLTLSCert and Config.MySQLTLSKey go together"},
		{"key of another certificate", Options{DSN: dsn, TLSCert: client.CertFile, TLSKey: ca.Issue(t, "other").KeyFile}, "private key does not match"},
		{"certificate with tls=false", Options{DSN: dsn + "?tls=false", TLSCert: client.CertFile, TLSKey: client.KeyFile}, "says tls=false"},
		{"CA not PEM", Options{DSN: dsn, TLSCA: notPEM}, "holds no PEM certificate"},
		{"CA missing", Options{DSN: dsn, TLSCA: "/nonexistent/ca.pem"}, "Config.MySQLTLSCA: open /nonexistent/ca.pem"},
		{"unknown TLS name", Options{DSN: dsn + "?tls=nosuchconfig"}, "Config.MySQLDSN does not parse"},
		{"password twice", Options{DSN: dsn, PasswordFile: pwFile}, "given twice, in Config.MySQLDSN and in Config.MySQLPasswordFile"},
		{"password file missing", Options{DSN: "u@tcp(db:3306)/app", PasswordFile: "/nonexistent/pw"}, "Config.MySQLPasswordFile: open /nonexistent/pw"},
		{"password file empty", Options{DSN: "u@tcp(db:3306)/app", PasswordFile: writeFile(t, "empty", "\n")}, "is empty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(tc.o)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error saying %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "hunter22") || strings.Contains(err.Error(), "secret") {
				t.Fatalf("the error shows a password: %v", err)
			}
		})
	}
}

// The password file loses its trailing line break (echo adds one), keeps
// everything else.
func TestReadPasswordFile(t *testing.T) {
	for content, want := range map[string]string{
		"s3cret\n":   "s3cret",
		"s3cret\r\n": "s3cret",
		"s3cret":     "s3cret",
		" sp ace \n": " sp ace ",
	} {
		got, err := ReadPasswordFile(writeFile(t, "pw", content))
		if err != nil || got != want {
			t.Errorf("file %q: got %q, %v; want %q", content, got, err, want)
		}
	}
	dir := t.TempDir()
	if _, err := ReadPasswordFile(dir); err == nil || !strings.Contains(err.Error(), dir) {
		t.Errorf("a directory as password file: %v, want an error naming it", err)
	}
}

// A rotated password is picked up at the next new connection, SQL and
// binlog alike, without a new Target (no restart): the file is read at each
// connection. The file is in the layout of a mounted Kubernetes Secret
// (secretVolume), rotated once by writing it and once as the kubelet
// updates a Secret that changed.
func TestPasswordFileRotation(t *testing.T) {
	db := testenv.MySQL(t)
	ctx := testenv.Context(t, time.Minute)
	user := fmt.Sprintf("rot_%d", rand.N(1_000_000_000))
	exec := func(q string) {
		t.Helper()
		if _, err := db.SQL.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	exec(fmt.Sprintf("CREATE USER '%s'@'%%' IDENTIFIED BY 'first-pw'", user))
	t.Cleanup(func() { db.SQL.Exec(fmt.Sprintf("DROP USER '%s'@'%%'", user)) })
	exec(fmt.Sprintf("GRANT SELECT ON `%s`.* TO '%s'@'%%'", db.Name, user))
	secret := secretVolume{t: t, dir: t.TempDir()}
	secret.update("first-pw\n")
	pwFile := filepath.Join(secret.dir, "mysql-password")
	target, err := New(Options{DSN: fmt.Sprintf("%s@tcp(%s:%d)/%s", user, db.Host, db.Port, db.Name), PasswordFile: pwFile})
	if err != nil {
		t.Fatal(err)
	}
	pool, err := target.OpenDB(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	pool.SetMaxIdleConns(0) // every query opens a new connection
	binlog := target.Binlog()
	binlog.ServerID, binlog.Table = 1, "outbox"
	check := func(when string) {
		t.Helper()
		var one int
		if err := pool.QueryRowContext(ctx, "SELECT 1").Scan(&one); err != nil {
			t.Fatalf("%s: SQL connection: %v", when, err)
		}
		if err := canal.CheckConnection(ctx, binlog); err != nil {
			t.Fatalf("%s: binlog connection: %v", when, err)
		}
	}
	check("first password")
	exec(fmt.Sprintf("ALTER USER '%s'@'%%' IDENTIFIED BY 'second-pw'", user))
	if err := os.WriteFile(pwFile, []byte("second-pw\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	check("after rotating the password and the file")
	exec(fmt.Sprintf("ALTER USER '%s'@'%%' IDENTIFIED BY 'third-pw'", user))
	secret.update("third-pw")
	check("after rotating the password and the Secret")
}

// secretVolume lays out a directory as the kubelet does a mounted Secret
// with the key mysql-password: the file is a symlink to ..data/mysql-password,
// ..data a symlink to a directory of the current content. update writes new
// content into a new directory and swaps ..data over to it with a rename,
// the kubelet's atomic update: the file's path never changes.
type secretVolume struct {
	t   *testing.T
	dir string
	n   int
}

func (v *secretVolume) update(password string) {
	v.t.Helper()
	v.n++
	content := fmt.Sprintf("..content_%d", v.n)
	if err := os.Mkdir(filepath.Join(v.dir, content), 0o755); err != nil {
		v.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(v.dir, content, "mysql-password"), []byte(password), 0o600); err != nil {
		v.t.Fatal(err)
	}
	if err := os.Symlink(content, filepath.Join(v.dir, "..data_tmp")); err != nil {
		v.t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(v.dir, "..data_tmp"), filepath.Join(v.dir, "..data")); err != nil {
		v.t.Fatal(err)
	}
	if v.n == 1 {
		if err := os.Symlink(filepath.Join("..data", "mysql-password"), filepath.Join(v.dir, "mysql-password")); err != nil {
			v.t.Fatal(err)
		}
	}
}
