package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// envPrefix starts every environment variable that sets a flag.
const envPrefix = "OUTBOX_RELAY_"

// envName returns the environment variable of a flag: --mysql-dsn is
// OUTBOX_RELAY_MYSQL_DSN.
func envName(flagName string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// resolve completes a parsed flag set. Every flag not given on the command
// line is taken from its environment variable if that is set and non-empty,
// else from the config file (--config, or OUTBOX_RELAY_CONFIG), else it keeps
// its default. known is the set of keys a config file may use (the flags of
// all commands); keys of other commands are ignored, unknown keys refused.
// An override flag (declareOverride) set in the environment or the file is
// refused, whether or not it is also on the command line: it counts only
// there. Every failure is a usage error naming the variable or key.
func resolve(fs *flag.FlagSet, lookupEnv func(string) (string, bool), known map[string]bool) error {
	fromCLI := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { fromCLI[f.Name] = true })

	fromEnv := map[string]bool{}
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if err != nil {
			return
		}
		v, ok := lookupEnv(envName(f.Name))
		if !ok || v == "" {
			return
		}
		if isOverride(f) {
			err = usagef("environment %s sets --%s, which overrides a safety check and counts only when typed on the command line: unset %s and give --%s on the command where you mean it",
				envName(f.Name), f.Name, envName(f.Name), f.Name)
			return
		}
		if fromCLI[f.Name] {
			return
		}
		if e := fs.Set(f.Name, v); e != nil {
			err = usagef("environment %s=%q: %v", envName(f.Name), displayValue(f.Name, v), valueErr(f, v, e))
			return
		}
		fromEnv[f.Name] = true
	})
	if err != nil {
		return err
	}

	cfg := fs.Lookup("config")
	if cfg == nil || cfg.Value.String() == "" {
		return nil
	}
	path := cfg.Value.String()
	values, err := loadConfigFile(path, known)
	if err != nil {
		return err
	}
	for _, kv := range values {
		f := fs.Lookup(kv.key)
		if f != nil && isOverride(f) {
			return usagef("config file %s:%d: key %q: --%s overrides a safety check and counts only when typed on the command line: remove it from the file and give --%s on the command where you mean it",
				path, kv.line, kv.key, kv.key, kv.key)
		}
		if f == nil || fromCLI[kv.key] || fromEnv[kv.key] {
			continue // another command's key, or overridden
		}
		if e := fs.Set(kv.key, kv.value); e != nil {
			return usagef("config file %s: %s: %q: %v", path, kv.key, displayValue(kv.key, kv.value), valueErr(f, kv.value, e))
		}
	}
	return nil
}

// unwrapFlagErr drops the flag package's wrapping ("parse error") where it
// only repeats what the caller says.
func unwrapFlagErr(err error) error {
	if u := errors.Unwrap(err); u != nil {
		return u
	}
	return err
}

// valueErr is the error of setting flag f to value, saying what is wanted
// where the flag package only says "parse error": a duration needs a unit.
func valueErr(f *flag.Flag, value string, err error) error {
	if !isDuration(f) {
		return unwrapFlagErr(err)
	}
	v := strings.TrimSpace(value)
	if _, e := strconv.ParseFloat(v, 64); e == nil {
		return fmt.Errorf("a duration needs a unit: e.g. %ss or %sms", v, v)
	}
	return errors.New("not a duration: write a number with a unit, e.g. 5s, 100ms or 2m")
}

func isDuration(f *flag.Flag) bool {
	g, ok := f.Value.(flag.Getter)
	if !ok {
		return false
	}
	_, is := g.Get().(time.Duration)
	return is
}

// explainParseError rewrites fs.Parse's "invalid value" error for a
// duration flag given on the command line as valueErr does; other errors
// pass unchanged.
func explainParseError(fs *flag.FlagSet, err error) error {
	m := invalidValue.FindStringSubmatch(err.Error())
	if m == nil {
		return err
	}
	value, e := strconv.Unquote(m[1])
	f := fs.Lookup(m[2])
	if e != nil || f == nil || !isDuration(f) {
		return err
	}
	return fmt.Errorf("invalid value %q for flag -%s: %v", displayValue(f.Name, value), f.Name, valueErr(f, value, err))
}

// invalidValue matches the flag package's error for a value its flag refused.
var invalidValue = regexp.MustCompile(`^invalid value ("(?:[^"\\]|\\.)*") for flag -([^:]+): `)

// keyValue is one entry of a config file, in file order.
type keyValue struct {
	key, value string
	line       int
}

// loadConfigFile reads a YAML mapping of flag names to scalar values.
func loadConfigFile(path string, known map[string]bool) ([]keyValue, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, usagef("config file: %v; fix --config or %sCONFIG", err, envPrefix)
	}
	var doc yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, nil // an empty file sets nothing
		}
		return nil, usagef("config file %s: %v", path, err)
	}
	root := &doc
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		root = root.Content[0]
	}
	if root.Kind == yaml.ScalarNode && root.Tag == "!!null" {
		return nil, nil // only comments
	}
	if root.Kind != yaml.MappingNode {
		return nil, usagef("config file %s: want a mapping of flag names to values, e.g. \"mysql-dsn: user:pass@tcp(host:3306)/db\"", path)
	}
	seen := map[string]bool{}
	var out []keyValue
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i], root.Content[i+1]
		key := k.Value
		switch {
		case key == "config":
			return nil, usagef("config file %s:%d: key \"config\" cannot be set in a config file", path, k.Line)
		case !known[key]:
			return nil, usagef("config file %s:%d: unknown key %q; keys are flag names such as mysql-dsn (see 'outbox-relay help <command>')", path, k.Line, key)
		case seen[key]:
			return nil, usagef("config file %s:%d: key %q given twice", path, k.Line, key)
		case v.Kind != yaml.ScalarNode:
			return nil, usagef("config file %s:%d: key %q: want a single value, not a list or mapping", path, v.Line, key)
		case v.Tag == "!!null":
			return nil, usagef("config file %s:%d: key %q has no value; remove it or give one", path, v.Line, key)
		}
		seen[key] = true
		// The scalar's text as written: "5s", "true" and "0x10" reach the
		// flag parser unchanged.
		out = append(out, keyValue{key, v.Value, k.Line})
	}
	return out, nil
}

// overrideFlag is the value of a boolean flag that overrides a refusal
// (--force, --all, --accept-lost-gtids): it counts only when typed on the
// command line. resolve refuses it from the environment or a config file,
// and the help says so. Such flags are declared with declareOverride, the one
// place that marks them.
type overrideFlag struct{ p *bool }

// declareOverride declares a boolean flag that overrides a refusal, like
// fs.BoolVar (default false).
func declareOverride(fs *flag.FlagSet, p *bool, name, usage string) {
	fs.Var(overrideFlag{p}, name, usage)
}

// isOverride reports whether f overrides a refusal (declareOverride).
func isOverride(f *flag.Flag) bool {
	_, ok := f.Value.(overrideFlag)
	return ok
}

func (o overrideFlag) String() string {
	if o.p == nil { // the flag package's zero value, for its default check
		return "false"
	}
	return strconv.FormatBool(*o.p)
}

func (o overrideFlag) Set(s string) error {
	v, err := strconv.ParseBool(s)
	if err != nil {
		return errors.New("want true or false")
	}
	*o.p = v
	return nil
}

// IsBoolFlag lets --force stand without a value.
func (o overrideFlag) IsBoolFlag() bool { return true }

func (o overrideFlag) Get() any { return *o.p }
