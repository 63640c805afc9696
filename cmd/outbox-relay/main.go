package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"

	"github.com/outbox-relay/outbox-relay/internal/redact"
)

// Exit codes (docs/operations.md).
const (
	exitOK      = 0
	exitFailure = 1 // runtime failure
	exitUsage   = 2 // bad usage or configuration
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	warnUnknownEnv(os.Stderr, os.Environ())
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr, os.LookupEnv)
	stop()
	os.Exit(code)
}

// usageError marks an error as bad usage or configuration: exit code 2.
type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

// usagef returns a usage error (exit code 2). The message should name what
// to fix.
func usagef(format string, args ...any) error {
	return &usageError{fmt.Errorf(format, args...)}
}

// run is main without the process: it dispatches args to a command and
// returns the exit code. Errors are printed as one line on stderr. Whatever
// the command prints on stdout and stderr (its log included) passes through
// redact.Writer with the passwords of its DSN and URL flags, and so does a
// panic of this goroutine: printed with its stack, exit code 1 (a runtime
// failure). A panic of another goroutine is printed by the Go runtime.
func run(ctx context.Context, args []string, stdout, stderr io.Writer, lookupEnv func(string) (string, bool)) (code int) {
	var secrets []string
	f, isFile := stderr.(*os.File)
	terminal := isFile && isTerminal(f)
	stdout, stderr = redact.Writer(stdout, &secrets), redact.Writer(stderr, &secrets)
	defer func() {
		if p := recover(); p != nil {
			fmt.Fprintf(stderr, "panic: %v\n\n%s", p, debug.Stack())
			code = exitFailure
		}
	}()
	err := dispatch(ctx, args, stdout, stderr, terminal, lookupEnv, &secrets)
	if err == nil {
		return exitOK
	}
	err = explainError(err)
	fmt.Fprintf(stderr, "outbox-relay: %s\n", flagNames(strings.ReplaceAll(err.Error(), "\n", " ")))
	var ue *usageError
	if errors.As(err, &ue) {
		return exitUsage
	}
	return exitFailure
}
