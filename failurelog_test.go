package sqlxbroker

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sqlxbroker/sqlxbroker/core"
)

// records is a slog.Handler that keeps every record.
type records struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (r *records) Enabled(context.Context, slog.Level) bool { return true }
func (r *records) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recs = append(r.recs, rec.Clone())
	return nil
}
func (r *records) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *records) WithGroup(string) slog.Handler      { return r }

func attr(rec slog.Record, key string) string {
	var v string
	rec.Attrs(func(a slog.Attr) bool {
		if a.Key == key {
			v = a.Value.String()
		}
		return true
	})
	return v
}

// 10,000 failures in one second write the limit's lines and one summary
// that counts the rest, panics and dead rows among them.
func TestFailureLogLimit(t *testing.T) {
	rec := &records{}
	l := newFailureLog(slog.New(rec), slog.LevelWarn, 10, "jobs", "lease")
	clock := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	l.now = func() time.Time { return clock }
	d := &Delivery{row: &core.Row{ID: int64(1), Attempt: 1}}
	for i := range 10000 {
		o := Outcome{Kind: Retry, Err: errors.New("boom")}
		if i%100 == 0 {
			o.Err = &PanicError{Value: "bug", Stack: []byte("goroutine 1")}
		}
		if i%1000 == 999 {
			o.Kind = Dead
		}
		l.failed(d, o, "")
		clock = clock.Add(50 * time.Microsecond) // 10,000 in half a second
	}
	if n := len(rec.recs); n != 10 {
		t.Fatalf("%d lines within the second, want the limit, 10", n)
	}
	if got := attr(rec.recs[0], "stack"); got != "goroutine 1" {
		t.Errorf("the first failure (a panic) was logged without its stack: %q", got)
	}
	clock = clock.Add(time.Second)
	l.failed(d, Outcome{Kind: Retry, Err: errors.New("next second")}, "")
	if n := len(rec.recs); n != 12 {
		t.Fatalf("%d lines after the next second's first failure, want 12 (a summary and the failure)", n)
	}
	sum := rec.recs[10]
	if !strings.Contains(sum.Message, "log limit") || attr(sum, "not_logged") != "9990" ||
		attr(sum, "panics") != "99" || attr(sum, "dead") != "10" || attr(sum, "last_err") != "boom" {
		t.Errorf("summary %q not_logged=%s panics=%s dead=%s last_err=%s; want 9990, 99, 10, boom",
			sum.Message, attr(sum, "not_logged"), attr(sum, "panics"), attr(sum, "dead"), attr(sum, "last_err"))
	}
	l.flush()
	if n := len(rec.recs); n != 12 {
		t.Errorf("flush with nothing left out wrote %d lines", n-12)
	}
}

// The summary of failures left out is written without a next failure:
// about a second after the first one left out.
func TestFailureLogSummaryTimer(t *testing.T) {
	rec := &records{}
	l := newFailureLog(slog.New(rec), slog.LevelWarn, 1, "jobs", "lease")
	d := &Delivery{row: &core.Row{ID: int64(1), Attempt: 1}}
	for range 3 {
		l.failed(d, Outcome{Kind: Retry, Err: errors.New("boom")}, "")
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		rec.mu.Lock()
		n := len(rec.recs)
		rec.mu.Unlock()
		if n == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d lines after 10s, want the failure and a summary", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := attr(rec.recs[1], "not_logged"); got != "2" {
		t.Errorf("summary not_logged = %s, want 2", got)
	}
}

// A level the logger does not enable logs nothing.
func TestFailureLogLevel(t *testing.T) {
	var b strings.Builder
	log := slog.New(slog.NewTextHandler(&b, &slog.HandlerOptions{Level: slog.LevelError}))
	l := newFailureLog(log, slog.LevelWarn, 10, "jobs", "lease")
	l.failed(&Delivery{row: &core.Row{ID: int64(1), Attempt: 1}}, Outcome{Kind: Retry, Err: errors.New("boom")}, "")
	if b.Len() != 0 {
		t.Errorf("a WARN failure line reached an ERROR logger: %s", b.String())
	}
}
