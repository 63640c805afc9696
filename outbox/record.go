package outbox

import (
	"encoding/hex"
	"fmt"
	"time"
)

// MessageID is a message's identity: a UUID (version 7 when Enqueue made it)
// stored as BINARY(16). It is the AMQP message-id, in lowercase 8-4-4-4-12 text.
// Identity is MessageID, never the row's AUTO_INCREMENT id: after a failover
// that lost transactions a new primary may hand out ids that were used before.
type MessageID [16]byte

// String returns the lowercase 8-4-4-4-12 form.
func (id MessageID) String() string {
	var b [36]byte
	hex.Encode(b[0:8], id[0:4])
	b[8] = '-'
	hex.Encode(b[9:13], id[4:6])
	b[13] = '-'
	hex.Encode(b[14:18], id[6:8])
	b[18] = '-'
	hex.Encode(b[19:23], id[8:10])
	b[23] = '-'
	hex.Encode(b[24:36], id[10:16])
	return string(b[:])
}

// ParseMessageID parses the 8-4-4-4-12 text form (either case).
func ParseMessageID(s string) (MessageID, error) {
	var id MessageID
	if len(s) != 36 || s[8] != '-' || s[13] != '-' || s[18] != '-' || s[23] != '-' {
		return id, fmt.Errorf("parse message id %q: want 8-4-4-4-12 hex form", s)
	}
	hexPart := s[0:8] + s[9:13] + s[14:18] + s[19:23] + s[24:36]
	if _, err := hex.Decode(id[:], []byte(hexPart)); err != nil {
		return MessageID{}, fmt.Errorf("parse message id %q: %w", s, err)
	}
	return id, nil
}

// Record is one outbox row as the relay reads it, from the binlog or from a
// query. Fields mirror the table's columns (docs/tables.md).
type Record struct {
	ID           uint64 // AUTO_INCREMENT id: order inside one database, not identity
	MessageID    MessageID
	PartitionKey string // '' = no ordering constraint
	Exchange     string // '' = the relay's --default-exchange
	RoutingKey   string
	MessageType  string
	Headers      []byte // the JSON column's text, nil when NULL
	Payload      []byte
	ContentType  string
	CreatedAt    time.Time // UTC
	AvailableAt  time.Time // zero when NULL (available at once)
	// GTID is the GTID of the binlog transaction that inserted the row, in
	// the server's syntax ("0-1-42", "uuid:42"), when it was read from a
	// binlog with GTIDs; "" otherwise (polled rows, file+position mode).
	GTID string
}

// Size is the approximate memory the relay holds for the record while it is
// in flight, used to bound it (--max-inflight-bytes): its variable-length
// fields plus RecordOverhead.
func (r *Record) Size() int {
	return RecordOverhead + len(r.PartitionKey) + len(r.Exchange) + len(r.RoutingKey) +
		len(r.MessageType) + len(r.Headers) + len(r.Payload) + len(r.ContentType)
}

// RecordOverhead is what Size counts for a record beyond its variable-length
// fields: the record itself and what the relay builds from it while it is
// in flight (the AMQP message and its headers table, the lane's and the
// channel's entries, the ticket, the binlog event's share). Measured
// (docs/benchmarks.md): a 200,000-row transaction of 1 KiB rows held about
// 3 KB of live heap per row in flight.
const RecordOverhead = 2048

// Due reports whether the record may be published at now: available_at is
// NULL or not in the future.
func (r *Record) Due(now time.Time) bool {
	return r.AvailableAt.IsZero() || !r.AvailableAt.After(now)
}
