package main

import (
	"context"
	"fmt"

	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/internal/bench"
	"github.com/sqlxbroker/sqlxbroker/otelbroker"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
)

// otelRun is the OpenTelemetry SDK set up for one bench run: a meter
// provider whose manual reader is read once, at the end, and a tracer
// provider that samples every span and hands them in batches to an
// exporter that drops them, so the run pays what the SDK itself costs.
type otelRun struct {
	reader *sdkmetric.ManualReader
	mp     *sdkmetric.MeterProvider
	tp     *sdktrace.TracerProvider
	inst   *otelbroker.Instrumentation
}

// newOtelRun sets up the SDK; sample is the share of deliveries whose
// span is recorded (1: all, 0: none; the tracer is asked for every span).
// Without traces, the instrumentation has the no-op tracer provider: the
// cost of the metrics alone.
func newOtelRun(sample float64, traces bool) (*otelRun, error) {
	o := &otelRun{reader: sdkmetric.NewManualReader()}
	o.mp = sdkmetric.NewMeterProvider(sdkmetric.WithReader(o.reader))
	sampler := sdktrace.AlwaysSample()
	if sample < 1 {
		sampler = sdktrace.ParentBased(sdktrace.TraceIDRatioBased(sample))
	}
	o.tp = sdktrace.NewTracerProvider(sdktrace.WithSampler(sampler),
		sdktrace.WithBatcher(tracetest.NewNoopExporter()))
	opts := otelbroker.Options{MeterProvider: o.mp, TracerProvider: o.tp}
	if !traces {
		opts.TracerProvider = tracenoop.NewTracerProvider()
	}
	inst, err := otelbroker.New(opts)
	if err != nil {
		return nil, err
	}
	o.inst = inst
	return o, nil
}

// adapter instruments a bench run with otelbroker: the fill publishes in
// spans of its own, whose context the rows carry.
func (o *otelRun) adapter() *bench.Adapter {
	tracer := o.tp.Tracer("sqlxbroker bench")
	return &bench.Adapter{
		Name:   "otelbroker",
		Broker: o.inst.Instrument,
		PublishContext: func(ctx context.Context) (context.Context, func()) {
			ctx, span := tracer.Start(ctx, "publish")
			return ctx, func() { span.End() }
		},
		Wrap: o.inst.Wrap,
	}
}

// claimed reads the sqlxbroker.claimed counter's total, and shuts the
// providers down.
func (o *otelRun) close() (int64, error) {
	var rm metricdata.ResourceMetrics
	err := o.reader.Collect(context.Background(), &rm)
	var n int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if s, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == "sqlxbroker.claimed" {
				for _, dp := range s.DataPoints {
					n += dp.Value
				}
			}
		}
	}
	if serr := o.tp.Shutdown(context.Background()); err == nil {
		err = serr
	}
	if serr := o.mp.Shutdown(context.Background()); err == nil {
		err = serr
	}
	return n, err
}

// runOtel runs c with the otelbroker adapter and checks that its metrics
// counted every delivery.
func runOtel(c bench.Config, sample float64, traces bool) (*bench.Result, error) {
	o, err := newOtelRun(sample, traces)
	if err != nil {
		return nil, err
	}
	c.Adapter = o.adapter()
	r, err := bench.Run(context.Background(), c)
	claimed, cerr := o.close()
	if err != nil {
		return nil, err
	}
	if cerr != nil {
		return nil, fmt.Errorf("bench: OpenTelemetry: %w", cerr)
	}
	if r.Mode == bench.Drain && claimed < r.Deliveries {
		return nil, fmt.Errorf("bench: sqlxbroker.claimed reads %d after %d deliveries", claimed, r.Deliveries)
	}
	return r, nil
}

// sameRows is the adapter of a comparison's run without otelbroker: its
// rows carry metadata of the size otelbroker's do (a W3C traceparent), so
// the two runs drain the same rows and differ by the instrumentation alone.
func sameRows() *bench.Adapter {
	const traceparent = "traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	return &bench.Adapter{Broker: func(b *sqlxbroker.Broker) {
		b.SetMetadataFunc(func(context.Context) string { return traceparent })
	}}
}

// compareLine says what the adapter cost over rounds of runs without
// (base) and with it: the median rates and CPU per delivery (medians: on a
// shared machine one run in several can be far off).
func compareLine(base, with []bench.Result) string {
	rate := func(r bench.Result) float64 { return r.PerSecond }
	cpu := func(r bench.Result) float64 { return r.CPUMicros }
	b, w := medianOf(base, rate), medianOf(with, rate)
	bc, wc := medianOf(base, cpu), medianOf(with, cpu)
	return fmt.Sprintf("%s at %d, %d round(s), medians: without %.0f/s, with otelbroker %.0f/s: %.3f of the rate (%+.1f%%); CPU %.1f vs %.1f us/delivery (%+.1f%%)",
		base[0].Form, base[0].Concurrency, len(base), b, w, w/b, (w/b-1)*100, bc, wc, (wc/bc-1)*100)
}
