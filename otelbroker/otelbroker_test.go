package otelbroker_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/conformance/provision"
	"github.com/sqlxbroker/sqlxbroker/core"
	_ "github.com/sqlxbroker/sqlxbroker/dialects/mysql"
	_ "github.com/sqlxbroker/sqlxbroker/dialects/postgres"
	"github.com/sqlxbroker/sqlxbroker/dialects/sqlite"
	"github.com/sqlxbroker/sqlxbroker/internal/testreport"
	"github.com/sqlxbroker/sqlxbroker/otelbroker"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// database is one database the tests run on.
type database struct {
	name string
	open func(t *testing.T) *sqlx.DB
}

// databases are SQLite (a file in a temporary directory) always, and
// PostgreSQL and MariaDB from their DSNs (provision: a skip without one, a
// failure with SQLXBROKER_REQUIRE_DB=1).
var databases = []database{
	{"sqlite", func(t *testing.T) *sqlx.DB {
		testreport.Tested(t, "SQLite", "a file in a temporary directory")
		db, err := sqlite.Open(filepath.Join(t.TempDir(), "otel.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		return db
	}},
	{"postgres", func(t *testing.T) *sqlx.DB { return openServer(t, provision.Postgres) }},
	{"mariadb", func(t *testing.T) *sqlx.DB { return openServer(t, provision.MariaDB) }},
}

func openServer(t *testing.T, d provision.Database) *sqlx.DB {
	dsn := d.Get(t)
	db, err := sqlx.Open(d.Driver, dsn)
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(40)
	t.Cleanup(func() { db.Close() })
	return db
}

// freshTable creates a table for form f with ReadyAt, DeadAt and Metadata
// columns, dropped when the test ends.
func freshTable(t *testing.T, b *sqlxbroker.Broker, f sqlxbroker.Form) sqlxbroker.Table {
	t.Helper()
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	tb := sqlxbroker.Table{Name: "otel_" + hex.EncodeToString(rnd[:]), ReadyAt: "ready_at", DeadAt: "dead_at", Metadata: "meta"}
	switch f {
	case sqlxbroker.Lease:
		tb.LockedUntil = "locked_until"
	case sqlxbroker.Advisory:
		tb.AdvisoryLock = "k-{acct}"
	}
	if err := b.CreateTable(context.Background(), tb, [2]string{"n", "bigint"}, [2]string{"acct", "text"}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = b.DB().Exec("DROP TABLE " + b.Dialect().QuoteIdent(tb.Name)) })
	return tb
}

type job struct {
	N    int64  `db:"n"`
	Acct string `db:"acct"`
}

// TestDrain publishes 1,000 rows in two publisher spans and drains them:
// 100 rows fail once (retried, then succeed), 10 are Permanent (dead). The
// exported metrics must read exactly what the subscription did (claimed
// 1,100 = 1,000 first deliveries + 100 retries; succeeded 990; retried
// 100; dead 10), the histograms count every delivery and every claim, the
// row gauge reads the table before and after, and each delivery's span is
// linked to the span its row was published in.
func TestDrain(t *testing.T) {
	for _, d := range databases {
		t.Run(d.name, func(t *testing.T) {
			db := d.open(t)
			b, err := sqlxbroker.Open(db)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = b.Close(context.Background()) })
			for _, f := range core.FormsOf(b.Dialect()) {
				t.Run(f.String(), func(t *testing.T) { drain(t, b, f) })
			}
		})
	}
}

// The drain's arithmetic.
const (
	rows      = 1000
	failOnce  = 100 // n%10 == 0
	permanent = 10  // n%100 == 5
)

func drain(t *testing.T, b *sqlxbroker.Broker, f sqlxbroker.Form) {
	ctx := context.Background()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	inst, err := otelbroker.New(otelbroker.Options{MeterProvider: mp, TracerProvider: tp})
	if err != nil {
		t.Fatal(err)
	}
	inst.Instrument(b)
	defer b.SetMetadataFunc(nil)
	tb := freshTable(t, b, f)
	reg, err := inst.RegisterRowGauge(b, tb)
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Unregister()

	// Two publisher spans, half the rows each.
	var pubs [2]trace.SpanContext
	for half := range 2 {
		pctx, span := tp.Tracer("test").Start(ctx, fmt.Sprintf("publish %d", half))
		msgs := make([]any, 0, rows/2)
		for n := half * rows / 2; n < (half+1)*rows/2; n++ {
			msgs = append(msgs, job{N: int64(n), Acct: fmt.Sprint(n)})
		}
		if err := b.Publish(pctx, b.DB(), tb, msgs...); err != nil {
			t.Fatal(err)
		}
		pubs[half] = span.SpanContext()
		span.End()
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	if got := gauge(rm, string(sqlxbroker.StateReady)); got != rows {
		t.Errorf("sqlxbroker.rows{state=ready} before the drain: %d, want %d", got, rows)
	}

	var claims, claimedRows, outcomes atomic.Int64
	var mu sync.Mutex
	failed := map[int64]bool{}
	h := func(ctx context.Context, d *sqlxbroker.Delivery) error {
		var j job
		if err := d.Scan(&j); err != nil {
			return err
		}
		trace.SpanFromContext(ctx).SetAttributes(attribute.Int64("test.n", j.N))
		switch {
		case j.N%100 == 5:
			return sqlxbroker.Permanent(errors.New("permanent"))
		case j.N%10 == 0:
			mu.Lock()
			defer mu.Unlock()
			if !failed[j.N] {
				failed[j.N] = true
				return errors.New("fails once")
			}
		}
		return nil
	}
	p := sqlxbroker.SubscribeParams{Concurrency: 16, MinPollInterval: 2 * time.Millisecond, PollInterval: 50 * time.Millisecond,
		RetryDelay: func(int, error) time.Duration { return 0 }, Logger: slog.New(slog.DiscardHandler),
		OnClaim:   func(c sqlxbroker.ClaimInfo) { claims.Add(1); claimedRows.Add(int64(c.Rows)) },
		OnOutcome: func(*sqlxbroker.Delivery, sqlxbroker.Outcome, error) { outcomes.Add(1) }}
	s, err := inst.Subscribe(ctx, b, tb, h, p)
	if err != nil {
		t.Fatal(err)
	}
	const want = rows + failOnce
	deadline := time.Now().Add(2 * time.Minute)
	for outcomes.Load() < want {
		if time.Now().After(deadline) {
			t.Fatalf("after 2 minutes, %d outcomes of %d; stats %+v", outcomes.Load(), want, s.Stats())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := s.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	st := s.Stats()
	if st.Claimed != want || st.Succeeded != rows-permanent || st.Retried != failOnce || st.Dead != permanent {
		t.Fatalf("stats %+v, want claimed %d, succeeded %d, retried %d, dead %d", st, want, rows-permanent, failOnce, permanent)
	}

	rm = metricdata.ResourceMetrics{}
	if err := reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	attrs := attribute.NewSet(otelbroker.TableKey.String(tb.Name), otelbroker.FormKey.String(f.String()))
	for name, w := range map[string]int64{
		"sqlxbroker.claimed": want, "sqlxbroker.succeeded": rows - permanent, "sqlxbroker.retried": failOnce,
		"sqlxbroker.dead": permanent, "sqlxbroker.snoozed": 0, "sqlxbroker.released": 0, "sqlxbroker.lease_lost": 0,
		"sqlxbroker.completion_errors": 0, "sqlxbroker.claim_errors": st.ClaimErrors, "sqlxbroker.claim_conflicts": st.Conflicts,
		"sqlxbroker.panics": 0,
	} {
		if got := sum(t, rm, name, attrs); got != w {
			t.Errorf("%s = %d, want %d", name, got, w)
		}
	}
	for name, w := range map[string]uint64{
		"sqlxbroker.handler.duration": want, "sqlxbroker.start.delay": want, "sqlxbroker.claim.duration": uint64(claims.Load()),
	} {
		if got := histCount(t, rm, name, attrs); got != w {
			t.Errorf("%s: %d recorded, want %d", name, got, w)
		}
	}
	if claimedRows.Load() != want {
		t.Errorf("OnClaim's rows sum to %d, want %d", claimedRows.Load(), want)
	}
	if got := gauge(rm, string(sqlxbroker.StateReady)); got != 0 {
		t.Errorf("sqlxbroker.rows{state=ready} after the drain: %d, want 0", got)
	}
	if got := gauge(rm, string(sqlxbroker.StateDead)); got != permanent {
		t.Errorf("sqlxbroker.rows{state=dead} after the drain: %d, want %d", got, permanent)
	}

	// Spans: one per delivery, each linked to its row's publisher span.
	var process, errored int
	for _, sp := range spans.GetSpans() {
		if sp.Name != "process "+tb.Name {
			continue
		}
		process++
		if sp.SpanKind != trace.SpanKindConsumer {
			t.Errorf("span %s: kind %v, want consumer", sp.Name, sp.SpanKind)
		}
		if sp.Status.Code == codes.Error {
			errored++
		}
		n := int64(-1)
		for _, a := range sp.Attributes {
			if a.Key == "test.n" {
				n = a.Value.AsInt64()
			}
		}
		if n < 0 {
			t.Fatalf("span without the handler's attribute (the handler's ctx does not carry the span): %+v", sp.Attributes)
		}
		pub := pubs[n/(rows/2)]
		if len(sp.Links) != 1 || sp.Links[0].SpanContext.TraceID() != pub.TraceID() || sp.Links[0].SpanContext.SpanID() != pub.SpanID() {
			t.Fatalf("row %d: span links %+v, want one to the publisher span %s/%s", n, sp.Links, pub.TraceID(), pub.SpanID())
		}
		if sp.Parent.IsValid() {
			t.Errorf("row %d: the span has parent %v; want a root span linked to the publisher", n, sp.Parent)
		}
	}
	if process != want || errored != failOnce+permanent {
		t.Errorf("%d process spans, %d with status error; want %d and %d", process, errored, want, failOnce+permanent)
	}
}

// sum reads the counter name's data point with attrs (0 when none: a
// counter never added to exports nothing).
func sum(t *testing.T, rm metricdata.ResourceMetrics, name string, attrs attribute.Set) int64 {
	t.Helper()
	m, ok := find(rm, name)
	if !ok {
		return 0
	}
	s, ok := m.Data.(metricdata.Sum[int64])
	if !ok || !s.IsMonotonic {
		t.Fatalf("%s is a %T, want a monotonic int64 sum", name, m.Data)
	}
	var out int64
	for _, dp := range s.DataPoints {
		if !dp.Attributes.Equals(&attrs) {
			t.Errorf("%s: data point with attributes %v, want %v", name, dp.Attributes.ToSlice(), attrs.ToSlice())
			continue
		}
		out += dp.Value
	}
	return out
}

func histCount(t *testing.T, rm metricdata.ResourceMetrics, name string, attrs attribute.Set) uint64 {
	t.Helper()
	m, ok := find(rm, name)
	if !ok {
		return 0
	}
	h, ok := m.Data.(metricdata.Histogram[float64])
	if !ok || m.Unit != "s" {
		t.Fatalf("%s is a %T in %q, want a float64 histogram in s", name, m.Data, m.Unit)
	}
	var out uint64
	for _, dp := range h.DataPoints {
		if !dp.Attributes.Equals(&attrs) {
			t.Errorf("%s: data point with attributes %v, want %v", name, dp.Attributes.ToSlice(), attrs.ToSlice())
			continue
		}
		var inBuckets uint64
		for _, c := range dp.BucketCounts {
			inBuckets += c
		}
		if inBuckets != dp.Count {
			t.Errorf("%s: buckets hold %d, count %d", name, inBuckets, dp.Count)
		}
		out += dp.Count
	}
	return out
}

// gauge reads sqlxbroker.rows for state; -1 when it has no such point.
func gauge(rm metricdata.ResourceMetrics, state string) int64 {
	m, ok := find(rm, "sqlxbroker.rows")
	if !ok {
		return -1
	}
	g, _ := m.Data.(metricdata.Gauge[int64])
	for _, dp := range g.DataPoints {
		if v, _ := dp.Attributes.Value(otelbroker.StateKey); v.AsString() == state {
			return dp.Value
		}
	}
	return -1
}

func find(rm metricdata.ResourceMetrics, name string) (metricdata.Metrics, bool) {
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == name {
				return m, true
			}
		}
	}
	return metricdata.Metrics{}, false
}

// TestPanic: a handler that panics is counted in sqlxbroker.panics and
// retried, its span ends with status Error, and the engine still logs the
// panic with the handler's own stack (the adapter does not recover it).
func TestPanic(t *testing.T) {
	db := databases[0].open(t)
	b, err := sqlxbroker.Open(db)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close(context.Background())
	reader := sdkmetric.NewManualReader()
	spans := tracetest.NewInMemoryExporter()
	inst, err := otelbroker.New(otelbroker.Options{MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)),
		TracerProvider: sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))})
	if err != nil {
		t.Fatal(err)
	}
	tb := freshTable(t, b, sqlxbroker.Lease)
	if err := b.Publish(context.Background(), db, tb, job{N: 1, Acct: "1"}); err != nil {
		t.Fatal(err)
	}
	var stack []byte
	var once sync.Once
	done := make(chan struct{})
	p := sqlxbroker.SubscribeParams{RetryDelay: func(int, error) time.Duration { return 0 }, Logger: slog.New(slog.DiscardHandler),
		OnOutcome: func(_ *sqlxbroker.Delivery, o sqlxbroker.Outcome, _ error) {
			var pe *sqlxbroker.PanicError
			if errors.As(o.Err, &pe) {
				stack = pe.Stack
			}
			if o.Kind == sqlxbroker.Succeeded {
				close(done)
			}
		}}
	s, err := inst.Subscribe(context.Background(), b, tb, func(context.Context, *sqlxbroker.Delivery) error {
		first := false
		once.Do(func() { first = true })
		if first {
			panicking()
		}
		return nil
	}, p)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("not delivered twice: %+v", s.Stats())
	}
	if err := s.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(stack), "panicking") {
		t.Errorf("the panic's stack lacks the handler's frame:\n%s", stack)
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	attrs := attribute.NewSet(otelbroker.TableKey.String(tb.Name), otelbroker.FormKey.String("lease"))
	for name, w := range map[string]int64{"sqlxbroker.panics": 1, "sqlxbroker.retried": 1, "sqlxbroker.succeeded": 1, "sqlxbroker.claimed": 2} {
		if got := sum(t, rm, name, attrs); got != w {
			t.Errorf("%s = %d, want %d", name, got, w)
		}
	}
	var statuses []string
	for _, sp := range spans.GetSpans() {
		statuses = append(statuses, sp.Status.Code.String()+" "+sp.Status.Description)
	}
	slices.Sort(statuses)
	if want := []string{"Error handler panic", "Unset "}; !slices.Equal(statuses, want) {
		t.Errorf("span statuses %q, want %q", statuses, want)
	}
}

//go:noinline
func panicking() { panic("boom") }

// TestClaimConflictsCountedApart: a claim that failed with ErrConflict
// (lost to a concurrent transaction and made again; Stats.Conflicts) is
// counted in sqlxbroker.claim_conflicts, not in sqlxbroker.claim_errors,
// as Stats counts it; other errors count claim_errors; the user's own
// OnClaim still sees every call.
func TestClaimConflictsCountedApart(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	inst, err := otelbroker.New(otelbroker.Options{MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))})
	if err != nil {
		t.Fatal(err)
	}
	tb := sqlxbroker.Table{Name: "conflicts", LockedUntil: "locked_until"}
	var seen int
	_, p := inst.Wrap(tb, nil, sqlxbroker.SubscribeParams{OnClaim: func(sqlxbroker.ClaimInfo) { seen++ }})
	p.OnClaim(sqlxbroker.ClaimInfo{Rows: 3, Asked: 8})
	p.OnClaim(sqlxbroker.ClaimInfo{Asked: 8, Err: fmt.Errorf("claim: %w", sqlxbroker.ErrConflict)})
	p.OnClaim(sqlxbroker.ClaimInfo{Asked: 8, Err: fmt.Errorf("claim: %w", sqlxbroker.ErrConflict)})
	p.OnClaim(sqlxbroker.ClaimInfo{Asked: 8, Err: errors.New("connection refused")})
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	attrs := attribute.NewSet(otelbroker.TableKey.String(tb.Name), otelbroker.FormKey.String("lease"))
	for name, w := range map[string]int64{"sqlxbroker.claimed": 3, "sqlxbroker.claim_conflicts": 2, "sqlxbroker.claim_errors": 1} {
		if got := sum(t, rm, name, attrs); got != w {
			t.Errorf("%s = %d, want %d", name, got, w)
		}
	}
	if got := histCount(t, rm, "sqlxbroker.claim.duration", attrs); got != 4 {
		t.Errorf("sqlxbroker.claim.duration: %d recorded, want 4", got)
	}
	if seen != 4 {
		t.Errorf("the user's OnClaim saw %d calls, want 4", seen)
	}
}

// TestLibraryImportsNoOpenTelemetry: the library's packages (all but this
// one and the command) compile none of OpenTelemetry, so an application
// that does not import otelbroker does not either.
func TestLibraryImportsNoOpenTelemetry(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}}", "github.com/sqlxbroker/sqlxbroker/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	var lib []string
	for _, p := range strings.Fields(string(out)) {
		if !strings.Contains(p, "/otelbroker") && !strings.Contains(p, "/cmd/") && !strings.Contains(p, "/internal/") {
			lib = append(lib, p)
		}
	}
	if len(lib) < 5 {
		t.Fatalf("go list found only %v", lib)
	}
	deps, err := exec.Command("go", append([]string{"list", "-deps"}, lib...)...).Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	if strings.Contains(string(deps), "go.opentelemetry.io") {
		var bad []string
		for _, d := range strings.Fields(string(deps)) {
			if strings.HasPrefix(d, "go.opentelemetry.io") {
				bad = append(bad, d)
			}
		}
		t.Errorf("the library's packages %v depend on %v", lib, bad)
	}
}

// TestMetadataRoundTrip: the text Metadata writes for a span (traceparent
// and tracestate lines) reads back as the same remote span context; a
// context without a span writes nothing, and text without a trace context
// reads as none.
func TestMetadataRoundTrip(t *testing.T) {
	inst, err := otelbroker.New(otelbroker.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ts, err := trace.ParseTraceState("vendor=a1,other=b2")
	if err != nil {
		t.Fatal(err)
	}
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1, 2, 3}, SpanID: trace.SpanID{4, 5, 6},
		TraceFlags: trace.FlagsSampled, TraceState: ts})
	md := inst.Metadata(trace.ContextWithSpanContext(context.Background(), sc))
	lines := strings.Split(md, "\n")
	slices.Sort(lines)
	if want := []string{"traceparent: 00-01020300000000000000000000000000-0405060000000000-01", "tracestate: vendor=a1,other=b2"}; !slices.Equal(lines, want) {
		t.Errorf("Metadata wrote %q", md)
	}
	got := trace.SpanContextFromContext(inst.Extract(context.Background(), md))
	if !got.IsRemote() || !got.Equal(sc.WithRemote(true)) {
		t.Errorf("Extract(%q) = %+v, want %+v", md, got, sc)
	}
	if md := inst.Metadata(context.Background()); md != "" {
		t.Errorf("Metadata without a span wrote %q", md)
	}
	for _, text := range []string{"", "request 42", "traceparent: junk"} {
		if got := trace.SpanContextFromContext(inst.Extract(context.Background(), text)); got.IsValid() {
			t.Errorf("Extract(%q) = %+v, want no span context", text, got)
		}
	}
}
