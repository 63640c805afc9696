package canal

import (
	"context"
	"log/slog"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// slogToZap forwards go-mysql's slog output to our zap logger at Debug: the
// syncer logs every connect, close and read error at Info or Error, and Run
// reports what matters (retries, fatal errors) itself, once, with context.
type slogToZap struct {
	log   *zap.Logger
	attrs []zap.Field
	group string
}

func newSlogLogger(log *zap.Logger) *slog.Logger {
	return slog.New(&slogToZap{log: log.Named("go-mysql")})
}

func (h *slogToZap) Enabled(_ context.Context, _ slog.Level) bool {
	return h.log.Core().Enabled(zapcore.DebugLevel)
}

func (h *slogToZap) Handle(_ context.Context, r slog.Record) error {
	fields := make([]zap.Field, 0, len(h.attrs)+r.NumAttrs()+1)
	fields = append(fields, h.attrs...)
	r.Attrs(func(a slog.Attr) bool {
		fields = append(fields, h.field(a))
		return true
	})
	fields = append(fields, zap.String("go_mysql_level", r.Level.String()))
	h.log.Debug(r.Message, fields...)
	return nil
}

func (h *slogToZap) field(a slog.Attr) zap.Field {
	key := a.Key
	if h.group != "" {
		key = h.group + "." + key
	}
	return zap.Any(key, a.Value.Resolve().Any())
}

func (h *slogToZap) WithAttrs(attrs []slog.Attr) slog.Handler {
	n := &slogToZap{log: h.log, group: h.group, attrs: append([]zap.Field(nil), h.attrs...)}
	for _, a := range attrs {
		n.attrs = append(n.attrs, h.field(a))
	}
	return n
}

func (h *slogToZap) WithGroup(name string) slog.Handler {
	g := name
	if h.group != "" {
		g = h.group + "." + name
	}
	return &slogToZap{log: h.log, attrs: h.attrs, group: g}
}
