package outbox

import (
	"errors"
	"fmt"
	"strings"
)

// Sentinel errors classifying a [*ValidationError]; test with errors.Is.
var (
	// ErrEmptyRoutingKey: Message.RoutingKey is empty. Every message needs one;
	// the relay publishes with the mandatory flag and an empty key routes
	// nowhere useful.
	ErrEmptyRoutingKey = errors.New("routing key is empty")
	// ErrTooLong: a field is longer than its column (or AMQP short string) allows.
	ErrTooLong = errors.New("value too long")
	// ErrInvalidUTF8: a string field or header is not valid UTF-8.
	ErrInvalidUTF8 = errors.New("invalid UTF-8")
	// ErrBadHeaders: Message.Headers cannot be stored as a flat JSON object of
	// string, number and bool values. Every header problem matches it,
	// including the more specific ErrReservedHeader, ErrTooLong and
	// ErrInvalidUTF8 ones.
	ErrBadHeaders = errors.New("bad headers")
	// ErrReservedHeader: a header name the relay sets itself (x-outbox-*,
	// x-relay-*, x-partition-key, x-created-at, x-replay). Also matches
	// ErrBadHeaders.
	ErrReservedHeader = errors.New("reserved header name")
	// ErrBadAvailableAt: Message.AvailableAt is outside the DATETIME range
	// (years 1000 to 9999).
	ErrBadAvailableAt = errors.New("available-at out of range")
)

// ValidationError reports one bad message. Enqueue returns it (wrapped)
// before running any SQL, so nothing was written.
type ValidationError struct {
	Index  int    // position of the message in the Enqueue call, from 0
	Field  string // Go field name, e.g. "RoutingKey", or `Headers["key"]` for one header
	Reason string // what is wrong, for people
	Err    error  // the sentinel classifying it, e.g. ErrTooLong
}

func (e *ValidationError) Error() string {
	return fmt.Sprintf("message %d: %s: %s", e.Index, e.Field, e.Reason)
}

// Unwrap returns the sentinel, so errors.Is(err, ErrTooLong) works.
func (e *ValidationError) Unwrap() error { return e.Err }

// Is makes every header problem match ErrBadHeaders as well as its own
// sentinel: callers that only care "the headers are bad" need one check.
func (e *ValidationError) Is(target error) bool {
	return target == ErrBadHeaders && strings.HasPrefix(e.Field, "Headers")
}
