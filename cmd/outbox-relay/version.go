package main

import (
	"context"
	"flag"
	"fmt"
	"runtime"
	"runtime/debug"
)

// version is the release, set at build time:
//
//	go build -ldflags "-X main.version=1.2.3" ./cmd/outbox-relay
var version = "dev"

func init() {
	register(&command{
		name:    "version",
		summary: "print the version and the Go version it was built with",
		setup: func(fs *flag.FlagSet) runFunc {
			return func(ctx context.Context, inv *invocation) error {
				if err := noArgs(inv, "version"); err != nil {
					return err
				}
				fmt.Fprintf(inv.stdout, "outbox-relay %s%s (%s %s/%s)\n",
					version, revision(), runtime.Version(), runtime.GOOS, runtime.GOARCH)
				return nil
			}
		},
	})
}

// revision returns " <commit>" from the build's VCS stamp, "" when unknown.
func revision() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	var rev, dirty string
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
			if len(rev) > 12 {
				rev = rev[:12]
			}
		case "vcs.modified":
			if s.Value == "true" {
				dirty = "-dirty"
			}
		}
	}
	if rev == "" {
		return ""
	}
	return " " + rev + dirty
}
