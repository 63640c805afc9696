package checkpoint_test

import (
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/checkpoint/operator"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/position"
)

// The stream destination's publishing ids are stored with the position they
// belong to and read back with it; a position written without them (a
// leader publishing to exchanges) and `checkpoint set` clear them, so they
// never describe another position than the stored one; a write fenced by a
// newer epoch stores neither.
func TestAckStoresStreamIDsWithThePosition(t *testing.T) {
	ctx := testenv.Context(t, time.Minute)
	db := leaderDB(ctx, t)
	store, leader := leading(ctx, t, db)
	epoch := leader.Epoch()
	pos := position.Position{Flavor: position.FlavorMariaDB, GTIDSet: "0-1-10"}
	ids := &checkpoint.StreamIDs{Stream: "orders", Partitions: 3, IDs: []uint64{7, 0, 12}}
	if err := store.Ack(ctx, epoch, checkpoint.Ack{Pos: pos, HasPos: true, StreamIDs: ids}); err != nil {
		t.Fatal(err)
	}
	p, err := store.Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if p.Position.GTIDSet != "0-1-10" || !reflect.DeepEqual(p.StreamIDs, ids) {
		t.Fatalf("stored %s with ids %+v; want 0-1-10 with %+v", p.Position.GTIDSet, p.StreamIDs, ids)
	}

	// An acknowledgement without a position leaves both.
	if err := store.Ack(ctx, epoch, checkpoint.Ack{LastEventAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if p, _ = store.Load(ctx); !reflect.DeepEqual(p.StreamIDs, ids) {
		t.Fatalf("ids after an acknowledgement without position: %+v", p.StreamIDs)
	}

	// A fenced write stores nothing.
	if err := store.Ack(ctx, epoch+1, checkpoint.Ack{Pos: position.Position{Flavor: position.FlavorMariaDB, GTIDSet: "0-1-11"},
		HasPos: true, StreamIDs: &checkpoint.StreamIDs{Stream: "orders", Partitions: 3, IDs: []uint64{9, 9, 9}}}); err != checkpoint.ErrFenced {
		t.Fatalf("ack of another epoch: %v, want ErrFenced", err)
	}
	if p, _ = store.Load(ctx); p.Position.GTIDSet != "0-1-10" || !reflect.DeepEqual(p.StreamIDs, ids) {
		t.Fatalf("after a fenced ack: %s %+v", p.Position.GTIDSet, p.StreamIDs)
	}

	// A position written without ids clears them.
	if err := store.Ack(ctx, epoch, checkpoint.Ack{Pos: position.Position{Flavor: position.FlavorMariaDB, GTIDSet: "0-1-12"}, HasPos: true}); err != nil {
		t.Fatal(err)
	}
	if p, _ = store.Load(ctx); p.Position.GTIDSet != "0-1-12" || p.StreamIDs != nil {
		t.Fatalf("after a position without ids: %s %+v", p.Position.GTIDSet, p.StreamIDs)
	}

	// So does `checkpoint set`.
	if err := store.Ack(ctx, epoch, checkpoint.Ack{Pos: pos, HasPos: true, StreamIDs: ids}); err != nil {
		t.Fatal(err)
	}
	if err := operator.SetPosition(ctx, db, "default", epoch, position.Position{Flavor: position.FlavorMariaDB, GTIDSet: "0-1-5"}, "test"); err != nil {
		t.Fatal(err)
	}
	if p, _ = store.Load(ctx); p.Position.GTIDSet != "0-1-5" || p.StreamIDs != nil {
		t.Fatalf("after checkpoint set: %s %+v", p.Position.GTIDSet, p.StreamIDs)
	}
}

// A term whose publishing ids do not continue the stored ones clears them,
// fenced by its epoch, before it publishes (so no later term continues ids
// it pushed the producers past); the server the ids were read on is stored
// with them.
func TestClearStreamIDsIsFenced(t *testing.T) {
	ctx := testenv.Context(t, time.Minute)
	db := leaderDB(ctx, t)
	store, leader := leading(ctx, t, db)
	epoch := leader.Epoch()
	pos := position.Position{Flavor: position.FlavorMariaDB, GTIDSet: "0-1-10"}
	ids := &checkpoint.StreamIDs{Stream: "orders", Partitions: 2, IDs: []uint64{7, 12}, Server: "server_id:1"}
	if err := store.Ack(ctx, epoch, checkpoint.Ack{Pos: pos, HasPos: true, StreamIDs: ids}); err != nil {
		t.Fatal(err)
	}
	if p, _ := store.Load(ctx); !reflect.DeepEqual(p.StreamIDs, ids) {
		t.Fatalf("stored ids %+v, want %+v", p.StreamIDs, ids)
	}
	if err := store.ClearStreamIDs(ctx, epoch+1); !errors.Is(err, checkpoint.ErrFenced) {
		t.Fatalf("clear by another epoch: %v, want ErrFenced", err)
	}
	if p, _ := store.Load(ctx); !reflect.DeepEqual(p.StreamIDs, ids) {
		t.Fatalf("ids after a fenced clear: %+v", p.StreamIDs)
	}
	if err := store.ClearStreamIDs(ctx, epoch); err != nil {
		t.Fatal(err)
	}
	if p, _ := store.Load(ctx); p.StreamIDs != nil || p.Position.GTIDSet != "0-1-10" {
		t.Fatalf("after the clear: %s %+v, want the position kept and no ids", p.Position.GTIDSet, p.StreamIDs)
	}
}
