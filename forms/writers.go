package forms

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/sqlxbroker/sqlxbroker/core"
)

// writers keeps the connections an advisory form writes its successes on
// (advisory.flush), at most flushers in use at once, each with the
// dialect's lock wait limit set (AdvisoryLocker.LockWaitLimit) as the key
// session has it: a row an application's transaction holds locked fails
// its batch within lockWait, in the server, rather than leaving a
// statement whose client gave up to finish later. A connection idle for
// keepFor goes back to the pool, its limit reset (giveBack, from the key
// holder's pings); once the form is closed, each goes back as it is put.
type writers struct {
	f      *advisory
	mu     sync.Mutex
	idle   []idleWriter
	closed bool
}

type idleWriter struct {
	conn  *sqlx.Conn
	since time.Time
}

// get returns an idle connection, or one new from the pool with the limit
// set.
func (w *writers) get(ctx context.Context) (*sqlx.Conn, error) {
	w.mu.Lock()
	if n := len(w.idle); n > 0 {
		conn := w.idle[n-1].conn
		w.idle = w.idle[:n-1]
		w.mu.Unlock()
		return conn, nil
	}
	w.mu.Unlock()
	conn, err := w.f.db.Connx(ctx)
	if err != nil {
		return nil, fmt.Errorf("sqlxbroker: advisory: a connection for completions: %w", err)
	}
	if err := w.f.limitLockWaits(ctx, conn); err != nil {
		core.Discard(conn)
		return nil, fmt.Errorf("sqlxbroker: advisory: limit the completions' lock waits: %w", err)
	}
	return conn, nil
}

// put takes conn back after a write; one whose statement failed is
// closed, as its state is unknown.
func (w *writers) put(conn *sqlx.Conn, failed bool) {
	if failed {
		core.Discard(conn)
		return
	}
	w.mu.Lock()
	if !w.closed {
		w.idle = append(w.idle, idleWriter{conn, time.Now()})
		w.mu.Unlock()
		return
	}
	w.mu.Unlock()
	w.f.giveBack(conn)
}

// giveBack returns the connections idle for keepFor to the pool (all of
// them when the form closes).
func (w *writers) giveBack(closing bool) {
	w.mu.Lock()
	w.closed = w.closed || closing
	var back []*sqlx.Conn
	kept := w.idle[:0]
	for _, iw := range w.idle {
		if w.closed || time.Since(iw.since) >= keepFor {
			back = append(back, iw.conn)
		} else {
			kept = append(kept, iw)
		}
	}
	clear(w.idle[len(kept):])
	w.idle = kept
	w.mu.Unlock()
	for _, conn := range back {
		w.f.giveBack(conn)
	}
}

// limitLockWaits sets the dialect's lock wait limit (lockWait) on conn, a
// connection the form keeps from the pool.
func (f *advisory) limitLockWaits(ctx context.Context, conn *sqlx.Conn) error {
	if set, _ := f.plan.Caps.AdvisoryLocker.LockWaitLimit(lockWait); set != "" {
		sctx, cancel := stmtCtx(ctx)
		defer cancel()
		_, err := conn.ExecContext(sctx, set)
		return err
	}
	return nil
}

// giveBack returns conn to the pool with the lock wait limit reset; a
// connection that cannot be reset is closed instead.
func (f *advisory) giveBack(conn *sqlx.Conn) {
	if _, reset := f.plan.Caps.AdvisoryLocker.LockWaitLimit(lockWait); reset != "" {
		ctx, cancel := stmtCtx(context.Background())
		_, err := conn.ExecContext(ctx, reset)
		cancel()
		if err != nil {
			core.Discard(conn)
			return
		}
	}
	conn.Close()
}
