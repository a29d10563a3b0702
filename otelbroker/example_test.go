package otelbroker_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/dialects/sqlite"
	"github.com/sqlxbroker/sqlxbroker/otelbroker"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// Publish inside a span, run the deliveries in consumer spans linked to
// it, and read the counters. An application passes its own providers (an
// OTLP exporter, a Prometheus reader) or none, for the global ones.
func Example() {
	dir, _ := os.MkdirTemp("", "otelbroker-")
	defer os.RemoveAll(dir)
	db, err := sqlite.Open(filepath.Join(dir, "app.db"))
	if err != nil {
		panic(err)
	}
	defer db.Close()
	ctx := context.Background()
	b, _ := sqlxbroker.Open(db)
	defer b.Close(ctx)

	reader := sdkmetric.NewManualReader()
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	inst, err := otelbroker.New(otelbroker.Options{
		MeterProvider:  sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)),
		TracerProvider: tp,
	})
	if err != nil {
		panic(err)
	}
	inst.Instrument(b) // Publish stores the trace context in the Metadata column

	// ReadyAt gives sqlxbroker.start.delay; Metadata carries the context.
	jobs := sqlxbroker.Table{Name: "jobs", LockedUntil: "locked_until", ReadyAt: "ready_at", Metadata: "trace"}
	if err := b.CreateTable(ctx, jobs, [2]string{"email", "text"}); err != nil {
		panic(err)
	}
	pctx, publish := tp.Tracer("app").Start(ctx, "signup")
	if err := b.Publish(pctx, db, jobs, map[string]any{"email": "a@example.com"}); err != nil {
		panic(err)
	}
	publish.End()

	done := make(chan struct{})
	sub, err := inst.Subscribe(ctx, b, jobs, func(ctx context.Context, d *sqlxbroker.Delivery) error {
		defer close(done)
		// ctx carries the delivery's span: the handler's own spans are its children.
		fmt.Println("in a span:", trace.SpanFromContext(ctx).SpanContext().IsValid())
		return nil
	}, sqlxbroker.SubscribeParams{})
	if err != nil {
		panic(err)
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		panic("not delivered")
	}
	_ = sub.Stop(ctx)

	for _, s := range spans.GetSpans() {
		if s.Name == "process jobs" {
			fmt.Println(s.Name, s.SpanKind, "linked to the publisher:", s.Links[0].SpanContext.SpanID() == publish.SpanContext().SpanID())
		}
	}
	var rm metricdata.ResourceMetrics
	_ = reader.Collect(ctx, &rm)
	for _, m := range rm.ScopeMetrics[0].Metrics {
		if s, ok := m.Data.(metricdata.Sum[int64]); ok && (m.Name == "sqlxbroker.claimed" || m.Name == "sqlxbroker.succeeded") {
			fmt.Println(m.Name, s.DataPoints[0].Value)
		}
	}
	// Unordered output:
	// in a span: true
	// process jobs consumer linked to the publisher: true
	// sqlxbroker.claimed 1
	// sqlxbroker.succeeded 1
}
