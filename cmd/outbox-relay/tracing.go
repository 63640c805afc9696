package main

import (
	"context"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/publish"
)

// tracingShutdownTimeout bounds the flush of the spans still buffered at
// exit.
const tracingShutdownTimeout = 5 * time.Second

// startTracing builds the tracer of the relay's publish spans: an SDK
// tracer provider exporting over OTLP/HTTP, configured by the standard
// OTEL_* variables (OTEL_EXPORTER_OTLP_ENDPOINT or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, OTEL_EXPORTER_OTLP_HEADERS,
// OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG, OTEL_SERVICE_NAME,
// OTEL_RESOURCE_ATTRIBUTES, OTEL_BSP_*), which the SDK reads itself. The
// service name is outbox-relay unless OTEL_SERVICE_NAME says otherwise.
// The returned stop flushes the buffered spans (bounded by
// tracingShutdownTimeout) and must be called on exit.
func startTracing(ctx context.Context, log *zap.Logger) (trace.Tracer, func(), error) {
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("tracing: set up the OTLP/HTTP exporter (check OTEL_EXPORTER_OTLP_* variables): %w", err)
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(attribute.String("service.name", "outbox-relay"), attribute.String("service.version", version)),
		resource.WithFromEnv(), resource.WithTelemetrySDK())
	if err != nil {
		return nil, nil, fmt.Errorf("tracing: build the resource (check OTEL_RESOURCE_ATTRIBUTES): %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	stop := func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), tracingShutdownTimeout)
		defer cancel()
		if err := tp.Shutdown(sctx); err != nil {
			log.Warn("tracing: flushing the last spans failed; they are lost", zap.Error(err))
		}
	}
	return tp.Tracer(publish.TracerName), stop, nil
}
