package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/migrations"
	"github.com/outbox-relay/outbox-relay/outbox"
)

// Enqueue stores UTC whatever the session's time_zone: created_at is the
// UTC instant of the insert and available_at the UTC form of the time given
// (a PHP-style session in '+05:00' would otherwise shift both by 5 hours).
func TestEnqueueStoresUTCInALocalSession(t *testing.T) {
	db := schemaDB(t, migrations.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	defer conn.ExecContext(context.WithoutCancel(ctx), "SET time_zone = DEFAULT")
	if _, err := conn.ExecContext(ctx, "SET time_zone = '+05:00'"); err != nil {
		t.Fatal(err)
	}
	at := time.Date(2031, 2, 3, 4, 5, 6, 789012000, time.FixedZone("+05", 5*3600))
	before := time.Now().UTC().Truncate(time.Microsecond)
	if _, err := outbox.Enqueue(ctx, conn, outbox.Message{RoutingKey: "r", AvailableAt: at}); err != nil {
		t.Fatal(err)
	}
	after := time.Now().UTC()
	rows := readRows(t, db, "outbox")
	if len(rows) != 1 {
		t.Fatalf("%d rows", len(rows))
	}
	// The server's clock is this machine's: a second of slack for the
	// two clocks being read at different moments, none for a zone shift.
	if c := rows[0].createdAt; c.Before(before.Add(-time.Second)) || c.After(after.Add(time.Second)) {
		t.Fatalf("created_at %s, want the UTC time of the insert (%s .. %s)", c, before, after)
	}
	if a := rows[0].availableAt; !a.Valid || !a.Time.Equal(at) {
		t.Fatalf("available_at %v, want %s", a, at.UTC())
	}
}
