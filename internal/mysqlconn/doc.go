// Package mysqlconn is the one place that turns the relay's MySQL settings —
// the go-sql-driver DSN, the --mysql-tls-ca, --mysql-tls-cert and
// --mysql-tls-key PEM files, and --mysql-password-file — into connections:
// a go-sql-driver connector for the SQL pools (the relay's pool and lock
// connection, replay's, every operator command's) and the connection fields
// of a canal.Config for go-mysql's client (the binlog stream, the flavor
// detection, replay's reader). Both sides get the same *tls.Config and the
// same password, so the DSN's tls parameter (true, skip-verify, preferred or
// a configuration registered with mysql.RegisterTLSConfig) holds for every
// connection the program opens.
//
// TLS: with --mysql-tls-ca the server's certificate must be signed by that
// CA and name the DSN's host; with --mysql-tls-cert and --mysql-tls-key the
// client presents that certificate (users created REQUIRE X509). Without a
// tls parameter either flag turns TLS on. tls=preferred uses TLS only when
// the server offers it, on the binlog connection as on the SQL ones.
//
// Passwords: with --mysql-password-file the password is read from the file
// (trailing line breaks removed) before every new connection, SQL or binlog,
// so a rotated password is picked up at the next reconnect without a
// restart. The DSN must then carry no password.
package mysqlconn
