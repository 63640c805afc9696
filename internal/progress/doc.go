// Package progress bounds the waits of tests by progress, not by time: a wait
// over a workload goes on while the thing it watches moves, and fails only
// when nothing has moved for Patience. A slow or busy machine makes a workload
// slow; a stuck relay, server or broker makes it still. Only the second fails.
//
// It is for tests and test harnesses (testenv, testload, validator); the relay
// does not import it.
package progress
