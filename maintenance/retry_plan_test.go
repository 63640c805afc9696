package maintenance

import (
	"slices"
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/outbox"
)

// The retry plan, shared by the dry run and the real run, decided without
// a server from the failures read and the outbox copies of their ids.
func TestDecideRetry(t *testing.T) {
	msg := func(b byte) outbox.MessageID { return outbox.MessageID{15: b} }
	var zero outbox.MessageID
	fail := func(id uint64, m outbox.MessageID, payload string) failure {
		return failure{id: id, outboxID: 100 + id, messageID: m, key: "k", exchange: "x", psum: payload, plen: int64(len(payload))}
	}
	// outbox_failed as read: rows 1 and 2 copies of message 1, 3 and 4
	// differing failures of message 2, 5 of message 3, 6 and 7 without a
	// UUID, 8 of message 4.
	rows := []failure{fail(1, msg(1), "a"), fail(2, msg(1), "a"), fail(3, msg(2), "a"), fail(4, msg(2), "b"),
		fail(5, msg(3), "a"), fail(6, zero, "a"), fail(7, zero, "b"), fail(8, msg(4), "a")}
	byMsg := map[outbox.MessageID][]failure{}
	byRow := map[uint64]failure{}
	for _, f := range rows {
		byRow[f.id] = f
		if f.messageID != zero {
			byMsg[f.messageID] = append(byMsg[f.messageID], f)
		}
	}
	// In the outbox: message 3 pending as id 50, message 4 delivered
	// (mark mode) as id 60.
	copies := map[outbox.MessageID][]copyRow{msg(3): {{id: 50}}, msg(4): {{id: 60, delivered: true}}}

	type want struct {
		retried   []Retried
		skipped   []string // Skipped.Name() and a piece of its reason
		failedIDs []uint64
		delivered []uint64
	}
	for _, c := range []struct {
		name    string
		targets []target
		want    want
	}{
		{"copies go back once", []target{{msg: msg(1)}},
			want{retried: []Retried{{MessageID: msg(1), RowIDs: []uint64{1, 2}}}, failedIDs: []uint64{1, 2}}},
		{"one copy by row id", []target{{row: 2}},
			want{retried: []Retried{{MessageID: msg(1), RowIDs: []uint64{2}}}, failedIDs: []uint64{2}}},
		{"id and one of its rows: one message", []target{{msg: msg(1)}, {row: 2}},
			want{retried: []Retried{{MessageID: msg(1), RowIDs: []uint64{1, 2}}}, failedIDs: []uint64{1, 2}}},
		{"differing failures refused by id", []target{{msg: msg(2)}},
			want{skipped: []string{msg(2).String() + ": failed rows 3 and 4 differ"}}},
		{"one of differing failures by row id", []target{{row: 4}},
			want{retried: []Retried{{MessageID: msg(2), RowIDs: []uint64{4}}}, failedIDs: []uint64{4}}},
		{"pending in the outbox", []target{{msg: msg(3)}},
			want{skipped: []string{msg(3).String() + ": still pending in outbox as id 50"}}},
		{"delivered copy replaced", []target{{msg: msg(4)}},
			want{retried: []Retried{{MessageID: msg(4), RowIDs: []uint64{8}, ReplacedDelivered: true}}, failedIDs: []uint64{8}, delivered: []uint64{60}}},
		{"no UUID: each row its own message", []target{{row: 6}, {row: 7}},
			want{retried: []Retried{{NewMessageID: true, RowIDs: []uint64{6}}, {NewMessageID: true, RowIDs: []uint64{7}}}, failedIDs: []uint64{6, 7}}},
		{"not failed", []target{{msg: msg(9)}, {row: 99}},
			want{skipped: []string{msg(9).String() + ": not in outbox_failed", "failed row 99: not in outbox_failed"}}},
		{"some go, some not", []target{{msg: msg(3)}, {msg: msg(1)}},
			want{retried: []Retried{{MessageID: msg(1), RowIDs: []uint64{1, 2}}}, failedIDs: []uint64{1, 2},
				skipped: []string{msg(3).String() + ": still pending"}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			units, skipped, err := groupUnits(c.targets, byMsg, byRow)
			if err != nil {
				t.Fatal(err)
			}
			p := decideRetry("`outbox`", units, copies)
			p.skipped = append(skipped, p.skipped...)
			if !slices.EqualFunc(p.retried, c.want.retried, func(a, b Retried) bool {
				return a.MessageID == b.MessageID && a.NewMessageID == b.NewMessageID && slices.Equal(a.RowIDs, b.RowIDs) &&
					a.ReplacedDelivered == b.ReplacedDelivered && a.NewID == 0
			}) {
				t.Errorf("retried %+v, want %+v", p.retried, c.want.retried)
			}
			if len(p.templates) != len(p.retried) {
				t.Errorf("%d templates for %d retried messages", len(p.templates), len(p.retried))
			}
			for i, r := range p.retried { // rebuilt from its newest failure
				if newest := r.RowIDs[len(r.RowIDs)-1]; p.templates[i].id != newest {
					t.Errorf("message %v rebuilt from failed row %d, want its newest %d", r.MessageID, p.templates[i].id, newest)
				}
			}
			if len(p.skipped) != len(c.want.skipped) {
				t.Fatalf("skipped %+v, want %q", p.skipped, c.want.skipped)
			}
			for i, s := range p.skipped {
				name, reason, _ := strings.Cut(c.want.skipped[i], ": ")
				if s.Name() != name || !strings.Contains(s.Reason, reason) {
					t.Errorf("skipped %s: %q; want %s: ...%q...", s.Name(), s.Reason, name, reason)
				}
			}
			if !slices.Equal(p.failedIDs, c.want.failedIDs) || !slices.Equal(p.delivered, c.want.delivered) {
				t.Errorf("deletes failed rows %v and outbox copies %v; want %v and %v", p.failedIDs, p.delivered, c.want.failedIDs, c.want.delivered)
			}
		})
	}
}
