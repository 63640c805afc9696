// Package testenv is the test harness of outbox-relay: it gives a test real
// services to run against and removes them afterwards.
//
//   - MySQL and StartServer: a fresh database on a private, binlog-enabled
//     mariadbd (ROW, FULL row image and metadata, GTID strict mode) started from
//     nothing in about a second, or on an external server named by
//     OUTBOX_TEST_MYSQL_DSN. Private servers can be killed, restarted, have their
//     binlogs purged, get a GTID replica and have it promoted.
//   - RabbitMQ: a private durable topic exchange and queue on the broker at
//     OUTBOX_TEST_AMQP_URL (default amqp://guest:guest@127.0.0.1:5672/), or
//     StartRabbitMQ: a private node of the test's own that it may stop and
//     start (stopping the shared broker would break every other test), with
//     a TLS listener that verifies client certificates under RabbitTLS.
//   - NewCA and CA.Issue: a private CA and certificates made at test time.
//   - Proxy: a TCP fault proxy that cuts, refuses or delays connections.
//   - NewCA and CA.Issue: a certificate authority and certificates (server or
//     client) made at test time with crypto/x509, as PEM files in a temporary
//     directory; StartServer with ServerOptions.TLS (and
//     RequireSecureTransport) runs a mariadbd that speaks, or requires, TLS.
//
// When a service is missing the test is skipped, or fails when
// OUTBOX_REQUIRE_INTEGRATION=1 (see Require); `make test` installs and starts
// the services first.
//
//   - ServerID: the replica server id of a binlog client a test starts,
//     unique across all test binaries running at once (a block of ids per
//     binary, held by a file lock).
//
// Every resource is released at t.Cleanup, also when the test fails. The
// process state is the shared private mariadbd behind MySQL, started lazily on
// first use, and the block of server ids; a package that calls MySQL wraps its
// tests with Main so that server is stopped when the test binary is done:
//
//	func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }
package testenv
