package main

import (
	"io"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// newLogger returns a zap logger writing to w: JSON lines (the default, for
// log collectors) or the console format (--log-format console, for people).
func newLogger(format, level string, w io.Writer) (*zap.Logger, error) {
	lvl, err := zapcore.ParseLevel(level)
	if err != nil {
		return nil, usagef("--log-level %q: want debug, info, warn or error", level)
	}
	var enc zapcore.Encoder
	switch format {
	case "json":
		cfg := zap.NewProductionEncoderConfig()
		cfg.TimeKey = "time"
		cfg.EncodeTime = zapcore.RFC3339NanoTimeEncoder
		enc = zapcore.NewJSONEncoder(cfg)
	case "console":
		cfg := zap.NewDevelopmentEncoderConfig()
		cfg.EncodeTime = zapcore.TimeEncoderOfLayout("2006-01-02T15:04:05.000Z07:00")
		enc = zapcore.NewConsoleEncoder(cfg)
	default:
		return nil, usagef("--log-format %q: want json or console", format)
	}
	w = flagNamesWriter{w}
	core := zapcore.NewCore(enc, zapcore.Lock(zapcore.AddSync(w)), lvl)
	return zap.New(core, zap.ErrorOutput(zapcore.Lock(zapcore.AddSync(w)))), nil
}

// flagNamesWriter passes each log entry (one Write) through flagNames: the
// library's messages name Config fields, the operator reads flags.
type flagNamesWriter struct{ w io.Writer }

func (f flagNamesWriter) Write(p []byte) (int, error) {
	if !fieldName.Match(p) {
		return f.w.Write(p)
	}
	if _, err := io.WriteString(f.w, flagNames(string(p))); err != nil {
		return 0, err
	}
	return len(p), nil
}

// logDefaults returns the log format and level command uses. run and bench
// log JSON at the flags' values (a log collector reads them); the operator
// commands, when stderr is a terminal, log in console form at warn, so
// their log does not interleave JSON with their text, unless --log-format or
// --log-level was given (given: by the command line, the environment or
// the config file), which wins.
func logDefaults(command string, terminal bool, given map[string]bool, format, level string) (string, string) {
	if command == "run" || command == "bench" || !terminal {
		return format, level
	}
	if !given["log-format"] {
		format = "console"
	}
	if !given["log-level"] {
		level = "warn"
	}
	return format, level
}
