package testenv

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
)

// Replica server ids of binlog clients (relays, replays, tailers) started by
// tests. Each test binary claims one block of idBlockSize ids in
// [minClientServerID, minAutoServerID), below the ids of private servers.
const (
	minClientServerID = 10_000
	idBlockSize       = 10_000
	idBlocks          = (minAutoServerID - minClientServerID) / idBlockSize // 99
	idLockDir         = "outbox-relay-testenv-server-ids"
)

// ids is the allocator's process state: the block this test binary holds and
// the next id in it. The lock file stays open (and locked) until the process
// exits.
var ids struct {
	mu   sync.Mutex
	lock *os.File // nil until the first ServerID
	base uint32   // first id of the block
	next uint32   // ids handed out so far
}

// ServerID returns a replica server id for a binlog client the test starts
// (relay, replay, canal tailer): never 0, never a private server's own id, and
// never one that another call returned, in this test binary or in any other
// test binary running on the machine at the same time — so packages tested in
// parallel against one external server (OUTBOX_TEST_MYSQL_DSN) never register
// two binlog dumps under one id, which would make the server drop the first.
//
// How: the first call claims one of 99 blocks of 10,000 ids in
// [10000, 1000000) by taking an exclusive flock(2) on the block's file in
// $TMPDIR/outbox-relay-testenv-server-ids; the file stays open until the
// process exits, so a block is held exactly as long as its binary lives (the
// kernel releases the lock of a killed binary too) and the next binary reuses
// it. Ids within the block are handed out in order. The test fails when all
// blocks are held or the binary has used all 10,000 of its ids.
func ServerID(t testing.TB) uint32 {
	t.Helper()
	id, err := nextServerID()
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	return id
}

func nextServerID() (uint32, error) {
	ids.mu.Lock()
	defer ids.mu.Unlock()
	if ids.lock == nil {
		lock, base, err := claimIDBlock(filepath.Join(os.TempDir(), idLockDir))
		if err != nil {
			return 0, err
		}
		ids.lock, ids.base = lock, base
	}
	if ids.next >= idBlockSize {
		return 0, fmt.Errorf("server ids: this test binary used all %d ids of its block [%d, %d)", idBlockSize, ids.base, ids.base+idBlockSize)
	}
	ids.next++
	return ids.base + ids.next - 1, nil
}

// claimIDBlock locks the file of the first block in dir that no open file
// holds locked and returns it, open, with the block's first id.
func claimIDBlock(dir string) (*os.File, uint32, error) {
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return nil, 0, fmt.Errorf("server ids: create the lock directory: %w", err)
	}
	for block := range idBlocks {
		f, err := os.OpenFile(filepath.Join(dir, fmt.Sprintf("block-%02d.lock", block)), os.O_CREATE|os.O_RDWR, 0o666)
		if err != nil {
			return nil, 0, fmt.Errorf("server ids: open the lock file of block %d: %w", block, err)
		}
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			continue // another live test binary holds it
		}
		if err != nil {
			f.Close()
			return nil, 0, fmt.Errorf("server ids: lock %s: %w", f.Name(), err)
		}
		return f, minClientServerID + uint32(block)*idBlockSize, nil
	}
	return nil, 0, fmt.Errorf("server ids: all %d blocks in %s are held by running test binaries; wait for them to finish", idBlocks, dir)
}
