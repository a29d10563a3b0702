package core_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqlxbroker/sqlxbroker/core"
)

// memForm is a claim form over an in-memory counter: claims are free and
// completions immediate, so a benchmark on it measures the engine alone.
type memForm struct {
	plan  *core.Plan
	left  atomic.Int64
	lost  bool // claims report a lost-hold channel (as lease claims do)
	done  atomic.Int64
	total int64
	fin   chan struct{}
}

func (f *memForm) Form() core.Form                 { return core.Lease }
func (f *memForm) Plan() *core.Plan                { return f.plan }
func (f *memForm) Start(ctx context.Context) error { return nil }
func (f *memForm) Close() error                    { return nil }
func (f *memForm) Claim(ctx context.Context, max int) ([]core.Claim, error) {
	var n int64
	for { // claims run at once: take rows with a compare-and-swap
		left := f.left.Load()
		if n = min(int64(max), left); n <= 0 {
			return nil, nil
		}
		if f.left.CompareAndSwap(left, left-n) {
			break
		}
	}
	out := make([]core.Claim, n)
	for i := range out {
		c := &memClaim{f: f, d: core.NewDelivery(int64(i), 1, "", nil, nil)}
		if f.lost {
			c.lost = make(chan struct{})
		}
		out[i] = c
	}
	return out, nil
}

type memClaim struct {
	f    *memForm
	d    *core.Delivery
	lost chan struct{}
}

func (c *memClaim) Delivery() *core.Delivery { return c.d }
func (c *memClaim) Lost() <-chan struct{}    { return c.lost }
func (c *memClaim) Complete(ctx context.Context, o core.Outcome) error {
	if c.f.done.Add(1) == c.f.total {
		close(c.f.fin)
	}
	return nil
}

// drainMem runs a subscription over n in-memory rows until all complete.
func drainMem(tb testing.TB, n int64, lost bool, p core.SubscribeParams) {
	f := &memForm{plan: &core.Plan{Table: core.Table{Name: "mem"}}, lost: lost, total: n, fin: make(chan struct{})}
	f.left.Store(n)
	s, err := core.Subscribe(context.Background(), f, func(ctx context.Context, d *core.Delivery) error { return nil }, p)
	if err != nil {
		tb.Fatal(err)
	}
	select {
	case <-f.fin:
	case <-time.After(time.Minute):
		tb.Fatalf("%d of %d completed in a minute", f.done.Load(), n)
	}
	if err := s.Stop(context.Background()); err != nil {
		tb.Fatal(err)
	}
	if st := s.Stats(); st.Succeeded != n || st.Claimed != n {
		tb.Fatalf("stats %+v, want %d claimed and succeeded", st, n)
	}
}

// TestEngineDrains: every claim is handled and completed once, with and
// without a lost-hold channel, and Stop leaves nothing in flight.
func TestEngineDrains(t *testing.T) {
	for _, lost := range []bool{false, true} {
		drainMem(t, 10_000, lost, core.SubscribeParams{Concurrency: 100})
	}
}

// BenchmarkEngine is the engine's own cost per delivery (claims and
// completions free): ns/op and allocs/op per delivery with 1,000 handlers.
func BenchmarkEngine(b *testing.B) {
	for _, lost := range []bool{false, true} {
		name := "plain"
		if lost {
			name = "lost-channel"
		}
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			drainMem(b, int64(b.N), lost, core.SubscribeParams{Concurrency: 1000})
		})
	}
}
