package sqlxbrokertest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/sqlxbroker/sqlxbroker"
)

// DefaultDrainTimeout is Drain's deadline when DrainParams gives none.
const DefaultDrainTimeout = 10 * time.Second

// DrainParams say what Drain publishes and runs.
type DrainParams struct {
	Broker  *sqlxbroker.Broker // required
	Table   sqlxbroker.Table   // the table; its description selects the claim form
	Handler sqlxbroker.Handler // required

	// Messages are published to Table in one transaction, committed
	// before the subscription starts (Broker.Publish; none: the table's
	// rows are drained as they are).
	Messages []any

	// Timeout is how long Drain waits for the table to drain; default
	// DefaultDrainTimeout. The context given to Drain may end it sooner.
	Timeout time.Duration

	// Subscribe tunes the subscription (Concurrency, RetryDelay, ...), as
	// Broker.Subscribe takes it. Its OnOutcome, when set, is called too.
	// Without a Logger, the subscription logs to the test's log (t.Logf).
	Subscribe sqlxbroker.SubscribeParams
}

// Handled is one completed delivery.
type Handled struct {
	ID      any                    // the row's ID as the driver returned it
	Attempt int                    // the delivery's attempt
	Kind    sqlxbroker.OutcomeKind // what the completion recorded
	Err     error                  // the handler's error (nil for success)
	// CompleteErr is the completion's error: nil when recorded,
	// sqlxbroker.ErrLeaseLost when the hold was lost first.
	CompleteErr error
}

// DrainResult is what Drain did.
type DrainResult struct {
	// Stats are the subscription's counts, final: read after it stopped.
	Stats sqlxbroker.Stats
	// Handled lists the completed deliveries in the order their
	// completions were learnt.
	Handled []Handled
	// Left counts the table's rows in each state once the subscription
	// stopped: Ready and InWork are 0 after a drain; rows retried later
	// (ReadyAt) are Scheduled, dead rows Dead.
	Left sqlxbroker.Counts
}

// IDs returns the IDs of the deliveries that ended with outcome kind, in
// the order of Handled; with no kind, every handled ID.
func (r *DrainResult) IDs(kind ...sqlxbroker.OutcomeKind) []any {
	var out []any
	for _, h := range r.Handled {
		if len(kind) == 0 || containsKind(kind, h.Kind) {
			out = append(out, h.ID)
		}
	}
	return out
}

func containsKind(ks []sqlxbroker.OutcomeKind, k sqlxbroker.OutcomeKind) bool {
	for _, x := range ks {
		if x == k {
			return true
		}
	}
	return false
}

// drainPoll is how often Drain looks at the table.
const drainPoll = 20 * time.Millisecond

// Drain publishes p.Messages, subscribes p.Handler to p.Table, and runs it
// until nothing in the table is claimable: no row ready (Counts), none in
// work, no delivery in flight. A row retried later (its ReadyAt ahead) is
// not claimable and stays scheduled; with a table without a ReadyAt
// column, a failed row is retried at once, so it is retried until it
// succeeds or goes dead after MaxAttempts. The subscription is then
// stopped, its completions waited for, and the result returned.
//
// When the deadline (p.Timeout) passes or ctx ends first, the
// subscription is stopped at once (handlers' contexts are cancelled and
// their rows released; a handler that ignores its context holds Drain
// up) and Drain returns the result so far with an error that says how
// many rows are left in which state. A bad p (no broker, no handler, a
// message Publish refuses, a table Subscribe refuses) is an error before
// anything runs, naming the problem. Drain does not fail t: it logs the
// subscription's lines to it (without a Logger of p's) and stops its
// subscription in t's cleanup should the test end first.
func Drain(ctx context.Context, t TB, p DrainParams) (DrainResult, error) {
	t.Helper()
	switch {
	case p.Broker == nil:
		return DrainResult{}, errors.New("sqlxbrokertest: Drain: DrainParams.Broker is nil")
	case p.Handler == nil:
		return DrainResult{}, errors.New("sqlxbrokertest: Drain: DrainParams.Handler is nil")
	case p.Timeout < 0:
		return DrainResult{}, fmt.Errorf("sqlxbrokertest: Drain: negative Timeout %v", p.Timeout)
	}
	if p.Timeout == 0 {
		p.Timeout = DefaultDrainTimeout
	}
	b := p.Broker
	if err := b.CheckTable(ctx, p.Table); err != nil {
		return DrainResult{}, fmt.Errorf("sqlxbrokertest: Drain: %w", err)
	}
	if len(p.Messages) > 0 {
		tx, err := b.DB().BeginTxx(ctx, nil)
		if err != nil {
			return DrainResult{}, fmt.Errorf("sqlxbrokertest: Drain: publish: %w", err)
		}
		if err := b.Publish(ctx, tx, p.Table, p.Messages...); err != nil {
			_ = tx.Rollback()
			return DrainResult{}, fmt.Errorf("sqlxbrokertest: Drain: %w", err)
		}
		if err := tx.Commit(); err != nil {
			return DrainResult{}, fmt.Errorf("sqlxbrokertest: Drain: publish: commit: %w", err)
		}
	}

	var mu sync.Mutex
	var res DrainResult
	sp := p.Subscribe
	if sp.Logger == nil {
		sp.Logger = slog.New(slog.NewTextHandler(logWriter{t}, nil))
	}
	user := sp.OnOutcome
	sp.OnOutcome = func(d *sqlxbroker.Delivery, o sqlxbroker.Outcome, err error) {
		mu.Lock()
		res.Handled = append(res.Handled, Handled{ID: d.ID(), Attempt: d.Attempt(), Kind: o.Kind, Err: o.Err, CompleteErr: err})
		mu.Unlock()
		if user != nil {
			user(d, o, err)
		}
	}
	sub, err := b.Subscribe(context.Background(), p.Table, p.Handler, sp)
	if err != nil {
		return DrainResult{}, fmt.Errorf("sqlxbrokertest: Drain: %w", err)
	}
	stopNow := func() error {
		cctx, cancel := context.WithCancel(context.Background())
		cancel() // no time to finish: handlers are cancelled, their rows released
		err := sub.Stop(cctx)
		if errors.Is(err, context.Canceled) {
			err = nil
		}
		return err
	}
	t.Cleanup(func() { _ = stopNow() })

	dctx, cancel := context.WithTimeout(ctx, p.Timeout)
	defer cancel()
	tick := time.NewTicker(drainPoll)
	defer tick.Stop()
	var last sqlxbroker.Counts
	var lastErr error
	for {
		if sub.InFlight() == 0 {
			c, err := b.Counts(dctx, p.Table)
			if err == nil && c.Ready == 0 && c.InWork == 0 && sub.InFlight() == 0 {
				break
			}
			if err == nil {
				last = c
			} else if dctx.Err() == nil {
				lastErr = err
			}
		}
		select {
		case <-tick.C:
			continue
		case <-sub.Done():
			err = errors.New("the subscription stopped (the broker was closed)")
		case <-dctx.Done():
			err = nil
		}
		// Stopped early: report what is left, at the deadline and after.
		at, aerr := b.Counts(context.Background(), p.Table)
		if aerr != nil {
			at = last
		}
		inflight := sub.InFlight()
		serr := stopNow()
		finish(&res, &mu, sub)
		left, cerr := b.Counts(context.Background(), p.Table)
		res.Left = left
		why := fmt.Sprintf("the deadline (%v) passed", p.Timeout)
		switch {
		case err != nil:
			why = err.Error()
		case ctx.Err() != nil:
			why = "the context ended (" + ctx.Err().Error() + ")"
		}
		msg := fmt.Sprintf("sqlxbrokertest: Drain %s: %s before the table drained: %s (%d deliveries in flight); after the stop: %s (claimed %d, succeeded %d, retried %d, dead %d, released at the stop %d)",
			p.Table.Name, why, describe(&p.Table, at), inflight, describe(&p.Table, left),
			res.Stats.Claimed, res.Stats.Succeeded, res.Stats.Retried, res.Stats.Dead, res.Stats.Released)
		return res, errors.Join(errors.New(msg), lastErr, aerr, cerr, serr)
	}
	// Drained: stop, with time for completions in progress.
	sctx, scancel := context.WithTimeout(context.Background(), p.Timeout)
	defer scancel()
	serr := sub.Stop(sctx)
	finish(&res, &mu, sub)
	left, cerr := b.Counts(context.Background(), p.Table)
	res.Left = left
	if serr != nil || cerr != nil {
		return res, fmt.Errorf("sqlxbrokertest: Drain %s: %w", p.Table.Name, errors.Join(serr, cerr))
	}
	return res, nil
}

// logWriter writes each line a slog handler writes to the test's log.
type logWriter struct{ t TB }

func (w logWriter) Write(p []byte) (int, error) {
	w.t.Logf("%s", strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

// finish copies the stopped subscription's counts into res.
func finish(res *DrainResult, mu *sync.Mutex, sub *sqlxbroker.Subscription) {
	mu.Lock()
	defer mu.Unlock()
	res.Stats = sub.Stats()
}

// describe says how many rows are in each state the table can tell.
func describe(t *sqlxbroker.Table, c sqlxbroker.Counts) string {
	s := fmt.Sprintf("%d ready", c.Ready)
	if c.InWorkKnown {
		s += fmt.Sprintf(", %d in work", c.InWork)
	} else {
		s += " (rows in work counted as ready)"
	}
	if t.ReadyAt != "" {
		s += fmt.Sprintf(", %d scheduled", c.Scheduled)
	}
	if t.DeadAt != "" {
		s += fmt.Sprintf(", %d dead", c.Dead)
	}
	if t.DoneAt != "" {
		s += fmt.Sprintf(", %d done", c.Done)
	}
	return s
}
