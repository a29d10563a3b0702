package conformance

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/sqlxbroker/sqlxbroker"
)

// withLastError gives a suite table a LastError column and MaxAttempts.
func withLastError(maxAttempts int) func(*sqlxbroker.Table) {
	return func(tb *sqlxbroker.Table) { tb.LastError, tb.MaxAttempts = "last_error", maxAttempts }
}

// delivered is one delivery a scenario's handler saw.
type delivered struct {
	attempt int
	at      time.Time // when the handler started
	ended   time.Time // when it returned
}

// recorder keeps the deliveries of one row in order.
type recorder struct {
	mu  sync.Mutex
	got []delivered
}

func (r *recorder) start(d *sqlxbroker.Delivery) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, delivered{attempt: d.Attempt(), at: time.Now()})
	return len(r.got)
}

func (r *recorder) end() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got[len(r.got)-1].ended = time.Now()
}

func (r *recorder) list() []delivered {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]delivered(nil), r.got...)
}

// lastError reads the LastError column of the rows whose body is body.
func lastError(t TB, tg *Target, tb sqlxbroker.Table, b *sqlxbroker.Broker, body string) string {
	t.Helper()
	q := tg.Dialect.QuoteIdent
	var s *string
	if err := b.DB().QueryRow(b.DB().Rebind("SELECT "+q("last_error")+" FROM "+q(tb.Name)+" WHERE "+q("body")+" = ?"), body).Scan(&s); err != nil {
		t.Fatalf("read last_error: %v", err)
	}
	if s == nil {
		return ""
	}
	return *s
}

// DeadNow: a handler returning Permanent sends its row dead at once,
// after one delivery although more attempts are allowed: the row is kept
// with DeadAt set, its attempt (the column holds 2, what a next delivery
// would report) and the error in the LastError column.
func DeadNow(t TB, tg *Target, f sqlxbroker.Form) {
	b := tg.broker(t)
	tb := tg.fresh(t, b.DB(), f, withLastError(5))
	publish(t, b, tb, msg{Acct: "a", Body: "bad"}, msg{Acct: "b", Body: "ok"})
	var r recorder
	s := subscribe(t, b, tb, func(ctx context.Context, d *sqlxbroker.Delivery) error {
		var m msg
		if err := d.Scan(&m); err != nil {
			return err
		}
		if m.Body != "bad" {
			return nil
		}
		r.start(d)
		return sqlxbroker.Permanent(errors.New("the payload cannot be parsed"))
	}, quick)
	WaitFor(t, 30*time.Second, "one dead row and one success", func() bool {
		st := s.Stats()
		return st.Dead == 1 && st.Succeeded == 1
	})
	if err := s.Stop(context.Background()); err != nil {
		t.Errorf("stop: %v", err)
	}
	if st := s.Stats(); st.Retried != 0 {
		t.Errorf("stats %+v: a permanent failure was retried", st)
	}
	if got := r.list(); len(got) != 1 || got[0].attempt != 1 {
		t.Errorf("the permanently failing row had deliveries %+v, want one, attempt 1", got)
	}
	q := tg.Dialect.QuoteIdent
	if n := count(t, b.DB(), tg.Dialect, tb.Name, q("body")+" = ? AND "+q("dead_at")+" IS NOT NULL AND "+q("attempt")+" = ?", "bad", 2); n != 1 {
		t.Errorf("the row is not kept dead with attempt 2 after its one delivery")
	}
	if e := lastError(t, tg, tb, b, "bad"); !strings.Contains(e, "the payload cannot be parsed") {
		t.Errorf("last_error = %q, want the handler's error", e)
	}
	if cs := claim(t, form(t, b, tb), 5); len(cs) != 0 {
		t.Errorf("the dead row was claimed again")
	}
}

// RetryAfterDelay: a handler returning RetryAfter(d, err) has its row back
// no earlier than d after it returned (the subscription's own retry delay
// is 0), its attempt counted and err in the LastError column meanwhile.
func RetryAfterDelay(t TB, tg *Target, f sqlxbroker.Form) {
	b := tg.broker(t)
	tb := tg.fresh(t, b.DB(), f, withLastError(5))
	publish(t, b, tb, msg{Acct: "a", Body: "later"})
	const delay = 1500 * time.Millisecond
	var r recorder
	s := subscribe(t, b, tb, func(ctx context.Context, d *sqlxbroker.Delivery) error {
		defer r.end()
		if r.start(d) == 1 {
			return sqlxbroker.RetryAfter(delay, errors.New("the remote side is busy"))
		}
		return nil
	}, quick)
	WaitFor(t, 5*time.Second, "the first delivery failed", func() bool { return s.Stats().Retried == 1 })
	if e := lastError(t, tg, tb, b, "later"); !strings.Contains(e, "the remote side is busy") {
		t.Errorf("last_error after the failure = %q, want the handler's error", e)
	}
	WaitFor(t, 30*time.Second, "the row succeeded on its second delivery", func() bool { return s.Stats().Succeeded == 1 })
	got := r.list()
	if len(got) != 2 {
		t.Fatalf("deliveries %+v, want 2", got)
	}
	if got[1].attempt != 2 {
		t.Errorf("the retry reports attempt %d, want 2", got[1].attempt)
	}
	// Host times are kept to the microsecond (core.Now).
	if gap := got[1].at.Sub(got[0].ended); gap < delay-2*time.Microsecond {
		t.Errorf("the row came back %v after the handler returned RetryAfter(%v)", gap, delay)
	}
}

// Snoozes: a row snoozed ten times still gets its full MaxAttempts: each
// snoozed delivery reports attempt 1, then three failing deliveries report
// 1, 2 and 3 and the row goes dead. The first snooze is honoured: the row
// is not back before it ends.
func Snoozes(t TB, tg *Target, f sqlxbroker.Form) {
	b := tg.broker(t)
	tb := tg.fresh(t, b.DB(), f, withLastError(3))
	publish(t, b, tb, msg{Acct: "a", Body: "snoozy"})
	const snoozes, first = 10, 400 * time.Millisecond
	var r recorder
	s := subscribe(t, b, tb, func(ctx context.Context, d *sqlxbroker.Delivery) error {
		defer r.end()
		switch n := r.start(d); {
		case n == 1:
			return sqlxbroker.Snooze(first)
		case n <= snoozes:
			return sqlxbroker.Snooze(time.Millisecond)
		}
		return errors.New("fails after its snoozes")
	}, quick)
	WaitFor(t, 60*time.Second, "the row dead after its snoozes and attempts", func() bool { return s.Stats().Dead == 1 })
	if err := s.Stop(context.Background()); err != nil {
		t.Errorf("stop: %v", err)
	}
	got := r.list()
	if len(got) != snoozes+3 {
		t.Fatalf("%d deliveries, want %d snoozed and 3 failed", len(got), snoozes)
	}
	var attempts []int
	for _, d := range got {
		attempts = append(attempts, d.attempt)
	}
	for i, a := range attempts {
		want := 1
		if i >= snoozes {
			want = i - snoozes + 1
		}
		if a != want {
			t.Errorf("attempts %v: delivery %d reports %d, want %d (snoozes use no attempt)", attempts, i+1, a, want)
			break
		}
	}
	if gap := got[1].at.Sub(got[0].ended); gap < first-2*time.Microsecond {
		t.Errorf("the row came back %v after Snooze(%v)", gap, first)
	}
	if st := s.Stats(); st.Snoozed != snoozes || st.Retried != 2 {
		t.Errorf("stats %+v: want %d snoozed, 2 retried, 1 dead", st, snoozes)
	}
	q := tg.Dialect.QuoteIdent
	if n := count(t, b.DB(), tg.Dialect, tb.Name, q("dead_at")+" IS NOT NULL AND "+q("attempt")+" = ?", 4); n != 1 {
		t.Errorf("the row is not kept dead with attempt 4 after 3 failed deliveries")
	}
	if e := lastError(t, tg, tb, b, "snoozy"); !strings.Contains(e, "fails after its snoozes") {
		t.Errorf("last_error = %q, want the last failure's error", e)
	}
}

// PanicLogged: a handler that panics is logged once, at the subscription's
// FailureLevel, in one record that carries the panic's stack; the row is
// retried and succeeds on its second delivery.
func PanicLogged(t TB, tg *Target, f sqlxbroker.Form) {
	b := tg.broker(t)
	tb := tg.fresh(t, b.DB(), f, withLastError(5))
	publish(t, b, tb, msg{Acct: "a", Body: "boom"})
	logs := &captured{}
	p := quick
	p.Logger, p.FailureLevel = slog.New(logs), slog.LevelError
	s := subscribe(t, b, tb, func(ctx context.Context, d *sqlxbroker.Delivery) error {
		if d.Attempt() == 1 {
			panicInHandler()
		}
		return nil
	}, p)
	WaitFor(t, 30*time.Second, "the row retried and completed", func() bool { return s.Stats().Succeeded == 1 })
	if err := s.Stop(context.Background()); err != nil {
		t.Errorf("stop: %v", err)
	}
	if st := s.Stats(); st.Panics != 1 || st.Retried != 1 {
		t.Errorf("stats %+v: want 1 panic, retried once", st)
	}
	var lines []slog.Record
	for _, r := range logs.list() {
		if strings.Contains(r.Message, "panic") {
			lines = append(lines, r)
		}
	}
	if len(lines) != 1 {
		t.Fatalf("%d log records about the panic, want 1: %v", len(lines), logs.list())
	}
	r := lines[0]
	if r.Level != slog.LevelError {
		t.Errorf("the panic was logged at %v, want the FailureLevel set (ERROR)", r.Level)
	}
	attrs := map[string]string{}
	r.Attrs(func(a slog.Attr) bool { attrs[a.Key] = a.Value.String(); return true })
	if st := attrs["stack"]; !strings.Contains(st, "panicInHandler") || !strings.Contains(st, "goroutine") {
		t.Errorf("the panic's record has no stack through the handler: %q", st)
	}
	if !strings.Contains(attrs["err"], "the handler's bug") {
		t.Errorf("the panic's record has err %q, want the panic value", attrs["err"])
	}
}

// panicInHandler panics as a buggy handler does; its name shows in the stack.
func panicInHandler() { panic("the handler's bug") }

// captured is a slog.Handler that keeps every record.
type captured struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (c *captured) Enabled(context.Context, slog.Level) bool { return true }

func (c *captured) Handle(_ context.Context, r slog.Record) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.recs = append(c.recs, r.Clone())
	return nil
}

func (c *captured) WithAttrs([]slog.Attr) slog.Handler { return c }
func (c *captured) WithGroup(string) slog.Handler      { return c }

func (c *captured) list() []slog.Record {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]slog.Record(nil), c.recs...)
}
