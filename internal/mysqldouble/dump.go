package mysqldouble

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-mysql-org/go-mysql/mysql"
	"github.com/go-mysql-org/go-mysql/replication"
)

// dumpStart is where a dump starts: a file and the index of its first
// event to send (a FORMAT_DESCRIPTION is always sent first).
type dumpStart struct {
	file, event int
}

// startAt finds the event at offset pos of the named file.
func (s *Server) startAt(name string, pos uint32) (dumpStart, error) {
	for i, f := range s.files {
		if f.name != name {
			continue
		}
		off := uint32(4)
		for j, ev := range f.events {
			if off == pos {
				return dumpStart{i, j}, nil
			}
			off += uint32(len(ev.raw))
		}
		if off == pos {
			return dumpStart{i, len(f.events)}, nil
		}
	}
	return dumpStart{}, mysql.NewError(mysql.ER_MASTER_FATAL_ERROR_READING_BINLOG,
		fmt.Sprintf("Could not find first log file name in binary log index file (%s:%d)", name, pos))
}

// stream sends the binlog from start on, skipping the transactions in
// have (nil: none), then waits for more, sending heartbeats every period,
// until ctx ends (the connection closed).
func (s *Server) stream(ctx context.Context, st *replication.BinlogStreamer, start dumpStart, have *mysql.MysqlGTIDSet, period time.Duration) {
	defer s.wg.Done()
	// Every return ends the connection's writeBinlogEvents, which waits
	// for the next event otherwise.
	defer st.AddErrorToStreamer(errors.New("dump ended"))
	send := func(raw []byte) bool {
		select {
		case <-ctx.Done():
			return false
		default:
		}
		return st.AddEventToStreamer(&replication.BinlogEvent{RawData: raw}) == nil
	}
	s.mu.Lock()
	f := s.files[start.file]
	pos := uint64(4)
	for _, ev := range f.events[:start.event] {
		pos += uint64(len(ev.raw))
	}
	fde := f.events[0].raw
	s.mu.Unlock()
	if !send(FakeRotate(s.cfg.ServerID, f.name, pos)) || start.event > 0 && !send(fde) {
		return
	}
	fileIdx, evIdx, skipping := start.file, start.event, false
	for {
		s.mu.Lock()
		var batch [][]byte
		for fileIdx < len(s.files) {
			f := s.files[fileIdx]
			for ; evIdx < len(f.events); evIdx++ {
				ev := f.events[evIdx]
				if ev.gtid != nil {
					skipping = have != nil && have.Contain(single(*ev.gtid))
				} else if ev.raw[4] == byte(replication.ANONYMOUS_GTID_EVENT) {
					skipping = false
				}
				if skipping && ev.raw[4] != byte(replication.ROTATE_EVENT) {
					continue
				}
				batch = append(batch, ev.raw)
			}
			if !f.closed {
				break
			}
			fileIdx, evIdx = fileIdx+1, 0
		}
		changed := s.changed
		hb := s.enc.Heartbeat(s.current().name)
		s.mu.Unlock()
		for _, raw := range batch {
			if !send(raw) {
				return
			}
		}
		var tick <-chan time.Time
		var timer *time.Timer
		if period > 0 {
			timer = time.NewTimer(period)
			tick = timer.C
		}
		stop := func() {
			if timer != nil {
				timer.Stop()
			}
		}
		select {
		case <-ctx.Done():
			stop()
			return
		case <-changed:
			stop()
		case <-tick:
			if !send(hb) {
				return
			}
		}
	}
}

func single(k gtidKey) *mysql.MysqlGTIDSet {
	set := mysql.NewMysqlGTIDSet()
	set.AddGTIDWithTag(k.sid, k.tag, k.gno)
	return &set
}
