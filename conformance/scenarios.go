package conformance

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/core"
)

// quick is the suite's subscription tuning: fast polls, immediate retries,
// and no log noise (lease losses a scenario provokes are counted in Stats).
var quick = sqlxbroker.SubscribeParams{MinPollInterval: 2 * time.Millisecond, PollInterval: 50 * time.Millisecond,
	RetryDelay: func(int, error) time.Duration { return 0 }, Logger: suiteLogger()}

// suiteLogger discards the engine's log unless SQLXBROKER_CONFORMANCE_LOG=1.
func suiteLogger() *slog.Logger {
	if env("SQLXBROKER_CONFORMANCE_LOG") == "1" {
		return slog.Default()
	}
	return slog.New(slog.DiscardHandler)
}

func subscribe(t TB, b *sqlxbroker.Broker, tb sqlxbroker.Table, h sqlxbroker.Handler, p sqlxbroker.SubscribeParams) *sqlxbroker.Subscription {
	t.Helper()
	s, err := b.Subscribe(context.Background(), tb, h, p)
	if err != nil {
		t.Fatalf("subscribe: %v", err)
	}
	t.Cleanup(func() { stopSoon(t, s) })
	return s
}

// stopLimit is how long a scenario's subscription has to stop after the
// scenario ends, before its handlers' contexts are cancelled.
const stopLimit = 30 * time.Second

// stopSoon stops s as a scenario ends. A scenario that failed may have left
// handlers waiting for a step it never took: their contexts are cancelled
// at once. One that passed lets in-flight deliveries finish for up to
// stopLimit. Either way the scenario ends instead of hanging on a handler.
func stopSoon(t TB, s *sqlxbroker.Subscription) {
	limit := stopLimit
	if t.Failed() {
		limit = 0
	}
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	if err := s.Stop(ctx); errors.Is(err, context.DeadlineExceeded) && limit > 0 {
		t.Errorf("the subscription did not stop within %v of the scenario's end; its handlers were cancelled", limit)
	}
}

// ExactlyOnce: several subscriptions in two brokers drain a table; every row
// is completed exactly once and none is left.
func ExactlyOnce(t TB, tg *Target, f sqlxbroker.Form) {
	b1, b2 := tg.broker(t), tg.broker(t)
	// The default 30 s lease: exactly once holds while leases are kept, and
	// a busy test machine must not make a renewal miss a 2 s lease.
	tb := tg.fresh(t, b1.DB(), f, func(tb *sqlxbroker.Table) { tb.Lease = 0 })
	n := volume(tg, 5000, 500)
	msgs := make([]msg, n)
	for i := range msgs {
		msgs[i] = msg{Acct: fmt.Sprint(i % 50), Body: fmt.Sprint(i)}
	}
	publish(t, b1, tb, msgs...)
	var mu sync.Mutex
	seen := map[string]int{}
	h := func(ctx context.Context, d *sqlxbroker.Delivery) error {
		var m msg
		if err := d.Scan(&m); err != nil {
			return err
		}
		mu.Lock()
		seen[m.Body]++
		mu.Unlock()
		return nil
	}
	p := quick
	p.Concurrency = 8
	var subs []*sqlxbroker.Subscription
	for i := 0; i < 4; i++ {
		subs = append(subs, subscribe(t, b1, tb, h, p), subscribe(t, b2, tb, h, p))
	}
	WaitFor(t, 2*time.Minute, "every row completed", func() bool {
		var done int64
		for _, s := range subs {
			done += s.Stats().Succeeded
		}
		return done >= int64(n)
	})
	for _, s := range subs {
		if err := s.Stop(context.Background()); err != nil {
			t.Errorf("stop: %v", err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != n {
		t.Errorf("handled %d distinct rows, want %d", len(seen), n)
	}
	for body, k := range seen {
		if k != 1 {
			t.Errorf("row %s handled %d times, want 1", body, k)
		}
	}
	if left := count(t, b1.DB(), tg.Dialect, tb.Name, ""); left != 0 {
		t.Errorf("%d rows left in the table, want 0", left)
	}
}

// SkipLocked: while one broker holds a row, another's claim passes over it
// at once and returns the other rows.
func SkipLocked(t TB, tg *Target, f sqlxbroker.Form) {
	b1, b2 := tg.broker(t), tg.broker(t)
	tb := tg.fresh(t, b1.DB(), f, nil)
	publish(t, b1, tb, msg{Acct: "a", Body: "held"}, msg{Acct: "b"}, msg{Acct: "c"}, msg{Acct: "d"})
	holder := form(t, b1, tb)
	held := claim(t, holder, 1)
	if len(held) != 1 {
		t.Fatalf("holder claimed %d rows, want 1", len(held))
	}
	defer complete(t, held[0], sqlxbroker.Released)
	other := form(t, b2, tb)
	// The row-lock and advisory forms take a connection per row: open
	// them first, so the time measured is the claim's, not the dials'.
	warm(t, b2.DB(), 4)
	begin := time.Now()
	got := claim(t, other, 10)
	took := time.Since(begin)
	if took > 200*time.Millisecond {
		t.Errorf("claim took %v with one row held elsewhere, want under 200ms (it must skip, not wait)", took)
	}
	if len(got) != 3 {
		t.Errorf("claimed %v, want the 3 rows not held", ids(got))
	}
	for _, c := range got {
		if idOf(c) == idOf(held[0]) {
			t.Errorf("claimed row %s that another broker holds", idOf(c))
		}
		complete(t, c, sqlxbroker.Succeeded)
	}
}

// warm opens n connections of db at once and returns them to its idle pool.
func warm(t TB, db *sqlx.DB, n int) {
	t.Helper()
	var conns []*sqlx.Conn
	for i := 0; i < n; i++ {
		c, err := db.Connx(context.Background())
		if err != nil {
			t.Fatalf("open a connection: %v", err)
		}
		conns = append(conns, c)
	}
	for _, c := range conns {
		c.Close()
	}
}

// Attempts: the first delivery reads 1 in every form, a returned row's next
// delivery reads 2, and the attempt column holds the number the next
// delivery will report.
func Attempts(t TB, tg *Target, f sqlxbroker.Form) {
	b := tg.broker(t)
	tb := tg.fresh(t, b.DB(), f, nil)
	publish(t, b, tb, msg{Acct: "a"})
	fm := form(t, b, tb)
	for want := 1; want <= 3; want++ {
		cs := claim(t, fm, 1)
		if len(cs) != 1 {
			t.Fatalf("delivery %d: claimed %d rows, want 1", want, len(cs))
		}
		if got := sqlxbroker.NewDelivery(cs[0]).Attempt(); got != want {
			t.Errorf("delivery %d reports attempt %d", want, got)
		}
		complete(t, cs[0], sqlxbroker.Retry)
		if got := count(t, b.DB(), tg.Dialect, tb.Name, tg.Dialect.QuoteIdent("attempt")+" = ?", want+1); got != 1 {
			t.Errorf("after delivery %d failed the attempt column is not %d", want, want+1)
		}
	}
}

// Outcomes: success removes the row, failure returns it, the last allowed
// attempt moves it to the dead state and keeps it; a dead row is not claimed.
func Outcomes(t TB, tg *Target, f sqlxbroker.Form) {
	b := tg.broker(t)
	tb := tg.fresh(t, b.DB(), f, func(tb *sqlxbroker.Table) { tb.MaxAttempts = 2 })
	publish(t, b, tb, msg{Acct: "ok", Body: "ok"}, msg{Acct: "bad", Body: "bad"})
	var calls sync.Map
	s := subscribe(t, b, tb, func(ctx context.Context, d *sqlxbroker.Delivery) error {
		var m msg
		if err := d.Scan(&m); err != nil {
			return err
		}
		n, _ := calls.LoadOrStore(m.Body, new(atomic.Int32))
		n.(*atomic.Int32).Add(1)
		if m.Body == "bad" {
			if d.Attempt()%2 == 1 {
				panic("a handler panic is a failure")
			}
			return errors.New("fails every time")
		}
		return nil
	}, quick)
	WaitFor(t, 30*time.Second, "one success and one dead row", func() bool {
		st := s.Stats()
		return st.Succeeded == 1 && st.Dead == 1
	})
	_ = s.Stop(context.Background())
	st := s.Stats()
	if st.Retried != 1 || st.Panics != 1 {
		t.Errorf("stats %+v: want 1 retry (a panic) before the dead row", st)
	}
	q := tg.Dialect.QuoteIdent
	if n := count(t, b.DB(), tg.Dialect, tb.Name, q("body")+" = ?", "ok"); n != 0 {
		t.Errorf("the succeeded row is still there")
	}
	if n := count(t, b.DB(), tg.Dialect, tb.Name, q("body")+" = ? AND "+q("dead_at")+" IS NOT NULL AND "+q("attempt")+" = ?", "bad", 3); n != 1 {
		t.Errorf("the failing row is not kept dead with attempt 3 after 2 deliveries")
	}
	if v, _ := calls.Load("bad"); v == nil || v.(*atomic.Int32).Load() != 2 {
		t.Errorf("the failing row was handled %v times, want 2", v)
	}
	if cs := claim(t, form(t, b, tb), 5); len(cs) != 0 {
		t.Errorf("a dead row was claimed again")
	}
}

// LeaseLoss: a completion after another claim took the row returns
// ErrLeaseLost and changes nothing.
func LeaseLoss(t TB, tg *Target, f sqlxbroker.Form) {
	b1, b2 := tg.broker(t), tg.broker(t)
	tb := tg.fresh(t, b1.DB(), f, func(tb *sqlxbroker.Table) { tb.Lease = time.Second })
	publish(t, b1, tb, msg{Acct: "a"})
	first := form(t, b1, tb)
	old := claim(t, first, 1)
	if len(old) != 1 {
		t.Fatalf("claimed %d rows, want 1", len(old))
	}
	select {
	case <-Lost(old[0]):
		t.Fatalf("lease reported lost at once")
	default:
	}
	first.Close() // renewals stop: the lease is abandoned
	select {
	case <-Lost(old[0]):
	case <-time.After(5 * time.Second):
		t.Fatalf("an abandoned lease was not reported lost after its deadline")
	}
	second := form(t, b2, tb)
	var again []core.Claim
	WaitFor(t, 10*time.Second, "the abandoned lease to be claimed again", func() bool {
		again = claim(t, second, 1)
		return len(again) == 1
	})
	if a := sqlxbroker.NewDelivery(again[0]).Attempt(); a != 2 {
		t.Errorf("redelivery of an abandoned lease reports attempt %d, want 2", a)
	}
	before := snapshot(t, tg, b1, tb)
	for _, k := range []sqlxbroker.OutcomeKind{sqlxbroker.Succeeded, sqlxbroker.Retry, sqlxbroker.Dead} {
		err := Complete(context.Background(), old[0], sqlxbroker.Outcome{Kind: k})
		if !errors.Is(err, sqlxbroker.ErrLeaseLost) {
			t.Errorf("stale %s completion returned %v, want ErrLeaseLost", k, err)
		}
		if after := snapshot(t, tg, b1, tb); after != before {
			t.Errorf("stale %s completion changed the row:\n before %s\n after  %s", k, before, after)
		}
	}
	complete(t, again[0], sqlxbroker.Succeeded)
	if n := count(t, b1.DB(), tg.Dialect, tb.Name, ""); n != 0 {
		t.Errorf("the current lease holder's completion left the row")
	}
}

func snapshot(t TB, tg *Target, b *sqlxbroker.Broker, tb sqlxbroker.Table) string {
	t.Helper()
	rows, err := b.DB().Queryx("SELECT * FROM " + tg.Dialect.QuoteIdent(tb.Name) + " ORDER BY " + tg.Dialect.QuoteIdent("id"))
	if err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	defer rows.Close()
	var sb strings.Builder
	for rows.Next() {
		vals, err := rows.SliceScan()
		if err != nil {
			t.Fatalf("snapshot: %v", err)
		}
		for _, v := range vals {
			if bs, ok := v.([]byte); ok {
				v = string(bs)
			}
			fmt.Fprintf(&sb, "%v|", v)
		}
		sb.WriteString("\n")
	}
	return sb.String()
}

// Renewal: a handler running three times its lease keeps the row through
// renewals, nobody else gets it, and it completes normally.
func Renewal(t TB, tg *Target, f sqlxbroker.Form) {
	b1, b2 := tg.broker(t), tg.broker(t)
	tb := tg.fresh(t, b1.DB(), f, func(tb *sqlxbroker.Table) { tb.Lease = time.Second })
	publish(t, b1, tb, msg{Acct: "a"})
	var runs atomic.Int32
	h := func(ctx context.Context, d *sqlxbroker.Delivery) error {
		runs.Add(1)
		select {
		case <-time.After(3 * time.Second):
			return nil
		case <-ctx.Done():
			return fmt.Errorf("handler context ended: %w", ctx.Err())
		}
	}
	s1 := subscribe(t, b1, tb, h, quick)
	WaitFor(t, 5*time.Second, "the first delivery", func() bool { return runs.Load() == 1 })
	s2 := subscribe(t, b2, tb, h, quick)
	WaitFor(t, 10*time.Second, "the long handler to complete", func() bool { return s1.Stats().Succeeded == 1 })
	_ = s2.Stop(context.Background())
	if st := s1.Stats(); st.LeaseLost != 0 || st.Retried != 0 {
		t.Errorf("stats %+v: the renewed lease was lost", st)
	}
	if r := runs.Load(); r != 1 {
		t.Errorf("handler ran %d times, want 1 (a renewed lease is not claimed by others)", r)
	}
	if n := count(t, b1.DB(), tg.Dialect, tb.Name, ""); n != 0 {
		t.Errorf("the row is still there after completion")
	}
}

// FIFO: two brokers on one table deliver each group in order, at most one
// row of a group in work, while other groups run alongside.
func FIFO(t TB, tg *Target, f sqlxbroker.Form) {
	b1, b2 := tg.broker(t), tg.broker(t)
	tb := tg.fresh(t, b1.DB(), f, func(tb *sqlxbroker.Table) { tb.Group = "grp" })
	const groups = 3
	per := volume(tg, 40, 15)
	var msgs []msg
	for i := 0; i < per; i++ {
		for g := 0; g < groups; g++ {
			// Distinct keys per row, so the advisory form's keys do not
			// order the rows: the group guard must.
			msgs = append(msgs, msg{Grp: fmt.Sprint("g", g), Acct: fmt.Sprint(g, "-", i), Body: fmt.Sprint(i)})
		}
	}
	publish(t, b1, tb, msgs...)
	var mu sync.Mutex
	last := map[string]int{}
	inWork := map[string]int{}
	var total, peak int
	var disorder []string
	h := func(ctx context.Context, d *sqlxbroker.Delivery) error {
		var m msg
		if err := d.Scan(&m); err != nil {
			return err
		}
		var seq int
		fmt.Sscan(m.Body, &seq)
		mu.Lock()
		inWork[m.Grp]++
		total++
		peak = max(peak, total)
		if inWork[m.Grp] > 1 {
			disorder = append(disorder, fmt.Sprintf("group %s: %d rows in work", m.Grp, inWork[m.Grp]))
		}
		if prev, ok := last[m.Grp]; ok && seq != prev+1 {
			disorder = append(disorder, fmt.Sprintf("group %s: %d after %d", m.Grp, seq, prev))
		} else if !ok && seq != 0 {
			disorder = append(disorder, fmt.Sprintf("group %s starts at %d", m.Grp, seq))
		}
		last[m.Grp] = seq
		mu.Unlock()
		time.Sleep(2 * time.Millisecond)
		mu.Lock()
		inWork[m.Grp]--
		total--
		mu.Unlock()
		return nil
	}
	p := quick
	p.Concurrency = 4
	subs := []*sqlxbroker.Subscription{subscribe(t, b1, tb, h, p), subscribe(t, b2, tb, h, p)}
	WaitFor(t, 2*time.Minute, "every row delivered", func() bool {
		return subs[0].Stats().Succeeded+subs[1].Stats().Succeeded >= int64(len(msgs))
	})
	mu.Lock()
	defer mu.Unlock()
	for _, d := range disorder {
		t.Errorf("%s", d)
	}
	if peak < 2 {
		t.Errorf("at most %d row in work at once: other groups were blocked", peak)
	}
	if subs[0].Stats().Succeeded == 0 || subs[1].Stats().Succeeded == 0 {
		t.Logf("one broker delivered every row: %+v %+v", subs[0].Stats(), subs[1].Stats())
	}
}

// AdvisoryKeys: rows with equal keys never run at once, rows with different
// keys do, and equal keys in two tables wait for each other.
func AdvisoryKeys(t TB, tg *Target, f sqlxbroker.Form) {
	b1, b2 := tg.broker(t), tg.broker(t)
	tb := tg.fresh(t, b1.DB(), f, nil)
	var msgs []msg
	for i := 0; i < volume(tg, 60, 30); i++ {
		msgs = append(msgs, msg{Acct: fmt.Sprint(i % 3), Body: fmt.Sprint(i)})
	}
	publish(t, b1, tb, msgs...)
	var mu sync.Mutex
	inWork := map[string]int{}
	var total, peak int
	var overlaps []string
	h := func(ctx context.Context, d *sqlxbroker.Delivery) error {
		mu.Lock()
		inWork[d.Key()]++
		total++
		peak = max(peak, total)
		if inWork[d.Key()] > 1 {
			overlaps = append(overlaps, d.Key())
		}
		mu.Unlock()
		time.Sleep(3 * time.Millisecond)
		mu.Lock()
		inWork[d.Key()]--
		total--
		mu.Unlock()
		return nil
	}
	subs := []*sqlxbroker.Subscription{subscribe(t, b1, tb, h, quick), subscribe(t, b2, tb, h, quick)}
	WaitFor(t, time.Minute, "every row delivered", func() bool {
		return subs[0].Stats().Succeeded+subs[1].Stats().Succeeded >= int64(len(msgs))
	})
	mu.Lock()
	if len(overlaps) > 0 {
		t.Errorf("rows with equal keys ran at once: %v", overlaps)
	}
	if peak < 2 {
		t.Errorf("rows with different keys never ran at once (peak %d)", peak)
	}
	mu.Unlock()
	for _, s := range subs {
		_ = s.Stop(context.Background())
	}

	// Two tables, one key: the key belongs to the database.
	other := tg.fresh(t, b1.DB(), f, nil)
	publish(t, b1, tb, msg{Acct: "shared"})
	publish(t, b1, other, msg{Acct: "shared"})
	holder := form(t, b1, tb)
	held := claim(t, holder, 1)
	if len(held) != 1 {
		t.Fatalf("claimed %d rows, want 1", len(held))
	}
	waiter := form(t, b2, other)
	if got := claim(t, waiter, 1); len(got) != 0 {
		t.Errorf("a row of another table with an equal key was claimed while the key was held")
		for _, c := range got {
			complete(t, c, sqlxbroker.Released)
		}
	}
	complete(t, held[0], sqlxbroker.Succeeded)
	var got []core.Claim
	WaitFor(t, 5*time.Second, "the other table's row once the key is free", func() bool {
		got = claim(t, waiter, 1)
		return len(got) == 1
	})
	complete(t, got[0], sqlxbroker.Succeeded)
}

// HandlerTx: in the row-lock form the handler's writes through Delivery.Tx
// commit with success and roll back with failure, while the attempt is
// still counted.
func HandlerTx(t TB, tg *Target, f sqlxbroker.Form) {
	b := tg.broker(t)
	tb := tg.fresh(t, b.DB(), f, nil)
	side := tg.fresh(t, b.DB(), f, nil) // a second table to write into
	publish(t, b, tb, msg{Acct: "a", Body: "fail"}, msg{Acct: "b", Body: "ok"})
	q := tg.Dialect.QuoteIdent
	s := subscribe(t, b, tb, func(ctx context.Context, d *sqlxbroker.Delivery) error {
		tx, err := d.Tx()
		if err != nil {
			return err
		}
		var m msg
		if err := d.Scan(&m); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, tx.Rebind("INSERT INTO "+q(side.Name)+" ("+q("body")+", "+q("attempt")+") VALUES (?, 1)"), fmt.Sprint(m.Body, d.Attempt())); err != nil {
			return err
		}
		if m.Body == "fail" && d.Attempt() == 1 {
			return errors.New("fail once")
		}
		return nil
	}, quick)
	WaitFor(t, 20*time.Second, "both rows completed", func() bool { return s.Stats().Succeeded == 2 })
	_ = s.Stop(context.Background())
	for _, c := range []struct {
		body string
		want int
	}{{"fail1", 0}, {"fail2", 1}, {"ok1", 1}} {
		if n := count(t, b.DB(), tg.Dialect, side.Name, q("body")+" = ?", c.body); n != c.want {
			t.Errorf("handler write %q committed %d times, want %d", c.body, n, c.want)
		}
	}
}

// TxAfterCompletion: in the row-lock form a delivery's transaction is the
// handler's only while it runs. A handler that kept its delivery and asks
// for the transaction afterwards gets sql.ErrTxDone, never a transaction
// that now holds another row (a dialect that chains commits, RowLockSQL.ChainCommit,
// goes on in the same transaction). Once the table is drained the
// subscription keeps no connection in use while it waits for rows.
func TxAfterCompletion(t TB, tg *Target, f sqlxbroker.Form) {
	b := tg.broker(t)
	tb := tg.fresh(t, b.DB(), f, nil)
	const rows = 40
	msgs := make([]msg, rows)
	for i := range msgs {
		msgs[i] = msg{Acct: fmt.Sprint("a", i)}
	}
	publish(t, b, tb, msgs...)
	var mu sync.Mutex
	var kept []*sqlxbroker.Delivery
	p := quick
	p.Concurrency = 4
	p.Wake = make(chan struct{}) // no listening connection
	s := subscribe(t, b, tb, func(ctx context.Context, d *sqlxbroker.Delivery) error {
		mu.Lock()
		kept = append(kept, d)
		mu.Unlock()
		return nil
	}, p)
	WaitFor(t, 30*time.Second, "every row completed", func() bool { return s.Stats().Succeeded == rows })
	mu.Lock()
	defer mu.Unlock()
	for _, d := range kept {
		if tx, err := d.Tx(); !errors.Is(err, sql.ErrTxDone) {
			t.Fatalf("Delivery.Tx after the delivery completed: %v, %v; want sql.ErrTxDone", tx, err)
		}
	}
	WaitFor(t, 10*time.Second, "no connection in use by the idle subscription", func() bool { return b.DB().Stats().InUse == 0 })
}

// Unavailable: a form the dialect does not offer fails with
// ErrFormUnavailable at subscribe time.
func Unavailable(t TB, tg *Target, f sqlxbroker.Form) {
	b := tg.broker(t)
	tb := sqlxbroker.Table{Name: "cf_unavailable", DeadAt: "dead_at"}
	switch f {
	case sqlxbroker.Lease:
		tb.LockedUntil = "locked_until"
	case sqlxbroker.Advisory:
		tb.AdvisoryLock = "acct-{acct}"
	}
	_, err := b.Subscribe(context.Background(), tb, func(context.Context, *sqlxbroker.Delivery) error { return nil }, quick)
	if !errors.Is(err, sqlxbroker.ErrFormUnavailable) {
		t.Fatalf("subscribing to a %s table returned %v, want ErrFormUnavailable", f, err)
	}
	if !strings.Contains(err.Error(), f.String()) {
		t.Errorf("error %q does not name the form", err)
	}
}

// Refused (forms in Target.Refuses): subscribing to a valid table of form f,
// with a row ready, fails at start with a *sqlxbroker.FormError for f
// (ErrFormUnavailable) whose reason says why, as does starting the form
// by hand (Broker.Form), and the row is left as it was: never claimed.
func Refused(t TB, tg *Target, f sqlxbroker.Form) {
	b := tg.broker(t)
	tb := tg.fresh(t, b.DB(), f, nil)
	publish(t, b, tb, msg{Acct: "a"})
	before := snapshot(t, tg, b, tb)
	check := func(what string, err error) {
		t.Helper()
		var fe *sqlxbroker.FormError
		switch {
		case err == nil:
			t.Errorf("%s succeeded on a target that must refuse the %s form", what, f)
		case !errors.As(err, &fe) || !errors.Is(err, sqlxbroker.ErrFormUnavailable):
			t.Errorf("%s: %v, want a *sqlxbroker.FormError (ErrFormUnavailable)", what, err)
		case fe.Form != f || fe.Reason == "":
			t.Errorf("%s: FormError for the %s form with reason %q, want the %s form and a reason", what, fe.Form, fe.Reason, f)
		default:
			t.Logf("%s: %v", what, err)
		}
	}
	s, err := b.Subscribe(context.Background(), tb, func(context.Context, *sqlxbroker.Delivery) error {
		t.Errorf("a refused subscription delivered a row")
		return nil
	}, quick)
	if s != nil {
		_ = s.Stop(context.Background())
	}
	check("Subscribe", err)
	cf, err := b.Form(tb)
	if err != nil {
		t.Fatalf("form: %v", err)
	}
	err = cf.Start(context.Background())
	check("the form's Start", err)
	if err == nil {
		cf.Close()
	}
	if after := snapshot(t, tg, b, tb); after != before {
		t.Errorf("the refusal changed the table:\n before %s\n after  %s", before, after)
	}
}

// BadDescriptions: each bad table description fails at subscribe time with
// an error that names the problem, and the table does not change.
func BadDescriptions(t TB, tg *Target, f sqlxbroker.Form) {
	b := tg.broker(t)
	tb := tg.fresh(t, b.DB(), f, nil)
	publish(t, b, tb, msg{Acct: "a"})
	before := snapshot(t, tg, b, tb)
	cases := []struct {
		name, want string
		edit       func(*sqlxbroker.Table)
	}{
		{"missing column", "no_such", func(x *sqlxbroker.Table) { x.ReadyAt = "no_such" }},
		{"unknown key column", "nope", func(x *sqlxbroker.Table) { x.LockedUntil, x.Lease, x.AdvisoryLock = "", 0, "k-{nope}" }},
		{"fractional lease", "1.5s", func(x *sqlxbroker.Table) {
			x.AdvisoryLock, x.LockedUntil, x.Lease = "", "locked_until", 1500*time.Millisecond
		}},
		{"empty name", "Name", func(x *sqlxbroker.Table) { x.Name = "" }},
		{"injection", "must match", func(x *sqlxbroker.Table) { x.Name = tb.Name + "; DROP TABLE " + tb.Name + "; --" }},
		{"injection in key", "must match", func(x *sqlxbroker.Table) { x.LockedUntil, x.Lease, x.AdvisoryLock = "", 0, "k-{acct) OR 1=1 --}" }},
		{"missing table", "cf_missing", func(x *sqlxbroker.Table) { x.Name = "cf_missing" }},
	}
	caps := core.CapabilitiesOf(tg.Dialect)
	for _, c := range cases {
		if strings.Contains(c.name, "key") && !caps.Offers(sqlxbroker.Advisory) || c.name == "fractional lease" && !caps.Offers(sqlxbroker.Lease) {
			continue // the form's own ErrFormUnavailable would answer first
		}
		x := tb
		c.edit(&x)
		s, err := b.Subscribe(context.Background(), x, func(context.Context, *sqlxbroker.Delivery) error { return nil }, quick)
		if err == nil {
			_ = s.Stop(context.Background())
			t.Errorf("%s: subscribe succeeded", c.name)
			continue
		}
		if !errors.Is(err, sqlxbroker.ErrInvalidTable) && !errors.Is(err, sqlxbroker.ErrFormUnavailable) {
			t.Errorf("%s: error %v is not ErrInvalidTable", c.name, err)
		}
		if !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %q does not name %q", c.name, err, c.want)
		}
	}
	if after := snapshot(t, tg, b, tb); after != before {
		t.Errorf("bad descriptions changed the table:\n before %s\n after  %s", before, after)
	}
}

// VersionGate: on the target's old server the forms it names fail at
// subscribe time with ErrServerTooOld, and the other offered forms work.
func VersionGate(t TB, tg *Target) {
	old := *tg
	old.Open = tg.OldServer
	for _, f := range core.FormsOf(tg.Dialect) {
		if tg.refuses(f) {
			continue // the Refused scenario checks it
		}
		b := old.broker(t)
		tb := old.fresh(t, b.DB(), f, nil)
		s, err := b.Subscribe(context.Background(), tb, func(context.Context, *sqlxbroker.Delivery) error { return nil }, quick)
		refused := false
		for _, r := range tg.OldServerRefuses {
			refused = refused || r == f
		}
		switch {
		case refused && !errors.Is(err, sqlxbroker.ErrServerTooOld):
			t.Errorf("%s form on the old server: %v, want ErrServerTooOld", f, err)
		case !refused && err != nil:
			t.Errorf("%s form on the old server: %v", f, err)
		}
		if s != nil {
			_ = s.Stop(context.Background())
		}
	}
}

// LockWaitLimit (advisory form, dialects whose AdvisoryLocker.LockWaitLimit
// gives statements): a
// completion whose row another transaction holds locked fails alone, as a
// statement error, before the key session's statement time (10 s) runs
// out. The session stays: the other delivery it holds is not lost and
// completes, and the blocked row comes back with its attempt counted and
// completes once.
func LockWaitLimit(t TB, tg *Target, f sqlxbroker.Form) {
	ctx := context.Background()
	b := tg.broker(t)
	tb := tg.fresh(t, b.DB(), f, nil)
	publish(t, b, tb, msg{Acct: "wait-a"}, msg{Acct: "wait-b"})
	fm := form(t, b, tb)
	cs := claim(t, fm, 2)
	if len(cs) != 2 {
		t.Fatalf("claimed %d rows, want 2", len(cs))
	}
	d := tg.Dialect
	other := tg.Open(t)
	tx, err := other.Beginx()
	if err != nil {
		t.Fatalf("begin: %v", err)
	}
	defer func() { _ = tx.Rollback() }()
	attempt := d.QuoteIdent(tb.AttemptColumn())
	lock := sqlx.Rebind(d.BindType(), "UPDATE "+d.QuoteIdent(tb.Name)+" SET "+attempt+" = "+attempt+" WHERE "+d.QuoteIdent(tb.IDColumn())+" = ?")
	if _, err := tx.Exec(lock, sqlxbroker.NewDelivery(cs[0]).ID()); err != nil {
		t.Fatalf("lock the row in another transaction: %v", err)
	}
	start := time.Now()
	err = Complete(ctx, cs[0], sqlxbroker.Outcome{Kind: sqlxbroker.Succeeded})
	took := time.Since(start)
	_ = tx.Rollback()
	if err == nil || errors.Is(err, sqlxbroker.ErrLeaseLost) {
		t.Errorf("a completion whose row another transaction holds returned %v after %v, want its statement's error", err, took)
	}
	if took >= 10*time.Second {
		t.Errorf("the blocked completion returned after %v: the lock wait was not bounded below the statement time", took)
	}
	select {
	case <-Lost(cs[1]):
		t.Fatalf("a blocked completion (%v) lost the other delivery of the key session", err)
	default:
	}
	complete(t, cs[1], sqlxbroker.Succeeded)
	again := claim(t, fm, 2)
	if len(again) != 1 || sqlxbroker.NewDelivery(again[0]).Attempt() != 2 {
		t.Fatalf("claimed again %d rows, want the blocked one at attempt 2", len(again))
	}
	complete(t, again[0], sqlxbroker.Succeeded)
	if n := count(t, b.DB(), d, tb.Name, ""); n != 0 {
		t.Errorf("%d rows left, want 0", n)
	}
}

// AdvisoryBatch (advisory form): keys tried together on one session answer
// in the order given, agree with keys tried one at a time, hold against
// another session, and release together; keys of any content work.
func AdvisoryBatch(t TB, tg *Target, f sqlxbroker.Form) {
	lk := core.CapabilitiesOf(tg.Dialect).AdvisoryLocker
	db := tg.broker(t).DB()
	pool := core.NewPool(db, tg.Dialect)
	defer pool.Close()
	ctx := context.Background()
	try := func(conn *sqlx.Conn, keys []string) ([]bool, error) {
		return lk.TryAdvisoryLocks(ctx, &core.AdvisoryParams{Pool: pool, Conn: conn, Keys: keys})
	}
	unlock := func(conn *sqlx.Conn, keys []string) error {
		return lk.AdvisoryUnlocks(ctx, &core.AdvisoryParams{Pool: pool, Conn: conn, Keys: keys})
	}
	tryOne := func(conn *sqlx.Conn, k string) (bool, error) {
		ok, err := try(conn, []string{k})
		if err == nil && len(ok) != 1 {
			return false, fmt.Errorf("%d results for one key", len(ok))
		}
		return err == nil && ok[0], err
	}
	a, err := db.Connx(ctx)
	if err != nil {
		t.Fatalf("connection: %v", err)
	}
	defer a.Close()
	b, err := db.Connx(ctx)
	if err != nil {
		t.Fatalf("connection: %v", err)
	}
	defer b.Close()
	tag := fmt.Sprintf("batch-%d-", time.Now().UnixNano())
	keys := []string{tag + "plain", tag + strings.Repeat("long", 40), tag + "nul\x00byte", tag + "ключ", tag + `q"u'o\te`, tag + "\xff\xfe", tag}
	want := func(who string, got []bool, exp func(i int) bool) {
		t.Helper()
		if len(got) != len(keys) {
			t.Fatalf("%s: %d results for %d keys", who, len(got), len(keys))
		}
		for i, g := range got {
			if g != exp(i) {
				t.Errorf("%s: key %q taken %v, want %v", who, keys[i], g, exp(i))
			}
		}
	}
	got, err := try(a, keys)
	if err != nil {
		t.Fatalf("TryAdvisoryLocks: %v", err)
	}
	want("first session", got, func(int) bool { return true })
	defer func() { _ = unlock(a, keys) }()
	if got, err = try(b, keys); err != nil {
		t.Fatalf("TryAdvisoryLocks: %v", err)
	}
	want("second session while the first holds every key", got, func(int) bool { return false })
	for _, k := range keys {
		if ok, err := tryOne(b, k); err != nil || ok {
			t.Errorf("TryAdvisoryLocks([%q]) on the second session = %v, %v; want false: the first holds it", k, ok, err)
		}
	}
	half := len(keys) / 2
	if err := unlock(a, keys[:half]); err != nil {
		t.Fatalf("AdvisoryUnlocks: %v", err)
	}
	if got, err = try(b, keys); err != nil {
		t.Fatalf("TryAdvisoryLocks: %v", err)
	}
	want("second session after the first released half", got, func(i int) bool { return i < half })
	if err := unlock(b, keys[:half]); err != nil {
		t.Fatalf("AdvisoryUnlocks: %v", err)
	}
	// Released together, taken one by one.
	for _, k := range keys[:half] {
		ok, err := tryOne(a, k)
		if err != nil || !ok {
			t.Errorf("TryAdvisoryLocks([%q]) after its batch release = %v, %v; want true", k, ok, err)
		}
	}
}

// AdvisoryFirst (dialects with core.AdvisoryFirstLocker): keys are tried
// in order until as many as wanted are locked; a key another session
// holds is passed over, and the keys after the last one wanted are not
// tried (another session takes them at once). With fewer free keys than
// wanted, every key is tried.
func AdvisoryFirst(t TB, tg *Target, f sqlxbroker.Form) {
	caps := core.CapabilitiesOf(tg.Dialect)
	lk, first := caps.AdvisoryLocker, caps.AdvisoryFirstLocker
	db := tg.broker(t).DB()
	pool := core.NewPool(db, tg.Dialect)
	defer pool.Close()
	ctx := context.Background()
	var conns []*sqlx.Conn
	for range 3 {
		c, err := db.Connx(ctx)
		if err != nil {
			t.Fatalf("connection: %v", err)
		}
		defer c.Close()
		conns = append(conns, c)
	}
	mine, other, third := conns[0], conns[1], conns[2]
	tag := fmt.Sprintf("first-%d-", time.Now().UnixNano())
	keys := []string{tag + "a", tag + "b", tag + "c", tag + "d", tag + "e"}
	params := func(c *sqlx.Conn, keys []string) *core.AdvisoryParams {
		return &core.AdvisoryParams{Pool: pool, Conn: c, Keys: keys}
	}
	defer func() {
		for _, c := range conns {
			_ = lk.AdvisoryUnlocks(ctx, params(c, keys))
		}
	}()
	if ok, err := lk.TryAdvisoryLocks(ctx, params(other, keys[1:2])); err != nil || len(ok) != 1 || !ok[0] {
		t.Fatalf("another session locks %q: %v %v", keys[1], ok, err)
	}
	got, err := first.TryFirstAdvisoryLocks(ctx, params(mine, keys), 2)
	if err != nil || !slices.Equal(got, []int{0, 2}) {
		t.Fatalf("TryFirstAdvisoryLocks(2 of 5, the second held elsewhere) = %v, %v; want positions [0 2]", got, err)
	}
	ok, err := lk.TryAdvisoryLocks(ctx, params(other, keys[3:]))
	if err != nil || !slices.Equal(ok, []bool{true, true}) {
		t.Fatalf("the keys after the second locked were tried: another session takes %v: %v, %v", keys[3:], ok, err)
	}
	if got, err = first.TryFirstAdvisoryLocks(ctx, params(third, keys), 5); err != nil || len(got) != 0 {
		t.Fatalf("TryFirstAdvisoryLocks(5 of 5, each held elsewhere) = %v, %v; want none", got, err)
	}
}

// FIFORefused (dialects without core.GroupGuard): a FIFO table is refused
// at subscribe time with a *sqlxbroker.TableError naming Group, before
// anything changes, while the same table without a group subscribes.
func FIFORefused(t TB, tg *Target, f sqlxbroker.Form) {
	b := tg.broker(t)
	plain := tg.fresh(t, b.DB(), f, nil)
	fifo := plain
	fifo.Group = "grp"
	h := func(context.Context, *sqlxbroker.Delivery) error { return nil }
	s, err := b.Subscribe(context.Background(), fifo, h, quick)
	var te *sqlxbroker.TableError
	if !errors.As(err, &te) || te.Field != "Group" || !errors.Is(err, sqlxbroker.ErrInvalidTable) {
		if s != nil {
			_ = s.Stop(context.Background())
		}
		t.Fatalf("a FIFO table on a dialect without a group guard subscribed (%v), want a TableError naming Group", err)
	}
	subscribe(t, b, plain, h, quick)
}

// IDMatch: the dialect's IDMatcher (which the advisory form takes its rows
// and writes its completion batches with) holds for exactly the rows whose
// IDs are listed: IDs as the driver read them, a list of one, an ID
// listed twice, and the ID of a row deleted since.
func IDMatch(t TB, tg *Target, f sqlxbroker.Form) {
	b := tg.broker(t)
	db := b.DB()
	tb := tg.fresh(t, db, f, nil)
	publish(t, b, tb, msg{Acct: "a", Body: "1"}, msg{Acct: "b", Body: "2"}, msg{Acct: "c", Body: "3"}, msg{Acct: "d", Body: "4"})
	p, err := b.Plan(tb)
	if err != nil {
		t.Fatalf("plan: %v", err)
	}
	q := tg.Dialect.QuoteIdent
	var ids []any // by body: 1, 2, 3, 4
	rows, err := db.Queryx("SELECT " + p.QID + " FROM " + p.QTable + " ORDER BY " + q("body"))
	if err != nil {
		t.Fatalf("read the IDs: %v", err)
	}
	for rows.Next() {
		v, err := rows.SliceScan()
		if err != nil {
			t.Fatalf("read the IDs: %v", err)
		}
		ids = append(ids, v[0])
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil || len(ids) != 4 {
		t.Fatalf("read %d IDs, want 4: %v", len(ids), err)
	}
	if _, err := db.Exec(sqlx.Rebind(tg.Dialect.BindType(), "DELETE FROM "+p.QTable+" WHERE "+q("body")+" = ?"), "4"); err != nil {
		t.Fatalf("delete a row: %v", err)
	}
	m := core.CapabilitiesOf(tg.Dialect).IDMatcher
	for _, c := range []struct {
		name string
		ids  []any
		want []string
	}{
		{"one", ids[1:2], []string{"2"}},
		{"three", ids[:3], []string{"1", "2", "3"}},
		{"repeated, and a deleted row's", []any{ids[2], ids[0], ids[2], ids[3]}, []string{"1", "3"}},
	} {
		for _, col := range []string{p.QID, p.QTable + "." + p.QID} {
			cond, args := m.MatchIDs(p, col, c.ids)
			var got []string
			if err := db.Select(&got, sqlx.Rebind(tg.Dialect.BindType(), "SELECT "+q("body")+" FROM "+p.QTable+" WHERE "+cond+" ORDER BY "+q("body")), args...); err != nil {
				t.Fatalf("%s (%s): %v", c.name, cond, err)
			}
			if !slices.Equal(got, c.want) {
				t.Errorf("%s: %s matched the rows %v, want %v", c.name, cond, got, c.want)
			}
		}
	}
}
