package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"

	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/internal/redact"
)

// command is one subcommand. Each lives in its own file, which registers it
// from an init function:
//
//	func init() { register(&command{name: "run", summary: "...", setup: setupRun}) }
//
// Adding a command touches nothing else: dispatch, help, the environment and
// config-file layer and the common flags come with register.
type command struct {
	name    string
	summary string // one line for `outbox-relay help`
	usage   string // what follows the name in the synopsis; "" means "[flags]"
	help    string // optional paragraph(s) for `outbox-relay <name> --help`
	// setup declares the command's flags on fs and returns the function that
	// runs the command. It is called once per invocation (and once more to
	// learn the flag names valid in a config file), so it must only declare
	// flags, not act.
	setup func(fs *flag.FlagSet) runFunc
	// subs, for a command without setup, are its sub-commands (failed list,
	// checkpoint set): the first argument names the one to run (runSub).
	// noSub is the error when none is given.
	subs  []*subcommand
	noSub string
}

// subcommand is a leaf of a command: it declares its own flags (shared ones
// through the same declare functions as every command) and runs with them.
type subcommand struct {
	name  string
	setup func(fs *flag.FlagSet) runFunc
}

// runFunc runs a command once its flags are resolved. An error wrapped by
// usagef exits with 2, any other with 1.
type runFunc func(ctx context.Context, inv *invocation) error

// invocation is what a running command gets.
type invocation struct {
	args   []string // positional arguments after the flags
	stdout io.Writer
	stderr io.Writer
	log    *zap.Logger
	// typed are the flags given on the command line (not by the
	// environment or the config file): before the first argument, and for
	// a sub-command among its arguments too.
	typed map[string]bool
	// terminal: the process's stderr is a terminal (stderr above is a
	// wrapper of it, never the *os.File itself).
	terminal bool
	// secrets are the passwords masked in everything the command prints:
	// its stdout, stderr and log pass through redact.Writer with them, and
	// what it serves otherwise (/readyz) goes through redact.Scrub with them.
	// A command that learns another password appends it before using it.
	secrets *[]string
}

// commands is the registry, filled by register from init functions and only
// read afterwards. It is the package's one piece of package-level state, and
// it exists so that a new subcommand is one new file.
var commands = map[string]*command{}

// register adds c to the registry; duplicate names are a programming error.
func register(c *command) {
	if _, dup := commands[c.name]; dup {
		panic("outbox-relay: command " + c.name + " registered twice")
	}
	commands[c.name] = c
}

// commonFlags are declared on every command.
type commonFlags struct {
	config    string
	logFormat string
	logLevel  string
}

func declareCommon(fs *flag.FlagSet, c *commonFlags) {
	fs.StringVar(&c.config, "config", "", "YAML `file` of flag values (keys are flag names)")
	fs.StringVar(&c.logFormat, "log-format", "json", "log format: json or console; operator commands (all but run and bench) default to console when stderr is a terminal")
	fs.StringVar(&c.logLevel, "log-level", "info", "log level: debug, info, warn or error; operator commands (all but run and bench) default to warn when stderr is a terminal")
}

// dispatch runs the command args name. secrets receives the passwords found
// in DSN and URL flags once the flags are resolved, before the command runs:
// the caller's writers mask them.
func dispatch(ctx context.Context, args []string, stdout, stderr io.Writer, terminal bool, lookupEnv func(string) (string, bool), secrets *[]string) error {
	if len(args) == 0 {
		printMainUsage(stderr)
		return usagef("no command given; run 'outbox-relay help' for the list")
	}
	name := args[0]
	switch name {
	case "help", "-h", "-help", "--help":
		if len(args) > 1 {
			c, ok := commands[args[1]]
			if !ok {
				return usagef("unknown command %q; run 'outbox-relay help' for the list", args[1])
			}
			fs, _, _ := newFlagSet(c)
			printUsage(stdout, c, fs)
			return nil
		}
		printMainUsage(stdout)
		return nil
	}
	c, ok := commands[name]
	if !ok {
		return usagef("unknown command %q; run 'outbox-relay help' for the list", name)
	}

	fs, common, runner := newFlagSet(c)
	if err := fs.Parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printUsage(stdout, c, fs)
			return nil
		}
		return usagef("%s: %v; run 'outbox-relay %s --help'", name, explainParseError(fs, err), name)
	}
	typed := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { typed[f.Name] = true })
	if err := resolve(fs, lookupEnv, knownKeys()); err != nil {
		return err
	}
	*secrets = passwords(fs)

	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true }) // by the command line, the environment or the file
	format, level := logDefaults(name, terminal, given, common.logFormat, common.logLevel)
	log, err := newLogger(format, level, stderr)
	if err != nil {
		return err
	}
	defer func() { _ = log.Sync() }()
	return runner(ctx, &invocation{args: fs.Args(), typed: typed, stdout: stdout, stderr: stderr, log: log.With(zap.String("command", name)), terminal: terminal, secrets: secrets})
}

// newFlagSet builds c's flag set with the common flags. The flag set of a
// command with sub-commands is the union of theirs: what its help lists,
// and what the environment and the config file may set; its runner is
// runSub.
func newFlagSet(c *command) (*flag.FlagSet, *commonFlags, runFunc) {
	fs := flag.NewFlagSet("outbox-relay "+c.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are reported by dispatch, in one line
	var common commonFlags
	declareCommon(fs, &common)
	if c.setup != nil {
		return fs, &common, c.setup(fs)
	}
	for _, sub := range c.subs {
		sfs := flag.NewFlagSet("", flag.ContinueOnError)
		sub.setup(sfs)
		sfs.VisitAll(func(f *flag.Flag) {
			if fs.Lookup(f.Name) == nil {
				fs.Var(f.Value, f.Name, f.Usage)
			}
		})
	}
	return fs, &common, func(ctx context.Context, inv *invocation) error { return runSub(ctx, c, fs, inv) }
}

// runSub runs the sub-command of c that inv's first argument names, on a
// flag set of its own: the values the command's flag set (all) got from
// before the sub-command, the environment or the config file, then the
// flags after it and among its arguments. A flag of another sub-command
// typed on the command line is refused; one from the environment or the
// config file is not this sub-command's business and is ignored.
func runSub(ctx context.Context, c *command, all *flag.FlagSet, inv *invocation) error {
	if len(inv.args) == 0 {
		return usagef("%s", c.noSub)
	}
	name := inv.args[0]
	var sub *subcommand
	names := make([]string, len(c.subs))
	for i, s := range c.subs {
		names[i] = s.name
		if s.name == name {
			sub = s
		}
	}
	if sub == nil {
		last := len(names) - 1
		return usagef("%s: unknown subcommand %q: want %s or %s", c.name, name, strings.Join(names[:last], ", "), names[last])
	}
	fs := flag.NewFlagSet("outbox-relay "+c.name+" "+name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	declareCommon(fs, &commonFlags{}) // accepted here too; the log is set up already
	runner := sub.setup(fs)
	var err error
	all.Visit(func(f *flag.Flag) {
		switch {
		case err != nil:
		case fs.Lookup(f.Name) != nil:
			if e := fs.Set(f.Name, f.Value.String()); e != nil {
				err = usagef("%s %s: --%s: %v", c.name, name, f.Name, e)
			}
		case inv.typed[f.Name]:
			err = usagef("%s %s does not take --%s", c.name, name, f.Name)
		}
	})
	if err != nil {
		return err
	}
	args, given, err := parseInterleaved(fs, inv.args[1:])
	if errors.Is(err, flag.ErrHelp) {
		printUsage(inv.stdout, c, all)
		return nil
	}
	if err != nil {
		if f := undefinedFlag(err); f != "" && all.Lookup(f) != nil {
			return usagef("%s %s does not take --%s", c.name, name, f)
		}
		return usagef("%s: %v; run 'outbox-relay %s --help'", c.name, explainParseError(fs, err), c.name)
	}
	leaf := *inv
	leaf.args, leaf.typed = args, map[string]bool{}
	for _, typed := range []map[string]bool{inv.typed, given} {
		for f := range typed {
			leaf.typed[f] = true
		}
	}
	return runner(ctx, &leaf)
}

// undefinedFlag is the name in the flag package's error for a flag the
// set does not declare, or "".
func undefinedFlag(err error) string {
	name, ok := strings.CutPrefix(err.Error(), "flag provided but not defined: ")
	if !ok {
		return ""
	}
	return strings.TrimLeft(name, "-")
}

// knownKeys returns every flag name of every command: the keys a config
// file may use.
func knownKeys() map[string]bool {
	keys := map[string]bool{}
	for _, c := range commands {
		fs, _, _ := newFlagSet(c)
		fs.VisitAll(func(f *flag.Flag) { keys[f.Name] = true })
	}
	return keys
}

// isSet reports whether the flag name of fs was given: on the command line,
// in the environment or in the config file (resolve sets those through
// fs.Set). Call it once the flags are resolved, from a runFunc.
func isSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// noArgs is for commands that take no positional arguments.
func noArgs(inv *invocation, name string) error {
	if len(inv.args) > 0 {
		return usagef("%s takes no arguments, got %q; flags go before arguments, e.g. --table=x", name, redact.Value(inv.args[0]))
	}
	return nil
}

func printMainUsage(w io.Writer) {
	fmt.Fprintln(w, "Usage: outbox-relay <command> [flags]")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Relays rows of a MySQL/MariaDB outbox table to RabbitMQ.")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Commands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	width := 0
	for _, n := range names {
		width = max(width, len(n))
	}
	for _, n := range names {
		fmt.Fprintf(w, "  %-*s  %s\n", width, n, commands[n].summary)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Run 'outbox-relay <command> --help' for its flags. Every flag may also be set")
	fmt.Fprintln(w, "with OUTBOX_RELAY_<FLAG> (e.g. OUTBOX_RELAY_MYSQL_DSN) or in the --config YAML")
	fmt.Fprintln(w, "file; flags win over the environment, the environment over the file.")
	fmt.Fprintf(w, "Flags that override a safety check (%s)\n", strings.Join(overrideNames(), ", "))
	fmt.Fprintln(w, "count only when typed on the command line: from the environment or the file")
	fmt.Fprintln(w, "they are refused (exit 2).")
}

// overrideNames returns the override flags of every command (declareOverride),
// as --name, sorted.
func overrideNames() []string {
	seen := map[string]bool{}
	var names []string
	for _, c := range commands {
		fs, _, _ := newFlagSet(c)
		fs.VisitAll(func(f *flag.Flag) {
			if isOverride(f) && !seen[f.Name] {
				seen[f.Name] = true
				names = append(names, "--"+f.Name)
			}
		})
	}
	sort.Strings(names)
	return names
}

// printUsage prints a command's help, with each flag's environment variable.
func printUsage(w io.Writer, c *command, fs *flag.FlagSet) {
	usage := c.usage
	if usage == "" {
		usage = "[flags]"
	}
	fmt.Fprintf(w, "Usage: outbox-relay %s %s\n\n%s\n", c.name, usage, c.summary)
	if c.help != "" {
		fmt.Fprintf(w, "\n%s\n", strings.TrimSpace(c.help))
	}
	fmt.Fprintln(w, "\nFlags:")
	fs.VisitAll(func(f *flag.Flag) {
		typ, text := flag.UnquoteUsage(f)
		line := "  --" + f.Name
		if typ != "" {
			line += " " + typ
		}
		where := "env " + envName(f.Name)
		if isOverride(f) {
			where = "command line only: it overrides a safety check; refused from " + envName(f.Name) + " or a config file"
		}
		fmt.Fprintf(w, "%s    (%s)\n        %s", line, where, text)
		if f.DefValue != "" && f.DefValue != "false" {
			fmt.Fprintf(w, " (default %q)", f.DefValue)
		}
		fmt.Fprintln(w)
	})
}
