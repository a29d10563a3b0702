package otelbroker_test

import (
	"context"
	"log/slog"
	"path/filepath"
	"testing"

	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/dialects/sqlite"
	"github.com/sqlxbroker/sqlxbroker/otelbroker"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
)

// BenchmarkHandle times the instrumented handler around a handler that
// does nothing, on a delivery claimed from SQLite (its row carries a
// trace context and a ReadyAt), with no-op providers, the SDK's metrics
// alone, and the SDK's metrics and tracer (spans recorded or not).
func BenchmarkHandle(b *testing.B) {
	db, err := sqlite.Open(filepath.Join(b.TempDir(), "bench.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	br, _ := sqlxbroker.Open(db)
	defer br.Close(context.Background())
	tb := sqlxbroker.Table{Name: "otel_handle", LockedUntil: "locked_until", ReadyAt: "ready_at", Metadata: "meta"}
	if err := br.CreateTable(context.Background(), tb, [2]string{"n", "bigint"}); err != nil {
		b.Fatal(err)
	}
	sdk := sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter()))
	pctx, span := sdk.Tracer("bench").Start(context.Background(), "publish")
	inst, _ := otelbroker.New(otelbroker.Options{MeterProvider: metricnoop.NewMeterProvider(), TracerProvider: sdk})
	inst.Instrument(br)
	if err := br.Publish(pctx, db, tb, map[string]any{"n": 1}); err != nil {
		b.Fatal(err)
	}
	span.End()
	got := make(chan *sqlxbroker.Delivery, 1)
	s, err := br.Subscribe(context.Background(), tb, func(_ context.Context, d *sqlxbroker.Delivery) error {
		got <- d
		return nil
	}, sqlxbroker.SubscribeParams{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	d := <-got
	_ = s.Stop(context.Background())
	if d.Metadata() == "" {
		b.Fatal("no metadata")
	}
	nothing := func(context.Context, *sqlxbroker.Delivery) error { return nil }
	for _, c := range []struct {
		name string
		o    otelbroker.Options
	}{
		{"noop", otelbroker.Options{MeterProvider: metricnoop.NewMeterProvider(), TracerProvider: tracenoop.NewTracerProvider()}},
		{"metrics", otelbroker.Options{MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader())),
			TracerProvider: tracenoop.NewTracerProvider()}},
		{"unsampled", otelbroker.Options{MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader())),
			TracerProvider: sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample()), sdktrace.WithBatcher(tracetest.NewNoopExporter()))}},
		{"sampled", otelbroker.Options{MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader())),
			TracerProvider: sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter()))}},
	} {
		b.Run(c.name, func(b *testing.B) {
			inst, err := otelbroker.New(c.o)
			if err != nil {
				b.Fatal(err)
			}
			h, _ := inst.Wrap(tb, nothing, sqlxbroker.SubscribeParams{})
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				_ = h(ctx, d)
			}
			_ = trace.SpanFromContext(ctx)
		})
	}
}
