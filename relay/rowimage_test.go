package relay

import (
	"database/sql"
	"fmt"
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/outbox"
)

// Where its user may (here root), the relay's acknowledging DELETEs write
// only each row's key to the binlog (binlog_row_image=MINIMAL in its own
// sessions), not the whole row, payload included: every Delete_rows event
// is smaller than one row's payload. The producers' inserts keep the
// server's FULL image, which the relay reads.
func TestRelayAcknowledgesWithMinimalRowImage(t *testing.T) {
	t.Parallel()
	srv, db, b := privateSetup(t)
	startRelay(t, db, b, nil)
	ctx := testenv.WorkContext(t)
	const rows, payloadBytes = 40, 2000
	payload := []byte(`"` + strings.Repeat("x", payloadBytes-2) + `"`)
	for i := range rows {
		if _, err := outbox.Enqueue(ctx, db.SQL, outbox.Message{PartitionKey: fmt.Sprintf("k%d", i%4), RoutingKey: "image", Payload: payload}); err != nil {
			t.Fatal(err)
		}
	}
	waitRows(ctx, t, db, "SELECT COUNT(*) FROM outbox", 0)

	root := srv.Root(t)
	var files []string
	logs, err := root.QueryContext(ctx, "SHOW BINARY LOGS")
	if err != nil {
		t.Fatal(err)
	}
	for logs.Next() {
		var name string
		var size any
		if err := logs.Scan(&name, &size); err != nil {
			t.Fatal(err)
		}
		files = append(files, name)
	}
	if err := logs.Close(); err != nil {
		t.Fatal(err)
	}
	var inserts, deletes int
	for _, f := range files {
		events, err := root.QueryContext(ctx, "SHOW BINLOG EVENTS IN '"+f+"'")
		if err != nil {
			t.Fatal(err)
		}
		for events.Next() {
			var (
				logName, eventType, info string
				pos, end                 int64
				serverID                 sql.RawBytes
			)
			if err := events.Scan(&logName, &pos, &eventType, &serverID, &end, &info); err != nil {
				t.Fatal(err)
			}
			size := end - pos
			switch {
			case strings.HasPrefix(eventType, "Write_rows") && size > payloadBytes:
				inserts++ // a producer's row, whole
			case strings.HasPrefix(eventType, "Delete_rows"):
				deletes++
				if size >= payloadBytes {
					t.Errorf("%s at %s:%d is %d bytes: the acknowledgement wrote whole rows (payload %d bytes) to the binlog", eventType, f, pos, size, payloadBytes)
				}
			}
		}
		if err := events.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if inserts < rows || deletes == 0 {
		t.Fatalf("binlog holds %d whole-row inserts and %d deletes; want the %d produced and their acknowledgements", inserts, deletes, rows)
	}
}
