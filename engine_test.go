package sqlxbroker

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/sqlxbroker/sqlxbroker/core"
)

// memForm is a claim form over an in-memory counter: claims are free and
// completions immediate, so a benchmark on it measures the engine alone.
type memForm struct {
	traits core.Traits
	left   atomic.Int64
	lost   bool // claims report a lost-hold channel (as lease claims do)
	done   atomic.Int64
	total  int64
	fin    chan struct{}
}

func (f *memForm) Traits() core.Traits             { return f.traits }
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
		out[i] = &memClaim{f: f, row: core.Row{ID: int64(i), Attempt: 1}}
	}
	return out, nil
}

type memClaim struct {
	f      *memForm
	row    core.Row
	onLost func()
}

func (c *memClaim) Row() *core.Row        { return &c.row }
func (c *memClaim) Tx() (*sqlx.Tx, error) { return nil, core.ErrNoTx }
func (c *memClaim) OnLost(f func()) {
	if c.f.lost {
		c.onLost = f
	}
}
func (c *memClaim) Complete(ctx context.Context, o core.Outcome, done func(error)) { done(c.write()) }

func (c *memClaim) write() error {
	if c.f.done.Add(1) == c.f.total {
		close(c.f.fin)
	}
	return nil
}

// drainMem runs a subscription over n in-memory rows until all complete.
func drainMem(tb testing.TB, n int64, lost bool, p SubscribeParams) {
	f := &memForm{lost: lost}
	runMem(tb, f, n, func(ctx context.Context, d *Delivery) error { return nil }, p)
}

// runMem runs a subscription of h over n rows of f until all complete,
// stops it and checks that each was claimed and succeeded once.
func runMem(tb testing.TB, f *memForm, n int64, h Handler, p SubscribeParams) {
	runOn(tb, f, f, n, h, p)
}

// runOn is runMem for a form built on the memForm m (one that wraps its
// claims, say).
func runOn(tb testing.TB, form core.ClaimForm, f *memForm, n int64, h Handler, p SubscribeParams) {
	f.total, f.fin = n, make(chan struct{})
	f.left.Store(n)
	s, err := subscribe(context.Background(), form, memTable, h, p)
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

var memTable = Table{Name: "mem"}

// TestEngineDrains: every claim is handled and completed once, with and
// without a lost-hold channel, and Stop leaves nothing in flight.
func TestEngineDrains(t *testing.T) {
	for _, lost := range []bool{false, true} {
		drainMem(t, 10_000, lost, SubscribeParams{Concurrency: 100})
	}
}

// BenchmarkEngine is the engine's own cost per delivery (claims and
// completions free): ns/op and allocs/op per delivery with 1,000 handlers.
func BenchmarkEngine(b *testing.B) {
	for _, lost := range []bool{false, true} {
		name := "plain"
		if lost {
			name = "lost-notifier"
		}
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			drainMem(b, int64(b.N), lost, SubscribeParams{Concurrency: 1000})
		})
	}
}

// asyncClaim answers its completion later: the answers wait in a queue the
// test runs.
type asyncClaim struct {
	memClaim
	f *asyncForm
}

func (c *asyncClaim) Complete(ctx context.Context, o core.Outcome, done func(error)) {
	c.f.q <- func() { done(c.memClaim.write()) }
}

type asyncForm struct {
	memForm
	q chan func()
}

func (f *asyncForm) Claim(ctx context.Context, max int) ([]core.Claim, error) {
	cs, err := f.memForm.Claim(ctx, max)
	for i, c := range cs {
		cs[i] = &asyncClaim{memClaim: *c.(*memClaim), f: f}
	}
	return cs, err
}

// TestEngineAsyncCompletions: with a form that answers completions later,
// handlers go on while their completions wait, and no handler waits for
// its own; beyond Concurrency of them unanswered, each holds a handler's
// place, so no more rows are claimed than twice Concurrency in all;
// InFlight counts them; Stop waits for every one, and each is counted
// once written.
func TestEngineAsyncCompletions(t *testing.T) {
	const n, conc = 50, 4
	f := &asyncForm{memForm: memForm{total: n, fin: make(chan struct{})}, q: make(chan func(), n)}
	f.left.Store(n)
	var handled atomic.Int64
	s, err := subscribe(context.Background(), f, memTable, func(ctx context.Context, d *Delivery) error {
		handled.Add(1)
		return nil
	}, SubscribeParams{Concurrency: conc})
	if err != nil {
		t.Fatal(err)
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("waiting for %s: %d handled, %d completions queued, %d written, InFlight %d", what, handled.Load(), len(f.q), f.done.Load(), s.InFlight())
			}
			time.Sleep(time.Millisecond)
		}
	}
	// 2 x Concurrency handlers leave their completions and end; the
	// completions beyond Concurrency hold the handlers' places.
	waitFor("the first handlers", func() bool { return len(f.q) == 2*conc && handled.Load() == 2*conc })
	waitFor("the handlers to leave their completions", func() bool { return s.inflight.Load() == 0 })
	if got := s.InFlight(); got != 2*conc {
		t.Fatalf("InFlight %d, want %d (completions queued)", got, 2*conc)
	}
	if got, want := s.busy(), int64(conc); got != want {
		t.Fatalf("busy %d, want %d: the completions beyond Concurrency hold every handler's place", got, want)
	}
	// No more rows are claimed while they do: nothing to wait for but
	// time, so the check gives a claim that should not come a while.
	time.Sleep(50 * time.Millisecond)
	if got := handled.Load(); got != 2*conc {
		t.Fatalf("%d handled with %d completions unanswered, want %d", got, len(f.q), 2*conc)
	}
	if st := s.Stats(); st.Succeeded != 0 {
		t.Fatalf("stats %+v before any completion was written", st)
	}
	var first, waiting []func()
	for range conc {
		first = append(first, <-f.q)
	}
	for range conc {
		waiting = append(waiting, <-f.q)
	}
	stopped := make(chan error, 1)
	go func() { stopped <- s.Stop(context.Background()) }()
	for _, answer := range waiting {
		answer()
	}
	// The handlers end; the first completions are still to write, so Stop
	// must not return.
	waitFor("the handlers to end", func() bool { return s.InFlight() == conc+len(f.q) })
	select {
	case err := <-stopped:
		t.Fatalf("Stop returned (%v) with %d completions unanswered", err, conc)
	case <-time.After(100 * time.Millisecond):
	}
	for _, answer := range first {
		answer()
	}
	// Handlers that claimed before the stop wait for their answers too.
	timeout := time.After(10 * time.Second)
	for stop := false; !stop; {
		select {
		case answer := <-f.q:
			answer()
		case err := <-stopped:
			if err != nil {
				t.Fatal(err)
			}
			stop = true
		case <-timeout:
			t.Fatal("Stop did not return once every completion was written")
		}
	}
	if st := s.Stats(); f.done.Load() != st.Claimed || st.Succeeded != st.Claimed || s.InFlight() != 0 {
		t.Fatalf("after Stop: %d completions written, stats %+v, InFlight %d; want every claim written and counted once", f.done.Load(), st, s.InFlight())
	}
}

// pipeForm claims in batches with two claims at once (core.Traits); each claim takes a while, and the form records how
// many run at once and the most handlers asked for at once.
type pipeForm struct {
	memForm
	slow                time.Duration
	claiming, maxClaims atomic.Int64
	asked, maxAsked     atomic.Int64
	calls               atomic.Int64
}

// raise makes v at least n.
func raise(v *atomic.Int64, n int64) {
	for m := v.Load(); n > m && !v.CompareAndSwap(m, n); m = v.Load() {
	}
}

func (f *pipeForm) Claim(ctx context.Context, max int) ([]core.Claim, error) {
	f.calls.Add(1)
	raise(&f.maxClaims, f.claiming.Add(1))
	defer f.claiming.Add(-1)
	raise(&f.maxAsked, f.asked.Add(int64(max)))
	defer f.asked.Add(-int64(max))
	time.Sleep(f.slow)
	return f.memForm.Claim(ctx, max)
}

// TestEnginePipelinedClaims: a form that pipelines its claims gets two
// claims at once, which together never claim for more handlers than
// Concurrency (nor do they leave more in flight); every row is handled
// once, and an idle subscription's second loop does not spin.
func TestEnginePipelinedClaims(t *testing.T) {
	const n, conc = 2000, 16
	f := &pipeForm{slow: 2 * time.Millisecond}
	f.traits, f.total, f.fin = core.Traits{Batches: true, ClaimsAtOnce: 2}, n, make(chan struct{})
	f.left.Store(n)
	var inWork, maxInWork atomic.Int64
	s, err := subscribe(context.Background(), f, memTable, func(ctx context.Context, d *Delivery) error {
		raise(&maxInWork, inWork.Add(1))
		time.Sleep(time.Millisecond)
		inWork.Add(-1)
		return nil
	}, SubscribeParams{Concurrency: conc, PollInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-f.fin:
	case <-time.After(time.Minute):
		t.Fatalf("%d of %d completed in a minute", f.done.Load(), n)
	}
	// Idle now: the first loop polls (a claim per 50 ms at most); the
	// second must not claim in a loop.
	calls := f.calls.Load()
	time.Sleep(300 * time.Millisecond)
	if idle := f.calls.Load() - calls; idle > 40 {
		t.Errorf("%d claims in 300 ms of an idle table polled every 50 ms at most: a loop spins", idle)
	}
	if err := s.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.Succeeded != n || st.Claimed != n {
		t.Errorf("stats %+v, want %d claimed and succeeded", st, n)
	}
	if got := f.maxClaims.Load(); got != 2 {
		t.Errorf("at most %d claims ran at once, want 2", got)
	}
	if got := f.maxAsked.Load(); got > conc {
		t.Errorf("claims running at once asked for %d handlers, more than Concurrency %d", got, conc)
	}
	if got := maxInWork.Load(); got > conc {
		t.Errorf("%d handlers ran at once, more than Concurrency %d", got, conc)
	}
}

// TestEngineHalfBatches: a form with HalfBatches claims at most half of a
// large batch, so its two claims run at once; without it the first claim
// asks for every free handler, and a small batch is claimed whole either
// way. Every row is handled once.
func TestEngineHalfBatches(t *testing.T) {
	for _, c := range []struct {
		conc   int
		halves bool
		want   int64 // the most rows one claim asked for
	}{{1000, true, 500}, {1000, false, 1000}, {64, true, 64}} {
		f := &pipeForm{slow: 2 * time.Millisecond}
		f.traits = core.Traits{Batches: true, ClaimsAtOnce: 2, HalfBatches: c.halves}
		var most atomic.Int64
		runOn(t, f, &f.memForm, 20_000, func(context.Context, *Delivery) error { return nil },
			SubscribeParams{Concurrency: c.conc, OnClaim: func(ci ClaimInfo) { raise(&most, int64(ci.Asked)) }})
		if got := most.Load(); got != c.want {
			t.Errorf("%d handlers, HalfBatches %v: a claim asked for %d rows, want at most and once %d", c.conc, c.halves, got, c.want)
		}
		if c.halves && c.conc == 1000 {
			if got := f.maxClaims.Load(); got != 2 {
				t.Errorf("%d handlers, HalfBatches: at most %d claims ran at once, want 2", c.conc, got)
			}
		}
	}
}

// A form with HalfBatches claims half of a batch of several hundred rows
// (as many as claimLeast waits for), else the whole batch.
func TestClaimMost(t *testing.T) {
	for _, c := range []struct{ batch, want int }{
		{1, 1}, {8, 8}, {64, 64}, {250, 250}, {398, 398}, {399, 200}, {400, 200}, {1000, 500}, {5001, 2501},
	} {
		if got := claimMost(c.batch); got != c.want {
			t.Errorf("claimMost(%d) = %d, want %d", c.batch, got, c.want)
		}
	}
}

// TestEngineClaimsAtOnceBelow: a form whose claims run two at once only
// for batches under ClaimsAtOnceBelow rows gets two at once with smaller
// batches and one at a time from that size on, every row handled once.
func TestEngineClaimsAtOnceBelow(t *testing.T) {
	for _, c := range []struct{ batch, want int64 }{{8, 2}, {16, 1}, {32, 1}} {
		f := &pipeForm{slow: 2 * time.Millisecond}
		f.traits = core.Traits{Batches: true, ClaimsAtOnce: 2, ClaimsAtOnceBelow: 16}
		runOn(t, f, &f.memForm, 2000, func(ctx context.Context, d *Delivery) error {
			time.Sleep(time.Millisecond)
			return nil
		}, SubscribeParams{Concurrency: 32, BatchSize: int(c.batch), PollInterval: 50 * time.Millisecond})
		if got := f.maxClaims.Load(); got != c.want {
			t.Errorf("batches of %d: at most %d claims ran at once, want %d", c.batch, got, c.want)
		}
	}
}

// conflictForm is a memForm whose every other claim loses to a concurrent
// transaction (ErrConflict) and delivers nothing.
type conflictForm struct {
	*memForm
	claims atomic.Int64
}

func (f *conflictForm) Claim(ctx context.Context, max int) ([]core.Claim, error) {
	if f.claims.Add(1)%2 == 1 {
		return nil, fmt.Errorf("claim: %w", ErrConflict)
	}
	return f.memForm.Claim(ctx, max)
}

// TestEngineConflictsClaimAgain: a claim that fails with ErrConflict is
// counted in Stats.Conflicts, not ClaimErrors, and made again at once: with
// an idle wait of an hour the drain still ends.
func TestEngineConflictsClaimAgain(t *testing.T) {
	const n = 200
	f := &conflictForm{memForm: &memForm{traits: core.Traits{Batches: true}, total: n, fin: make(chan struct{})}}
	f.left.Store(n)
	s, err := subscribe(context.Background(), f, memTable, func(ctx context.Context, d *Delivery) error { return nil },
		SubscribeParams{Concurrency: 10, PollInterval: time.Hour, MinPollInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-f.fin:
	case <-time.After(30 * time.Second):
		t.Fatalf("%d of %d completed in 30 s: conflicts waited for the poll interval", f.done.Load(), n)
	}
	if err := s.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	st := s.Stats()
	if st.Succeeded != n || st.ClaimErrors != 0 || st.Conflicts == 0 {
		t.Fatalf("stats %+v, want %d succeeded, conflicts counted, no claim errors", st, n)
	}
	if lost, made := st.Conflicts, f.claims.Load(); lost < made/2 {
		t.Errorf("%d conflicts counted of %d claims, every other one a conflict", lost, made)
	}
}

// TestEngineQueueReachesEveryHandler: a batch of claims whose handlers
// block reaches Concurrency workers at once (each worker that takes a
// claim sends the next one on), and handlers that return at once drain
// the rest; nothing is left in the queue.
func TestEngineQueueReachesEveryHandler(t *testing.T) {
	const conc, rows = 100, 1000
	f := &memForm{traits: core.Traits{Batches: true}}
	var running, most atomic.Int64
	all := make(chan struct{})
	var once atomic.Bool
	h := func(ctx context.Context, d *Delivery) error {
		n := running.Add(1)
		defer running.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		if n == conc && once.CompareAndSwap(false, true) {
			close(all)
		}
		select { // the first conc handlers wait for each other
		case <-all:
		case <-time.After(10 * time.Second):
		}
		return nil
	}
	runMem(t, f, rows, h, SubscribeParams{Concurrency: conc})
	if !once.Load() {
		t.Errorf("at most %d handlers ran at once, want %d", most.Load(), conc)
	}
	if m := most.Load(); m > conc {
		t.Errorf("%d handlers ran at once, more than Concurrency %d", m, conc)
	}
}

// TestEngineLongDeliveriesLeaveNoHandlerIdle: a batching form claims for
// the handlers that are free even while most are busy with long
// deliveries; it waits for more to be free only about as long as a claim
// takes. (It used to wait until half the batch was free, so three
// handlers of four held by long deliveries kept the fourth idle.)
func TestEngineLongDeliveriesLeaveNoHandlerIdle(t *testing.T) {
	f := &memForm{traits: core.Traits{Batches: true, ClaimsAtOnce: 1}}
	release := make(chan struct{})
	var started atomic.Int64
	h := func(ctx context.Context, d *Delivery) error {
		if started.Add(1) <= 3 {
			<-release // a long delivery
		}
		return nil
	}
	const n = 20
	f.total, f.fin = n, make(chan struct{})
	f.left.Store(n)
	s, err := subscribe(context.Background(), f, memTable, h, SubscribeParams{Concurrency: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop(context.Background()) //nolint:errcheck // checked below
	deadline := time.Now().Add(10 * time.Second)
	for f.done.Load() < n-3 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	got := f.done.Load()
	close(release)
	select {
	case <-f.fin:
	case <-time.After(10 * time.Second):
		t.Fatalf("%d of %d completed after the long deliveries ended", f.done.Load(), n)
	}
	if got < n-3 {
		t.Fatalf("with 3 of 4 handlers held by long deliveries, the fourth handled %d of the other %d rows in 10 s", got, n-3)
	}
	if err := s.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// A batching form waits for four fifths of a small batch of free handlers,
// for half of a batch of several hundred, and never for more than a batch.
func TestClaimLeast(t *testing.T) {
	for _, c := range []struct{ batch, want int }{
		{1, 1}, {2, 2}, {8, 7}, {64, 52}, {250, 200}, {300, 200}, {400, 200}, {401, 201}, {1000, 500}, {5000, 2500},
	} {
		got := claimLeast(c.batch)
		if got != c.want {
			t.Errorf("claimLeast(%d) = %d, want %d", c.batch, got, c.want)
		}
		if got < 1 || got > c.batch {
			t.Errorf("claimLeast(%d) = %d, outside 1..%d", c.batch, got, c.batch)
		}
	}
}

// streamForm is a memForm that claims row by row and hands each row on as
// it claims it (core.ClaimStreamer); after the first row of a claim it
// waits until that row's handler has started.
type streamForm struct {
	memForm
	started  chan struct{} // closed by the first handler that starts
	streamed atomic.Int64  // ClaimEach calls
	early    atomic.Int64  // ClaimEach calls that saw their first row's handler start before they returned
}

func (f *streamForm) ClaimEach(ctx context.Context, max int, found func(core.Claim)) (int, error) {
	f.streamed.Add(1)
	n := 0
	for n < max {
		cs, err := f.Claim(ctx, 1)
		if err != nil || len(cs) == 0 {
			return n, err
		}
		found(cs[0])
		if n++; n == 1 {
			select {
			case <-f.started:
				f.early.Add(1)
			case <-time.After(10 * time.Second):
			}
		}
	}
	return n, nil
}

// TestEngineStartsStreamedRows: a form that claims row by row and hands
// each row on as it claims it (core.ClaimStreamer) has the row's handler
// started while its claim goes on, not once the claim returns; every row
// is still claimed and completed once, and OnClaim's rows sum to the rows
// claimed.
func TestEngineStartsStreamedRows(t *testing.T) {
	f := &streamForm{started: make(chan struct{})}
	var once atomic.Bool
	var rows atomic.Int64
	h := func(context.Context, *Delivery) error {
		if once.CompareAndSwap(false, true) {
			close(f.started)
		}
		return nil
	}
	runOn(t, f, &f.memForm, 200, h, SubscribeParams{Concurrency: 8, OnClaim: func(c ClaimInfo) { rows.Add(int64(c.Rows)) }})
	if f.streamed.Load() == 0 {
		t.Fatal("the engine never called ClaimEach of a form that has it")
	}
	if f.early.Load() == 0 {
		t.Errorf("in none of %d streamed claims did the first row's handler start before the claim returned", f.streamed.Load())
	}
	if rows.Load() != 200 {
		t.Errorf("OnClaim's rows sum to %d, want 200", rows.Load())
	}
}
