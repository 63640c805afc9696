package dedup

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"unicode/utf8"

	"github.com/go-sql-driver/mysql"

	"github.com/outbox-relay/outbox-relay/outbox"
)

// Tables the package reads and writes (docs/tables.md; created by
// `outbox-relay migrate`).
const (
	// DedupTable holds one row per (consumer, message) processed.
	DedupTable = "message_deduplication"
	// AttemptsTable counts the failed attempts of messages a Consumer has
	// not processed yet.
	AttemptsTable = "message_inbox_attempts"
	// FailedTable receives the messages a Consumer gave up on, with
	// source 'inbox'.
	FailedTable = "outbox_failed"
)

// MaxNameLen is the longest consumer name and message name, in characters
// (the VARCHAR(255) columns).
const MaxNameLen = 255

// ErrInvalidMessageID is matched (errors.Is) by the error Process returns
// for a message id that is not a UUID in 8-4-4-4-12 text form.
var ErrInvalidMessageID = errors.New("message id is not a UUID")

// ErrInvalidName is matched (errors.Is) by the error Process returns for a
// consumer or message name that is not valid UTF-8 or is longer than
// MaxNameLen characters.
var ErrInvalidName = errors.New("invalid name")

// Handler does a message's database work in tx, the transaction that also
// records the message as processed. It must not commit or roll back tx;
// returning an error rolls back its writes and the record.
type Handler func(ctx context.Context, tx *sql.Tx) error

// Inbox runs handlers at most once per message for one consumer. It is safe
// for concurrent use.
type Inbox struct {
	db       *sql.DB
	consumer string
	txOpts   *sql.TxOptions // nil: the connection's isolation level
}

// New returns the inbox of the consuming service named consumer, recording
// in db's table message_deduplication. Services that share a database keep
// apart by their names; a name is at most MaxNameLen characters and compared
// byte for byte. The empty name is the one rows made before the consumer
// column existed carry.
func New(db *sql.DB, consumer string) *Inbox {
	return &Inbox{db: db, consumer: consumer}
}

// Consumer returns the consumer name the inbox records under.
func (in *Inbox) Consumer() string { return in.consumer }

// WithIsolation returns a copy of the inbox whose transactions run at level
// instead of the connection's (REPEATABLE READ on a default server). Any
// level InnoDB offers keeps the once-only guarantee; the level only changes
// what the handler's own reads see (see the package documentation).
func (in *Inbox) WithIsolation(level sql.IsolationLevel) *Inbox {
	c := *in
	c.txOpts = &sql.TxOptions{Isolation: level}
	return &c
}

// Process runs handler for the message messageID unless this inbox's
// consumer has processed it already, in one transaction with the record of
// it:
//
//   - done == true, err == nil: handler ran and its writes committed together
//     with the record "consumer processed messageID" (messageName is stored
//     with it for people reading the table).
//   - done == false, err == nil: a duplicate. The message was processed
//     before (or by a concurrent call that committed meanwhile); handler did
//     not run.
//   - err != nil: handler failed (its error is wrapped: errors.Is and
//     errors.As see it), or the database did. Nothing was recorded and the
//     handler's writes were rolled back; process the message again later.
//
// messageID is the AMQP message-id: a UUID in 8-4-4-4-12 text form; any
// other text is refused with an error matching ErrInvalidMessageID before
// anything touches the database. Concurrent calls for one message run the
// handler once: the second waits for the first's transaction and then
// finds the record.
func (in *Inbox) Process(ctx context.Context, messageID, messageName string, handler Handler) (done bool, err error) {
	id, err := outbox.ParseMessageID(messageID)
	if err != nil {
		return false, fmt.Errorf("dedup: consumer %q: %w: %w", in.consumer, ErrInvalidMessageID, err)
	}
	return in.process(ctx, id, messageName, handler)
}

// insertRetries bounds how often the record's INSERT is tried again after
// the server picked it as a deadlock victim.
const insertRetries = 5

// process is Process with a parsed id.
func (in *Inbox) process(ctx context.Context, id outbox.MessageID, messageName string, handler Handler) (bool, error) {
	if err := checkName("consumer name", in.consumer); err != nil {
		return false, fmt.Errorf("dedup: %w", err)
	}
	if err := checkName("message name", messageName); err != nil {
		return false, fmt.Errorf("dedup: consumer %q, message %s: %w", in.consumer, id, err)
	}
	for attempt := 1; ; attempt++ {
		done, retry, err := in.once(ctx, id, messageName, handler)
		if !retry || attempt == insertRetries || ctx.Err() != nil {
			return done, err
		}
	}
}

// once is one transaction of process. retry reports a deadlock on the
// record's INSERT: the handler has not run and trying again is safe.
//
// Why a deadlock can happen there: when the transaction holding a record
// rolls back (its handler failed) while two or more others wait on it to
// insert the same key, each waiter holds a shared lock on the key and wants
// an exclusive one; InnoDB picks one as the victim and the other proceeds.
func (in *Inbox) once(ctx context.Context, id outbox.MessageID, messageName string, handler Handler) (done, retry bool, err error) {
	tx, err := in.db.BeginTx(ctx, in.txOpts)
	if err != nil {
		return false, false, fmt.Errorf("dedup: consumer %q, message %s: begin: %w", in.consumer, id, err)
	}
	defer tx.Rollback() // no-op after Commit; runs on a handler's panic too

	// The record goes first: its primary key is what serialises concurrent
	// deliveries of one message, before any of the handler's work.
	_, err = tx.ExecContext(ctx, "INSERT INTO "+DedupTable+
		" (consumer, message_id, message_name, processed_at) VALUES (?, ?, ?, UTC_TIMESTAMP(6))",
		in.consumer, id[:], messageName)
	switch code := mysqlCode(err); {
	case err == nil:
	case code == errDupEntry:
		return false, false, nil
	case code == errDeadlock:
		return false, true, fmt.Errorf("dedup: consumer %q, message %s: record: %w", in.consumer, id, err)
	case code == errBadField:
		return false, false, fmt.Errorf("dedup: consumer %q, message %s: record: %w (run `outbox-relay migrate`: %s needs its consumer column)", in.consumer, id, err, DedupTable)
	default:
		return false, false, fmt.Errorf("dedup: consumer %q, message %s: record: %w", in.consumer, id, err)
	}

	if err := handler(ctx, tx); err != nil {
		return false, false, fmt.Errorf("dedup: consumer %q, message %s: handler: %w", in.consumer, id, err)
	}
	if err := tx.Commit(); err != nil {
		// The outcome of a failed COMMIT is unknown; processing the message
		// again finds the record if it did commit.
		return false, false, fmt.Errorf("dedup: consumer %q, message %s: commit: %w", in.consumer, id, err)
	}
	return true, false, nil
}

// checkName refuses what the VARCHAR(255) utf8mb4 columns would reject.
func checkName(what, s string) error {
	if !utf8.ValidString(s) {
		return fmt.Errorf("%s %q: %w: not valid UTF-8", what, s, ErrInvalidName)
	}
	if n := utf8.RuneCountInString(s); n > MaxNameLen {
		return fmt.Errorf("%s: %w: %d characters, at most %d", what, ErrInvalidName, n, MaxNameLen)
	}
	return nil
}

// Server error numbers Process tells apart.
const (
	errDupEntry = 1062 // ER_DUP_ENTRY
	errDeadlock = 1213 // ER_LOCK_DEADLOCK
	errBadField = 1054 // ER_BAD_FIELD_ERROR: the table predates the consumer column
)

// mysqlCode returns the server error number in err's chain, or 0.
func mysqlCode(err error) uint16 {
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		return me.Number
	}
	return 0
}
