package conformance

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/sqlxbroker/sqlxbroker"
)

// opsTable is a suite table with every column the operations read: ready,
// dead, done and last-error columns, three attempts.
func opsTable(tb *sqlxbroker.Table) {
	tb.DoneAt, tb.LastError, tb.MaxAttempts = "done_at", "last_error", 3
}

// publishState publishes n rows in one state, set through the state's
// columns (times in the dialect's encoding); each row's acct (its advisory
// key) is its own.
func publishState(t TB, tg *Target, b *sqlxbroker.Broker, tb sqlxbroker.Table, tag string, n int, cols map[string]time.Time) {
	t.Helper()
	const chunk = 2000
	for from := 0; from < n; from += chunk {
		var msgs []any
		for i := from; i < min(from+chunk, n); i++ {
			m := map[string]any{"acct": fmt.Sprintf("%s-%d", tag, i), "grp": nil, "body": tag}
			for c, at := range cols {
				m[c] = tg.Dialect.EncodeTime(at.UTC().Truncate(time.Microsecond))
			}
			msgs = append(msgs, m)
		}
		if err := b.Publish(context.Background(), b.DB(), tb, msgs...); err != nil {
			t.Fatalf("publish %s rows: %v", tag, err)
		}
	}
}

// held is a handler that holds its deliveries until released, recording
// every row it handled.
type held struct {
	mu       sync.Mutex
	seen     map[string]int
	notFirst int // deliveries that did not report attempt 1
	release  chan struct{}
}

func newHeld() *held { return &held{seen: map[string]int{}, release: make(chan struct{})} }

func (h *held) handle(ctx context.Context, d *sqlxbroker.Delivery) error {
	h.mu.Lock()
	h.seen[fmt.Sprint(d.ID())]++
	if d.Attempt() != 1 {
		h.notFirst++
	}
	h.mu.Unlock()
	select {
	case <-h.release:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (h *held) twice() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for id, n := range h.seen {
		if n > 1 {
			out = append(out, id)
		}
	}
	return out
}

func counts(t TB, b *sqlxbroker.Broker, tb sqlxbroker.Table) sqlxbroker.Counts {
	t.Helper()
	c, err := b.Counts(context.Background(), tb)
	if err != nil {
		t.Fatalf("counts: %v", err)
	}
	return c
}

// Operations: Counts match the table's true state in each state while a
// subscription holds rows in work; List pages through dead rows by ID with
// their attempt and last error; Requeue makes dead rows ready (each
// delivered once); Delete takes the rows of a state and never a row in
// work (in the advisory form it refuses ready rows); Prune deletes the
// done rows older than asked; bad input is an error that names it.
func Operations(t TB, tg *Target, f sqlxbroker.Form) {
	ctx := context.Background()
	b := tg.broker(t)
	tb := tg.fresh(t, b.DB(), f, opsTable)
	now := time.Now()
	const ready, scheduled, dead, done, inWork = 40, 7, 23, 5, 4
	publishState(t, tg, b, tb, "ready", ready, nil)
	publishState(t, tg, b, tb, "scheduled", scheduled, map[string]time.Time{"ready_at": now.Add(time.Hour)})
	publishState(t, tg, b, tb, "dead", dead, map[string]time.Time{"dead_at": now.Add(-time.Minute)})
	publishState(t, tg, b, tb, "done", done, map[string]time.Time{"done_at": now.Add(-2 * time.Hour)})

	h := newHeld()
	p := quick
	p.Concurrency = inWork
	s := subscribe(t, b, tb, h.handle, p)
	WaitFor(t, 30*time.Second, "the handlers hold their rows", func() bool { return s.InFlight() == inWork })

	c := counts(t, b, tb)
	want := sqlxbroker.Counts{Ready: ready, Scheduled: scheduled, Dead: dead, Done: done}
	if c.InWorkKnown {
		want.Ready, want.InWork = ready-inWork, inWork
	}
	if c.Ready != want.Ready || c.Scheduled != want.Scheduled || c.InWork != want.InWork || c.Dead != want.Dead || c.Done != want.Done {
		t.Errorf("counts ready/scheduled/in-work/dead/done = %d/%d/%d/%d/%d, want %d/%d/%d/%d/%d (in work known: %v)",
			c.Ready, c.Scheduled, c.InWork, c.Dead, c.Done, want.Ready, want.Scheduled, want.InWork, want.Dead, want.Done, c.InWorkKnown)
	}
	if c.InWorkKnown != (f == sqlxbroker.Lease) {
		t.Errorf("InWorkKnown = %v in the %s form", c.InWorkKnown, f)
	}

	// List: every dead row once, in ID order, pages of 7.
	var listed []any
	var after any
	for pages := 0; ; pages++ {
		pg, err := b.List(ctx, tb, sqlxbroker.ListParams{State: sqlxbroker.StateDead, After: after, Limit: 7})
		if err != nil {
			t.Fatalf("list dead: %v", err)
		}
		for _, r := range pg.Rows {
			if v, _ := r.Value("body"); v != "dead" || r.Attempt != 1 {
				t.Errorf("listed dead row %v: body %v, attempt %d", r.ID, v, r.Attempt)
			}
			listed = append(listed, r.ID)
		}
		if pg.Next == nil || pages > dead {
			break
		}
		after = pg.Next
	}
	if len(listed) != dead {
		t.Errorf("listed %d dead rows, want %d", len(listed), dead)
	}

	// Delete the ready rows while rows are in work: the rows in work stay.
	n, err := b.Delete(ctx, tb, sqlxbroker.DeleteParams{State: sqlxbroker.StateReady, Select: sqlxbroker.Select{All: true, BatchSize: 9}})
	switch {
	case f == sqlxbroker.Advisory:
		if !errors.Is(err, sqlxbroker.ErrRowsInWork) {
			t.Errorf("delete ready rows in the advisory form: %v, want ErrRowsInWork", err)
		}
	case err != nil:
		t.Fatalf("delete ready rows: %v", err)
	case n != ready-inWork:
		t.Errorf("deleted %d ready rows, want %d (the %d in work stay)", n, ready-inWork, inWork)
	}
	close(h.release)
	if f != sqlxbroker.Advisory {
		WaitFor(t, 30*time.Second, "the rows in work completed", func() bool { return s.Stats().Succeeded == inWork })
		if st := s.Stats(); st.LeaseLost != 0 || st.CompleteErrors != 0 {
			t.Errorf("a row in work was touched: stats %+v", st)
		}
	} else {
		WaitFor(t, 30*time.Second, "the ready rows completed", func() bool { return s.Stats().Succeeded == ready })
	}
	q := tg.Dialect.QuoteIdent
	if got := count(t, b.DB(), tg.Dialect, tb.Name, q("body")+" = ? AND "+q("done_at")+" IS NOT NULL", "ready"); got != inWork && f != sqlxbroker.Advisory {
		t.Errorf("%d of the rows in work are done, want all %d", got, inWork)
	}

	// Requeue half the dead rows by ID, then the rest: each is delivered once.
	n, err = b.Requeue(ctx, tb, sqlxbroker.Select{IDs: listed[:dead/2]})
	if err != nil || n != dead/2 {
		t.Fatalf("requeue by IDs: %d, %v; want %d", n, err, dead/2)
	}
	n, err = b.Requeue(ctx, tb, sqlxbroker.Select{All: true, BatchSize: 5})
	if err != nil || n != dead-dead/2 {
		t.Fatalf("requeue all: %d, %v; want %d", n, err, dead-dead/2)
	}
	WaitFor(t, 30*time.Second, "the requeued rows completed", func() bool {
		return count(t, b.DB(), tg.Dialect, tb.Name, q("body")+" = ? AND "+q("done_at")+" IS NOT NULL", "dead") == dead
	})
	if tw := h.twice(); len(tw) > 0 {
		t.Errorf("rows delivered twice: %v", tw)
	}
	h.mu.Lock()
	if h.notFirst != 0 {
		t.Errorf("%d deliveries reported an attempt other than 1 (requeued rows start again at 1)", h.notFirst)
	}
	h.mu.Unlock()
	if got := count(t, b.DB(), tg.Dialect, tb.Name, q("body")+" = ? AND "+q("last_error")+" IS NOT NULL", "dead"); got != 0 {
		t.Errorf("%d requeued rows kept a last error", got)
	}

	// Prune: the done rows older than an hour go, the fresh ones stay.
	n, err = b.Prune(ctx, tb, sqlxbroker.PruneParams{OlderThan: time.Hour, BatchSize: 2})
	if err != nil || n != done {
		t.Errorf("prune: %d, %v; want %d", n, err, done)
	}
	c = counts(t, b, tb)
	if wantDone := int64(dead + inWork); f == sqlxbroker.Advisory && c.Done != int64(dead+ready) || f != sqlxbroker.Advisory && c.Done != wantDone {
		t.Errorf("after prune %d done rows", c.Done)
	}

	// Delete dead rows: publish more, delete them all.
	publishState(t, tg, b, tb, "dead2", 11, map[string]time.Time{"dead_at": now})
	if n, err := b.Delete(ctx, tb, sqlxbroker.DeleteParams{State: sqlxbroker.StateDead, Select: sqlxbroker.Select{All: true, BatchSize: 4}}); err != nil || n != 11 {
		t.Errorf("delete dead: %d, %v; want 11", n, err)
	}
	if c := counts(t, b, tb); c.Dead != 0 {
		t.Errorf("%d dead rows after deleting them all", c.Dead)
	}

	// Bad input names the problem and changes nothing.
	if _, err := sqlxbroker.ParseState("zombie"); err == nil {
		t.Errorf("ParseState accepted an unknown state")
	}
	if _, err := b.List(ctx, tb, sqlxbroker.ListParams{State: "zombie"}); err == nil {
		t.Errorf("List accepted an unknown state")
	}
	plain := tb
	plain.DoneAt = ""
	if _, err := b.Prune(ctx, plain, sqlxbroker.PruneParams{OlderThan: time.Hour}); !errors.Is(err, sqlxbroker.ErrInvalidTable) {
		t.Errorf("prune without a DoneAt column: %v, want ErrInvalidTable", err)
	}
	missing := tb
	missing.LastError = "no_such_column"
	if _, err := b.Counts(ctx, missing); !errors.Is(err, sqlxbroker.ErrInvalidTable) {
		t.Errorf("counts of a description naming a missing column: %v, want ErrInvalidTable", err)
	}
	if _, err := b.Requeue(ctx, tb, sqlxbroker.Select{}); err == nil {
		t.Errorf("requeue with nothing selected was accepted")
	}
	if _, err := b.Delete(ctx, tb, sqlxbroker.DeleteParams{State: sqlxbroker.StateInWork, Select: sqlxbroker.Select{All: true}}); err == nil {
		t.Errorf("deleting rows in work was accepted")
	}
}

// OperationsPassRowsInWork (row-lock form, whose rows in work stay locked
// by their deliveries' transactions while the handlers run): on a table
// of 30 rows, small enough for a database to plan a statement over a list
// of ids as a scan, with one ready row in work, Delete of the ready rows
// and of the dead, Requeue of the dead and Prune of the done each finish
// at once and change every row of their state but the one in work. A
// statement over the list that waits for the row in work, though it is
// not in the list (core.Features.ListScanWaits unset on a database that
// does that), fails here after opsLimit instead of the database's lock
// wait timeout.
func OperationsPassRowsInWork(t TB, tg *Target, f sqlxbroker.Form) {
	const each = 10 // ready, dead and done rows
	b := tg.broker(t)
	for _, op := range []struct {
		name string
		run  func(ctx context.Context, tb sqlxbroker.Table) (int64, error)
		want int64
		left func(c sqlxbroker.Counts) int64 // rows of the state changed, after
	}{
		{"delete ready rows", func(ctx context.Context, tb sqlxbroker.Table) (int64, error) {
			return b.Delete(ctx, tb, sqlxbroker.DeleteParams{State: sqlxbroker.StateReady, Select: sqlxbroker.Select{All: true}})
		}, each - 1, func(c sqlxbroker.Counts) int64 { return c.Ready - 1 }}, // the row in work counts as ready
		{"delete dead rows", func(ctx context.Context, tb sqlxbroker.Table) (int64, error) {
			return b.Delete(ctx, tb, sqlxbroker.DeleteParams{State: sqlxbroker.StateDead, Select: sqlxbroker.Select{All: true}})
		}, each, func(c sqlxbroker.Counts) int64 { return c.Dead }},
		{"requeue dead rows", func(ctx context.Context, tb sqlxbroker.Table) (int64, error) {
			return b.Requeue(ctx, tb, sqlxbroker.Select{All: true})
		}, each, func(c sqlxbroker.Counts) int64 { return c.Dead }},
		{"prune done rows", func(ctx context.Context, tb sqlxbroker.Table) (int64, error) {
			return b.Prune(ctx, tb, sqlxbroker.PruneParams{OlderThan: time.Hour})
		}, each, func(c sqlxbroker.Counts) int64 { return c.Done }},
	} {
		tb := tg.fresh(t, b.DB(), f, opsTable)
		now := time.Now()
		publishState(t, tg, b, tb, "ready", each, nil)
		publishState(t, tg, b, tb, "dead", each, map[string]time.Time{"dead_at": now.Add(-time.Minute)})
		publishState(t, tg, b, tb, "done", each, map[string]time.Time{"done_at": now.Add(-2 * time.Hour)})
		h := newHeld()
		p := quick
		p.Concurrency = 1
		s := subscribe(t, b, tb, h.handle, p)
		WaitFor(t, 30*time.Second, "a handler holds its row", func() bool { return s.InFlight() == 1 })
		ctx, cancel := context.WithTimeout(context.Background(), opsLimit)
		began := time.Now()
		n, err := op.run(ctx, tb)
		cancel()
		if err != nil {
			t.Fatalf("%s with a row in work: %v (after %v)", op.name, err, time.Since(began).Round(time.Millisecond))
		}
		if n != op.want {
			t.Errorf("%s with a row in work: %d rows, want %d", op.name, n, op.want)
		}
		if left := op.left(counts(t, b, tb)); left != 0 {
			t.Errorf("%s with a row in work: %d rows of the state left", op.name, left)
		}
		close(h.release)
		WaitFor(t, 30*time.Second, "the row in work completed", func() bool { return s.Stats().Succeeded >= 1 })
		if tw := h.twice(); len(tw) > 0 {
			t.Errorf("%s: rows delivered twice: %v", op.name, tw)
		}
	}
}

// opsLimit bounds each operation of OperationsPassRowsInWork: far beyond
// what 30 rows take, and short of a lock wait timeout (MariaDB's 50 s).
const opsLimit = 20 * time.Second

// OperationsAtScale (lease form: its drain is the fastest, so the 120,000
// deliveries fit the suite's time; Operations checks every form's
// guarantees): 100,000 dead rows are requeued in batches while a
// subscription drains the table, then 100,000 more are deleted in batches
// while it drains more: every live and requeued row is delivered exactly
// once, nothing dead is left, nothing is lost.
func OperationsAtScale(t TB, tg *Target, f sqlxbroker.Form) {
	ctx := context.Background()
	b := tg.broker(t)
	// The default 30 s lease, as in ExactlyOnce: a busy machine must not
	// make a renewal miss the suite's 2 s lease, which would deliver a row
	// again by design.
	tb := tg.fresh(t, b.DB(), f, func(tb *sqlxbroker.Table) { opsTable(tb); tb.Lease = 0 })
	n := volume(tg, 100000, 5000)
	live := n / 5
	publishState(t, tg, b, tb, "dead", n, map[string]time.Time{"dead_at": time.Now()})
	publishState(t, tg, b, tb, "live", live, nil)
	h := newHeld()
	close(h.release)
	p := quick
	p.Concurrency = 32
	s := subscribe(t, b, tb, h.handle, p)
	begin := time.Now()
	req, err := b.Requeue(ctx, tb, sqlxbroker.Select{All: true})
	requeued := time.Since(begin)
	if err != nil || req != int64(n) {
		t.Fatalf("requeue %d dead rows under a drain: %d, %v", n, req, err)
	}
	succeeded := func() int64 { return s.Stats().Succeeded }
	waitDrain(t, 2*time.Minute, "the live and requeued rows to complete", int64(n+live), succeeded)
	drained := time.Since(begin)
	publishState(t, tg, b, tb, "dead2", n, map[string]time.Time{"dead_at": time.Now()})
	publishState(t, tg, b, tb, "live2", live, nil)
	begin = time.Now()
	del, err := b.Delete(ctx, tb, sqlxbroker.DeleteParams{State: sqlxbroker.StateDead, Select: sqlxbroker.Select{All: true}})
	deleted := time.Since(begin)
	if err != nil || del != int64(n) {
		t.Fatalf("delete %d dead rows under a drain: %d, %v", n, del, err)
	}
	waitDrain(t, 2*time.Minute, "the second live rows to complete", int64(n+2*live), succeeded)
	t.Logf("requeued %d rows in %v, all delivered in %v; deleted %d in %v, the rest delivered in %v",
		n, requeued.Round(time.Millisecond), drained.Round(time.Millisecond), n, deleted.Round(time.Millisecond), time.Since(begin).Round(time.Millisecond))
	if err := s.Stop(ctx); err != nil {
		t.Errorf("stop: %v", err)
	}
	if tw := h.twice(); len(tw) > 0 {
		t.Errorf("%d rows delivered twice, e.g. %v", len(tw), tw[0])
	}
	h.mu.Lock()
	handled := len(h.seen)
	h.mu.Unlock()
	if handled != n+2*live {
		t.Errorf("handled %d rows, want %d", handled, n+2*live)
	}
	c := counts(t, b, tb)
	if c.Ready != 0 || c.Dead != 0 || c.Done != int64(n+2*live) {
		t.Errorf("counts after the drains: %+v, want %d done and nothing else", c, n+2*live)
	}
	if st := s.Stats(); st.Retried != 0 || st.LeaseLost != 0 || st.CompleteErrors != 0 {
		t.Errorf("stats %+v", st)
	}
}
