// Package redact keeps passwords out of what outbox-relay prints, logs and
// serves. It knows the two forms a connection string takes here: a
// go-sql-driver DSN (user:password@net(addr)/dbname?params) and an AMQP URL
// (amqp://user:password@host:port/vhost), or a comma-separated list of such
// URLs (the nodes of a cluster).
//
// Three tools, from the most structural to the last line of defence:
//
//   - DSN, URL and Value return a connection string with every password
//     replaced by Mask. One that does not parse is masked from the first
//     ':' of its credentials to their last '@', so that a password holding
//     '@', ':', '/' or a comma is hidden whole whatever the parser would
//     have made of it.
//   - ParseError is the error of a parser that refused a connection string,
//     with the pieces of the password it may quote masked.
//   - Scrub and Writer replace known passwords wherever they appear, in each
//     form they may be printed in (as written, percent-encoded or decoded,
//     JSON- or Go-quoted): for messages of libraries that echo what they
//     were given.
//
// ReadPasswordFile is the one reader of a password file (MySQL's and
// AMQP's), so that the password the connections use is the one the CLI
// masks.
//
// The package has no state: every function is safe for concurrent use.
package redact
