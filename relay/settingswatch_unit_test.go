package relay

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/outbox-relay/outbox-relay/canal"
)

// The settings watch says what changed, not what it failed to read: a
// first read that fails, then settings that never changed, say nothing; a
// change to MIXED is said once, and so is the way back.
func TestUnitSettingsWatchSaysChangesOnly(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	r := &Relay{cfg: Config{Mode: ModeBinlog, HeartbeatInterval: time.Millisecond}, log: zap.New(core)}
	row := canal.Settings{Format: "ROW", RowImage: "FULL", RowMetadata: "FULL"}
	mixed := row
	mixed.Format = "MIXED"
	reads := []any{errors.New("driver: bad connection"), row, row, mixed, mixed, row, row}
	stop := make(chan struct{})
	r.readSettings = func(context.Context) (canal.Settings, error) {
		if len(reads) == 0 {
			close(stop)
			reads = append(reads, row, row, row) // the watch reads until it sees stop
			return row, nil
		}
		next := reads[0]
		reads = reads[1:]
		if err, ok := next.(error); ok {
			return canal.Settings{}, err
		}
		return next.(canal.Settings), nil
	}
	p := &pipeline{r: r, store: newFakeStore(), epoch: 1}
	go func() { // rows flow: the watch looks every interval
		for {
			select {
			case <-stop:
				return
			default:
				p.rowsRead.Add(1)
				time.Sleep(time.Millisecond) // a stimulus: rows arriving
			}
		}
	}()
	p.watchSettings(context.Background(), stop)
	changed := logs.FilterMessageSnippet("changed while the relay runs").Len()
	back := logs.FilterMessageSnippet("right again").Len()
	if changed != 1 || back != 1 {
		for _, e := range logs.All() {
			t.Log(e.Message)
		}
		t.Fatalf("said the change %d times and the way back %d times, want once each", changed, back)
	}
}
