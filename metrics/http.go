package metrics

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
)

// Bounds of the HTTP server. Scrapes and probes are small and local; these
// only keep a stuck or slow client from holding a connection for ever.
const (
	readHeaderTimeout = 5 * time.Second
	writeTimeout      = 30 * time.Second // above Prometheus's default 10 s scrape timeout
	idleTimeout       = 60 * time.Second
	gatherTimeout     = 20 * time.Second // promhttp gives up and answers 503
	shutdownTimeout   = 5 * time.Second  // in-flight requests at shutdown
)

// Listen binds addr (host:port, e.g. ":9464" or "127.0.0.1:0") for
// ServeListener. Binding first, on the caller's goroutine, makes a busy or
// bad address an error at start; the error names the address. The listener's
// Addr() is the bound address (the port chosen for ":0").
func Listen(addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics: listen on %q: %w", addr, err)
	}
	return ln, nil
}

// Serve is Listen followed by ServeListener: it serves the relay's HTTP
// endpoints on addr until ctx ends. A caller that runs Serve on a goroutine
// learns about a bind failure only from its return value; call Listen first
// to fail at start.
func Serve(ctx context.Context, addr string, reg prometheus.Gatherer, ready func() error, log *zap.Logger) error {
	ln, err := Listen(addr)
	if err != nil {
		return err
	}
	return ServeListener(ctx, ln, reg, ready, log)
}

// ServeListener serves Handler(reg, ready, log) on ln, which it owns and
// closes, until ctx ends or serving fails. When ctx ends it stops accepting,
// gives requests in progress up to 5 s to finish, and returns nil. Otherwise
// it returns the (wrapped) error that stopped the server.
func ServeListener(ctx context.Context, ln net.Listener, reg prometheus.Gatherer, ready func() error, log *zap.Logger) error {
	if log == nil {
		log = zap.NewNop()
	}
	srv := &http.Server{
		Handler:           Handler(reg, ready, log),
		ReadHeaderTimeout: readHeaderTimeout,
		WriteTimeout:      writeTimeout,
		IdleTimeout:       idleTimeout,
		ErrorLog:          zap.NewStdLog(log.Named("http")),
	}
	addr := ln.Addr().String()
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	log.Info("serving /metrics, /healthz and /readyz", zap.String("addr", addr))

	select {
	case err := <-errc:
		// Serve returned on its own: the listener failed.
		return fmt.Errorf("metrics: serve on %s: %w", addr, err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
	defer cancel()
	err := srv.Shutdown(sctx)
	if serr := <-errc; serr != nil && !errors.Is(serr, http.ErrServerClosed) {
		return fmt.Errorf("metrics: serve on %s: %w", addr, serr)
	}
	if err != nil {
		// Requests still running after the grace period: cut them.
		_ = srv.Close()
		return fmt.Errorf("metrics: shut down the server on %s: %w", addr, err)
	}
	return nil
}

// Handler returns the relay's HTTP endpoints:
//
//	GET /metrics  the metrics of reg, in the exposition format the scraper asks for
//	GET /healthz  200 "ok": the process is alive and serving (liveness)
//	GET /readyz   200 "ready" when ready() returns nil or a ReadyNote (then "ready: " and the note),
//	              else 503 with the error's text (readiness)
//
// A nil ready means always ready. ready is called on every /readyz request
// and must return quickly (read state, do no I/O). Other paths are 404.
func Handler(reg prometheus.Gatherer, ready func() error, log *zap.Logger) http.Handler {
	if log == nil {
		log = zap.NewNop()
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		ErrorLog:            promErrorLog{log.Named("metrics")},
		ErrorHandling:       promhttp.ContinueOnError,
		MaxRequestsInFlight: 4,
		Timeout:             gatherTimeout,
	}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeText(w, http.StatusOK, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if ready != nil {
			var note ReadyNote
			if err := ready(); errors.As(err, &note) {
				writeText(w, http.StatusOK, "ready: "+string(note))
				return
			} else if err != nil {
				writeText(w, http.StatusServiceUnavailable, "not ready: "+err.Error())
				return
			}
		}
		writeText(w, http.StatusOK, "ready")
	})
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		writeText(w, http.StatusOK, "outbox-relay: /metrics /healthz /readyz")
	})
	return mux
}

// ReadyNote, returned by Handler's ready function, means ready, with a
// note for /readyz's answer (e.g. the broker node in use).
type ReadyNote string

func (n ReadyNote) Error() string { return string(n) }

func writeText(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_, _ = io.WriteString(w, msg+"\n")
}

// promErrorLog adapts zap to promhttp's Logger: gathering errors are logged
// (the scrape still gets the metrics that could be gathered).
type promErrorLog struct{ log *zap.Logger }

func (l promErrorLog) Println(v ...any) { l.log.Warn(fmt.Sprint(v...)) }
