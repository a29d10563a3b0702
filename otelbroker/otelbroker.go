// Package otelbroker reports what sqlxbroker subscriptions do as
// OpenTelemetry metrics and traces, and carries the publisher's trace
// context to the handlers through the table's Metadata column. An
// application that does not import it compiles none of OpenTelemetry: the
// sqlxbroker package only offers the hooks it uses (Broker.SetMetadataFunc,
// SubscribeParams.OnClaim and OnOutcome, Delivery.Metadata and ReadyAt).
//
// One Instrumentation serves any number of brokers and subscriptions:
//
//   - Instrument(b) makes b's Publish store the trace context of its ctx
//     (W3C traceparent and tracestate by default) in the Metadata column of
//     the tables that name one;
//   - Subscribe (or Wrap, for b.Subscribe) runs each delivery in a span of
//     kind Consumer named "process <table>", linked to the publisher's span
//     when the row carries its context, and counts claims and outcomes;
//   - RegisterRowGauge observes the tables' row counts (Broker.Counts) at
//     each collection.
//
// The instruments, all named under "sqlxbroker." and recorded with the
// attributes sqlxbroker.table and sqlxbroker.form:
//
//	sqlxbroker.claimed            counter   {delivery}  rows claimed and handed to handlers
//	sqlxbroker.succeeded          counter   {delivery}  completions recorded, by outcome:
//	sqlxbroker.retried            counter   {delivery}    returned for another attempt
//	sqlxbroker.dead               counter   {delivery}    moved to the dead state
//	sqlxbroker.snoozed            counter   {delivery}    snoozed (no attempt used)
//	sqlxbroker.released           counter   {delivery}    given back at stop
//	sqlxbroker.lease_lost         counter   {delivery}  completions that found the hold lost
//	sqlxbroker.completion_errors  counter   {delivery}  completions that failed otherwise
//	sqlxbroker.claim_errors       counter   {claim}     claims that failed
//	sqlxbroker.claim_conflicts    counter   {claim}     claims lost to a concurrent transaction (ErrConflict), made again
//	sqlxbroker.panics             counter   {delivery}  handler panics (also retried or dead)
//	sqlxbroker.handler.duration   histogram s           a handler's run
//	sqlxbroker.claim.duration     histogram s           one claim (a batch, or one row in row-lock)
//	sqlxbroker.start.delay        histogram s           ReadyAt to the handler's start
//	sqlxbroker.rows               gauge     {row}       rows by state (RegisterRowGauge), with sqlxbroker.state
//
// Each counter is what the subscription's Stats counts of the same name,
// summed over the subscriptions of one table and form. The counters are
// observable: a delivery adds to an atomic tally, which the meter reads at
// each collection. With the no-op tracer provider (trace/noop) no span is
// started. See docs/observability.md for the span's attributes and the
// measured cost. sqlxbroker.start.delay needs a ReadyAt column (without one nothing is
// recorded): Publish writes the publish time there, so on a row's first
// delivery it is the publish-to-start latency; a retry's ReadyAt is its
// retry time, so later attempts measure the wait past it.
package otelbroker

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sqlxbroker/sqlxbroker"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
)

// ScopeName is the instrumentation scope of the meter and tracer.
const ScopeName = "github.com/sqlxbroker/sqlxbroker/otelbroker"

// Attribute keys of the metrics and spans.
const (
	TableKey = attribute.Key("sqlxbroker.table") // the table's name as described
	FormKey  = attribute.Key("sqlxbroker.form")  // "row-lock", "lease" or "advisory"
	StateKey = attribute.Key("sqlxbroker.state") // sqlxbroker.rows: "ready", "scheduled", ...
)

// Options says where the instrumentation reports. The zero value uses the
// global providers and the W3C trace context.
type Options struct {
	// MeterProvider makes the meter; default otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
	// TracerProvider makes the tracer; default otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
	// Propagator writes the publisher's context into the Metadata column
	// and reads it back; default propagation.TraceContext{} (traceparent
	// and tracestate). Pass a composite with propagation.Baggage{} to
	// carry baggage too.
	Propagator propagation.TextMapPropagator
}

// Instrumentation holds the instruments; it is safe for concurrent use.
type Instrumentation struct {
	tracer trace.Tracer // nil with the no-op tracer provider
	prop   propagation.TextMapPropagator
	meter  metric.Meter

	counters                           [nCounters]metric.Int64ObservableCounter
	handlerTime, claimTime, startDelay metric.Float64Histogram
	rows                               metric.Int64ObservableGauge

	mu      sync.Mutex
	tallies map[[2]string]*tally // by table and form
}

// The counters. A delivery adds to a tally of its table's (an atomic
// add); the meter reads the tallies at each collection, so counting costs
// no SDK call per delivery.
const (
	cClaimed = iota
	cSucceeded
	cRetried
	cDead
	cSnoozed
	cReleased
	cLeaseLost
	cCompleteErrs
	cClaimErrs
	cConflicts
	cPanics
	nCounters
)

var counterDefs = [nCounters]struct{ name, unit, desc string }{
	cClaimed:      {"sqlxbroker.claimed", "{delivery}", "Rows claimed and handed to handlers."},
	cSucceeded:    {"sqlxbroker.succeeded", "{delivery}", "Deliveries completed as succeeded."},
	cRetried:      {"sqlxbroker.retried", "{delivery}", "Deliveries whose rows were returned for another attempt."},
	cDead:         {"sqlxbroker.dead", "{delivery}", "Deliveries whose rows were moved to the dead state."},
	cSnoozed:      {"sqlxbroker.snoozed", "{delivery}", "Deliveries whose rows were snoozed."},
	cReleased:     {"sqlxbroker.released", "{delivery}", "Deliveries whose rows were given back at stop."},
	cLeaseLost:    {"sqlxbroker.lease_lost", "{delivery}", "Completions that found the row's hold lost."},
	cCompleteErrs: {"sqlxbroker.completion_errors", "{delivery}", "Completions that failed."},
	cClaimErrs:    {"sqlxbroker.claim_errors", "{claim}", "Claims that failed."},
	cConflicts:    {"sqlxbroker.claim_conflicts", "{claim}", "Claims lost to a concurrent transaction and made again."},
	cPanics:       {"sqlxbroker.panics", "{delivery}", "Handler panics."},
}

// tally is the counts of one table and form, over every subscription
// wrapped for it.
type tally struct {
	attrs metric.ObserveOption
	n     [nCounters]atomic.Int64
}

// New makes the instruments of o's meter.
func New(o Options) (*Instrumentation, error) {
	if o.MeterProvider == nil {
		o.MeterProvider = otel.GetMeterProvider()
	}
	if o.TracerProvider == nil {
		o.TracerProvider = otel.GetTracerProvider()
	}
	if o.Propagator == nil {
		o.Propagator = propagation.TraceContext{}
	}
	i := &Instrumentation{tracer: o.TracerProvider.Tracer(ScopeName), prop: o.Propagator,
		meter: o.MeterProvider.Meter(ScopeName), tallies: map[[2]string]*tally{}}
	if _, ok := o.TracerProvider.(tracenoop.TracerProvider); ok {
		i.tracer = nil // no spans: a delivery starts none
	}
	var errs []error
	observables := make([]metric.Observable, 0, nCounters)
	for k, d := range counterDefs {
		c, err := i.meter.Int64ObservableCounter(d.name, metric.WithUnit(d.unit), metric.WithDescription(d.desc))
		errs = append(errs, err)
		i.counters[k] = c
		observables = append(observables, c)
	}
	hist := func(name, desc string, bounds ...float64) metric.Float64Histogram {
		h, err := i.meter.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(desc),
			metric.WithExplicitBucketBoundaries(bounds...))
		errs = append(errs, err)
		return h
	}
	short := []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}
	i.handlerTime = hist("sqlxbroker.handler.duration", "Time a handler ran.", short...)
	i.claimTime = hist("sqlxbroker.claim.duration", "Time of one claim.", short...)
	i.startDelay = hist("sqlxbroker.start.delay", "Time from a row's ReadyAt to its handler's start.",
		0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600)
	var err error
	i.rows, err = i.meter.Int64ObservableGauge("sqlxbroker.rows", metric.WithUnit("{row}"),
		metric.WithDescription("Rows of a table by state, as Broker.Counts reads them."))
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if _, err := i.meter.RegisterCallback(i.observe, observables...); err != nil {
		return nil, err
	}
	return i, nil
}

// observe reports every tally's counts.
func (i *Instrumentation) observe(_ context.Context, o metric.Observer) error {
	i.mu.Lock()
	defer i.mu.Unlock()
	for _, t := range i.tallies {
		for k := range t.n {
			o.ObserveInt64(i.counters[k], t.n[k].Load(), t.attrs)
		}
	}
	return nil
}

// tallyOf returns the tally of table t, made on first use.
func (i *Instrumentation) tallyOf(t sqlxbroker.Table) *tally {
	key := [2]string{t.Name, t.Form().String()}
	i.mu.Lock()
	defer i.mu.Unlock()
	if c := i.tallies[key]; c != nil {
		return c
	}
	c := &tally{attrs: metric.WithAttributeSet(attribute.NewSet(TableKey.String(key[0]), FormKey.String(key[1])))}
	i.tallies[key] = c
	return c
}

// Instrument makes b's Publish and PublishWith store the trace context of
// their ctx in the Metadata column of tables that name one (Table.Metadata),
// through b.SetMetadataFunc(i.Metadata). It replaces a MetadataFunc set
// before.
func (i *Instrumentation) Instrument(b *sqlxbroker.Broker) { b.SetMetadataFunc(i.Metadata) }

// Metadata returns what the propagator writes for ctx as Metadata text: one
// "key: value" line per field (for the W3C trace context,
// "traceparent: 00-<trace>-<span>-<flags>" and a tracestate line when
// there is one); "" when ctx carries nothing to propagate (no valid span).
func (i *Instrumentation) Metadata(ctx context.Context) string {
	var w metaWriter
	i.prop.Inject(ctx, &w)
	return w.b.String()
}

// Extract returns ctx with what the propagator reads from metadata text
// (Delivery.Metadata): for the W3C trace context, the publisher's span as
// a remote span context.
func (i *Instrumentation) Extract(ctx context.Context, metadata string) context.Context {
	if metadata == "" {
		return ctx
	}
	return i.prop.Extract(ctx, metaReader{s: metadata})
}

// Subscribe is b.Subscribe of h and p wrapped by Wrap.
func (i *Instrumentation) Subscribe(ctx context.Context, b *sqlxbroker.Broker, t sqlxbroker.Table, h sqlxbroker.Handler, p sqlxbroker.SubscribeParams) (*sqlxbroker.Subscription, error) {
	h, p = i.Wrap(t, h, p)
	return b.Subscribe(ctx, t, h, p)
}

// Wrap returns h and p instrumented for a subscription to t: the handler
// runs in a consumer span "process <table>" (status Error when it fails or
// panics) linked to the span whose context the row's Metadata column
// carries, and records its duration and start delay; p's OnClaim and
// OnOutcome count claims and outcomes, then call p's own. A nil h stays
// nil (Subscribe refuses it).
func (i *Instrumentation) Wrap(t sqlxbroker.Table, h sqlxbroker.Handler, p sqlxbroker.SubscribeParams) (sqlxbroker.Handler, sqlxbroker.SubscribeParams) {
	form := t.Form().String()
	w := &wrapped{i: i, h: h, onClaim: p.OnClaim, onOutcome: p.OnOutcome, name: "process " + t.Name, n: i.tallyOf(t),
		rec: []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(TableKey.String(t.Name), FormKey.String(form)))}}
	w.start = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer)}
	w.attrs = []attribute.KeyValue{
		attribute.String("messaging.system", "sqlxbroker"),
		attribute.String("messaging.operation.type", "process"),
		attribute.String("messaging.destination.name", t.Name),
		FormKey.String(form), {}, // the attempt's place
	}
	p.OnClaim, p.OnOutcome = w.claim, w.outcome
	if h == nil {
		return nil, p
	}
	return w.handle, p
}

// AttemptKey is the span attribute of the delivery's attempt.
const AttemptKey = attribute.Key("sqlxbroker.attempt")

// wrapped is one subscription's instrumentation: its attributes, built
// once, and the user's hooks it chains.
type wrapped struct {
	i         *Instrumentation
	h         sqlxbroker.Handler
	onClaim   func(sqlxbroker.ClaimInfo)
	onOutcome func(*sqlxbroker.Delivery, sqlxbroker.Outcome, error)
	name      string
	n         *tally
	rec       []metric.RecordOption
	start     []trace.SpanStartOption
	attrs     []attribute.KeyValue // of recorded spans: set after the start, so an unsampled one costs no copy
}

func (w *wrapped) handle(ctx context.Context, d *sqlxbroker.Delivery) error {
	i := w.i
	start := time.Now()
	if r, ok := d.ReadyAt(); ok {
		i.startDelay.Record(context.Background(), max(start.Sub(r), 0).Seconds(), w.rec...)
	}
	var span trace.Span
	if i.tracer != nil {
		ctx, span = i.tracer.Start(ctx, w.name, w.start...)
		if span.IsRecording() {
			// The attributes and the link are added to recorded spans
			// only: a span the sampler drops costs no copy of them and
			// no parse of the row's metadata.
			var kv [8]attribute.KeyValue
			attrs := append(kv[:0], w.attrs...)
			attrs[len(attrs)-1] = AttemptKey.Int(d.Attempt())
			span.SetAttributes(attrs...)
			if md := d.Metadata(); md != "" {
				if sc := trace.SpanContextFromContext(i.prop.Extract(context.Background(), metaReader{s: md})); sc.IsValid() {
					span.AddLink(trace.Link{SpanContext: sc})
				}
			}
		}
	}
	var err error
	returned := false
	// A panic is not recovered here: the engine recovers it, with its
	// stack, once the deferred call has run.
	defer func() { w.ended(start, span, err, returned) }()
	err = w.h(ctx, d)
	returned = true
	return err
}

// ended records a handler's end: its duration, a panic (the handler did
// not return), and its span's status (Error for an error or a panic) and
// end.
func (w *wrapped) ended(start time.Time, span trace.Span, err error, returned bool) {
	if !returned {
		w.n.n[cPanics].Add(1)
	}
	if span != nil {
		switch {
		case !returned:
			span.SetStatus(codes.Error, "handler panic")
		case err != nil && span.IsRecording():
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}
	w.i.handlerTime.Record(context.Background(), time.Since(start).Seconds(), w.rec...)
}

func (w *wrapped) claim(c sqlxbroker.ClaimInfo) {
	w.i.claimTime.Record(context.Background(), c.Duration.Seconds(), w.rec...)
	if c.Rows > 0 {
		w.n.n[cClaimed].Add(int64(c.Rows))
	}
	switch {
	case c.Err == nil:
	case errors.Is(c.Err, sqlxbroker.ErrConflict):
		w.n.n[cConflicts].Add(1)
	default:
		w.n.n[cClaimErrs].Add(1)
	}
	if w.onClaim != nil {
		w.onClaim(c)
	}
}

func (w *wrapped) outcome(d *sqlxbroker.Delivery, o sqlxbroker.Outcome, err error) {
	k := -1
	switch {
	case err == nil:
		switch o.Kind {
		case sqlxbroker.Succeeded:
			k = cSucceeded
		case sqlxbroker.Retry:
			k = cRetried
		case sqlxbroker.Dead:
			k = cDead
		case sqlxbroker.Released:
			k = cReleased
		case sqlxbroker.Snoozed:
			k = cSnoozed
		}
	case errors.Is(err, sqlxbroker.ErrLeaseLost):
		k = cLeaseLost
	default:
		k = cCompleteErrs
	}
	if k >= 0 {
		w.n.n[k].Add(1)
	}
	if w.onOutcome != nil {
		w.onOutcome(d, o, err)
	}
}

// RegisterRowGauge observes, at each collection, the row counts of each
// table of b (Broker.Counts, one COUNT per state the table can tell) as
// sqlxbroker.rows with the attributes sqlxbroker.table, sqlxbroker.form and
// sqlxbroker.state ("ready", "scheduled", "in-work" where the form can
// tell, "dead", "done" where the table has the column). A table that
// cannot be counted is left out of that collection and its error
// returned to the SDK (which reports it to otel.Handle). Unregister the
// registration to stop.
func (i *Instrumentation) RegisterRowGauge(b *sqlxbroker.Broker, tables ...sqlxbroker.Table) (metric.Registration, error) {
	if len(tables) == 0 {
		return nil, errors.New("otelbroker: RegisterRowGauge: no tables")
	}
	type gauged struct {
		t      sqlxbroker.Table
		states []sqlxbroker.State
		sets   []metric.ObserveOption
	}
	var gs []gauged
	for _, t := range tables {
		if err := t.Validate(); err != nil {
			return nil, err
		}
		g := gauged{t: t}
		for _, st := range statesOf(t) {
			g.states = append(g.states, st)
			g.sets = append(g.sets, metric.WithAttributeSet(attribute.NewSet(TableKey.String(t.Name),
				FormKey.String(t.Form().String()), StateKey.String(string(st)))))
		}
		gs = append(gs, g)
	}
	return i.meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		var errs []error
		for _, g := range gs {
			c, err := b.Counts(ctx, g.t)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			for k, st := range g.states {
				o.ObserveInt64(i.rows, c.Of(st), g.sets[k])
			}
		}
		return errors.Join(errs...)
	}, i.rows)
}

// statesOf lists the states t's description can tell.
func statesOf(t sqlxbroker.Table) []sqlxbroker.State {
	out := []sqlxbroker.State{sqlxbroker.StateReady}
	if t.ReadyAt != "" {
		out = append(out, sqlxbroker.StateScheduled)
	}
	if t.LockedUntil != "" {
		out = append(out, sqlxbroker.StateInWork)
	}
	if t.DeadAt != "" {
		out = append(out, sqlxbroker.StateDead)
	}
	if t.DoneAt != "" {
		out = append(out, sqlxbroker.StateDone)
	}
	return out
}

// metaWriter collects what a propagator injects as "key: value" lines.
type metaWriter struct{ b strings.Builder }

func (w *metaWriter) Get(string) string { return "" }
func (w *metaWriter) Keys() []string    { return nil }
func (w *metaWriter) Set(key, value string) {
	if w.b.Len() > 0 {
		w.b.WriteByte('\n')
	}
	w.b.WriteString(strings.ToLower(key))
	w.b.WriteString(": ")
	if strings.ContainsAny(value, "\r\n") { // a line per field
		value = strings.NewReplacer("\r", " ", "\n", " ").Replace(value)
	}
	w.b.WriteString(strings.TrimSpace(value))
}

// metaReader reads "key: value" lines (Metadata) for a propagator.
type metaReader struct{ s string }

func (r metaReader) Set(string, string) {}

func (r metaReader) Get(key string) string {
	s := r.s
	for s != "" {
		line := s
		if n := strings.IndexByte(s, '\n'); n >= 0 {
			line, s = s[:n], s[n+1:]
		} else {
			s = ""
		}
		k, v, ok := strings.Cut(line, ":")
		if ok && strings.EqualFold(strings.TrimSpace(k), key) {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

func (r metaReader) Keys() []string {
	var out []string
	for line := range strings.SplitSeq(r.s, "\n") {
		if k, _, ok := strings.Cut(line, ":"); ok {
			out = append(out, strings.TrimSpace(k))
		}
	}
	return out
}
