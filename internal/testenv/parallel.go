package testenv

import (
	"flag"
	"strconv"
)

// Parallel makes n the number of a test binary's parallel tests that run at
// once (go test's -parallel, which defaults to GOMAXPROCS), unless the
// command line sets -parallel itself or fuzzes (where -parallel is the
// number of fuzzing workers). Call it from TestMain before Main, for a
// package whose parallel tests mostly wait (on a fault, a lease, a broker
// restart) rather than compute:
//
//	func TestMain(m *testing.M) { testenv.Parallel(4); os.Exit(testenv.Main(m)) }
func Parallel(n int) {
	if !flag.Parsed() {
		flag.Parse()
	}
	set := false
	flag.Visit(func(f *flag.Flag) {
		if f.Name == "test.parallel" || f.Name == "test.fuzz" {
			set = true
		}
	})
	if !set {
		_ = flag.Set("test.parallel", strconv.Itoa(n)) // registered by the testing package: cannot fail
	}
}
