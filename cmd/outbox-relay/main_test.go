package main

import (
	"flag"
	"os"
	"testing"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// testParallel is how many of this package's parallel tests run at once
// unless -parallel is given. Most start relay processes against servers of
// their own and mostly wait (for leases, reconnects, exits, a stalled
// broker), so more of them than the machine has cores (go test's default)
// keep the cores busy without slowing any; the few whose workloads keep
// the cores busy take turns in the heavy lane (heavy), holding their slot
// while they wait for it.
const testParallel = "8"

func TestMain(m *testing.M) {
	flag.Parse()
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "test.parallel" })
	if !given {
		if err := flag.Set("test.parallel", testParallel); err != nil {
			panic(err)
		}
	}
	os.Exit(testenv.Main(m))
}
