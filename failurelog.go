package sqlxbroker

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"
)

// failureLog writes a subscription's failed deliveries to its logger at
// the level the user chose, at most limit lines per second: the first
// limit failures of each second get a line each (a panic's with its
// stack); the rest are counted, and one summary line says how many were
// not logged, how many of them panicked or went dead, and the last error.
// The summary is written when the next second's first failure comes, or a
// second after the first failure left out, or at Stop, whichever is first.
type failureLog struct {
	log          *slog.Logger
	level        slog.Leveler
	limit        int
	table, form  string
	now          func() time.Time
	mu           sync.Mutex
	window       time.Time // start of the second being counted
	written      int       // lines written in it
	skipped      int       // failures left out since the last summary
	panics, dead int       // of them
	last         error     // the last one left out
	since        time.Time // when the first of them came
	timer        *time.Timer
}

func newFailureLog(log *slog.Logger, level slog.Leveler, limit int, table, form string) *failureLog {
	return &failureLog{log: log, level: level, limit: limit, table: table, form: form, now: time.Now}
}

// failed logs (or counts) the failure of d, which outcome o records; note
// says why an outcome error was not followed.
func (l *failureLog) failed(d *Delivery, o Outcome, note string) {
	level := l.level.Level()
	if !l.log.Enabled(context.Background(), level) {
		return
	}
	var pe *PanicError
	panicked := errors.As(o.Err, &pe)
	l.mu.Lock()
	now := l.now()
	if now.Sub(l.window) >= time.Second {
		l.summaryLocked()
		l.window, l.written = now, 0
	}
	if l.written >= l.limit {
		if l.skipped == 0 {
			l.since = now
			if l.timer == nil {
				l.timer = time.AfterFunc(time.Second, l.flush)
			} else {
				l.timer.Reset(time.Second)
			}
		}
		l.skipped++
		if panicked {
			l.panics++
		}
		if o.Kind == Dead {
			l.dead++
		}
		l.last = o.Err
		l.mu.Unlock()
		return
	}
	l.written++
	l.mu.Unlock()
	attrs := []slog.Attr{slog.String("table", l.table), slog.String("form", l.form),
		slog.Any("id", d.ID()), slog.Int("attempt", d.Attempt()), slog.String("outcome", o.Kind.String())}
	if o.Kind == Retry && !o.RetryAt.IsZero() {
		attrs = append(attrs, slog.Time("retry_at", o.RetryAt))
	}
	if note != "" {
		attrs = append(attrs, slog.String("note", note))
	}
	attrs = append(attrs, slog.Any("err", o.Err))
	msg := "sqlxbroker: delivery failed"
	if panicked {
		msg = "sqlxbroker: handler panicked"
		attrs = append(attrs, slog.String("stack", string(pe.Stack)))
	}
	l.log.LogAttrs(context.Background(), level, msg, attrs...)
}

// flush writes the summary of the failures left out, if any.
func (l *failureLog) flush() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.summaryLocked()
}

func (l *failureLog) summaryLocked() {
	if l.skipped == 0 {
		return
	}
	l.log.LogAttrs(context.Background(), l.level.Level(), "sqlxbroker: more deliveries failed than the log limit",
		slog.String("table", l.table), slog.String("form", l.form), slog.Int("not_logged", l.skipped),
		slog.Int("panics", l.panics), slog.Int("dead", l.dead),
		slog.Duration("over", l.now().Sub(l.since)), slog.Int("limit_per_second", l.limit), slog.Any("last_err", l.last))
	l.skipped, l.panics, l.dead, l.last = 0, 0, 0, nil
}
