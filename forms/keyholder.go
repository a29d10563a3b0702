package forms

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/sqlxbroker/sqlxbroker/core"
)

// keyHolder is the session that holds an advisory form's keys: one
// connection, taken from the pool when a key is tried while none is kept,
// and given back once it has held no key for keepFor (or the form closes).
// A claim's keys are tried in one statement (core.AdvisoryLocker); a
// completion batch's keys are released in one statement once the batch is
// written (advisory.flush: its successes on another connection, fenced by
// attempt, every other outcome on the session), as are the keys of rows a
// claim did not take (unlock).
//
// Its statements run without the caller's cancellation (a stopping
// subscription must not lose the keys of the deliveries in work) but with
// a timeout, and wait for row locks for less than that where the dialect
// can bound it (AdvisoryLocker.LockWaitLimit). When one fails, the session's locks
// are unknown: it is closed, which makes the server drop them, and its
// deliveries are lost (holding). While keys are held an idle session is
// pinged every pingEvery, so a session that ended (killed, failed over)
// cancels its handlers within about that time.
type keyHolder struct {
	f    *advisory
	mu   sync.Mutex // the session runs one statement at a time
	sess *sqlx.Conn
	gen  *holding            // the deliveries of sess
	held map[string]struct{} // keys sess holds (the form never tries a held key again)
	used time.Time           // sess's last statement; with no key held, since when it is idle
}

// holderTimeout bounds each statement of the holder's session.
const holderTimeout = 10 * time.Second

// lockWait is how long a statement of the holder's session waits for a row
// lock where the dialect can bound it (AdvisoryLocker.LockWaitLimit): well within
// holderTimeout, so a completion blocked by an application's transaction
// fails alone rather than ending the session.
const lockWait = holderTimeout / 2

// pingEvery is how often a holder's idle session is checked while it holds
// keys.
var pingEvery = time.Second

// batchKeys is the most keys one statement tries or releases.
const batchKeys = 500

// stmtCtx is the context of a statement on the session: ctx's values, not
// its end, and holderTimeout.
func stmtCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), holderTimeout)
}

// try tries keys on the session (taking one when none is kept) and returns
// which it locked, how many of them (from the first) it tried, and the
// session's deliveries; with want > 0 and the dialect's
// AdvisoryFirstLocker, only until want are locked. A kept session that
// held no key may have ended unnoticed (it is not pinged then): when its
// try fails, the keys are tried once more on a new session.
func (h *keyHolder) try(ctx context.Context, keys []string, want int) ([]bool, int, *holding, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	kept := h.sess != nil && len(h.held) == 0
	ok, tried, err := h.tryOn(ctx, keys, want)
	if err != nil && kept && ctx.Err() == nil {
		ok, tried, err = h.tryOn(ctx, keys, want)
	}
	if err != nil {
		return nil, 0, nil, err
	}
	return ok, tried, h.gen, nil
}

// tryOn is one try of try, with h.mu held.
func (h *keyHolder) tryOn(ctx context.Context, keys []string, want int) ([]bool, int, error) {
	if h.sess == nil {
		conn, err := h.f.db.Connx(ctx)
		if err != nil {
			return nil, 0, fmt.Errorf("sqlxbroker: advisory: a session for the keys: %w", err)
		}
		if err := h.f.limitLockWaits(ctx, conn); err != nil {
			core.Discard(conn)
			return nil, 0, fmt.Errorf("sqlxbroker: advisory: limit the key session's lock waits: %w", err)
		}
		h.sess, h.gen, h.held = conn, &holding{}, map[string]struct{}{}
	}
	sctx, cancel := stmtCtx(ctx)
	defer cancel()
	ok, tried, err := h.lockKeys(sctx, h.sess, keys, want)
	if err != nil {
		h.fail()
		return nil, 0, fmt.Errorf("sqlxbroker: try advisory locks (%d keys): %w", len(keys), err)
	}
	for i, b := range ok {
		if b {
			h.held[keys[i]] = struct{}{}
		}
	}
	h.used = time.Now()
	return ok, tried, nil
}

// keepFor is how long a session that holds no key is kept (pings give it
// back after), so a subscription that runs one delivery at a time does not
// take and give back (and set and reset) a session for each.
var keepFor = time.Second

// unlock releases the keys of cs and drops them from the form's keys. Keys
// of a session that ended need no release: the server dropped them with it.
func (h *keyHolder) unlock(ctx context.Context, cs ...*advisoryClaim) error {
	if len(cs) == 0 {
		return nil
	}
	h.mu.Lock()
	err := h.release(ctx, cs)
	h.mu.Unlock()
	for _, c := range cs {
		h.f.drop(c.key)
	}
	return err
}

// release unlocks the keys of cs that the session holds; the caller holds
// h.mu. A failed release closes the session, which releases them anyway
// (and loses its other deliveries).
func (h *keyHolder) release(ctx context.Context, cs []*advisoryClaim) error {
	var keys []string
	for _, c := range cs {
		if h.sess != nil && c.gen == h.gen {
			keys = append(keys, c.key)
		}
	}
	if len(keys) == 0 {
		return nil
	}
	sctx, cancel := stmtCtx(ctx)
	err := h.unlockKeys(sctx, h.sess, keys)
	cancel()
	if err != nil {
		h.fail()
		return fmt.Errorf("sqlxbroker: advisory unlock (%d keys): %w; the session holding the form's keys is closed, which releases them", len(keys), err)
	}
	h.used = time.Now()
	for _, k := range keys {
		delete(h.held, k)
	}
	return nil
}

// pings checks the session every pingEvery while it holds keys and has run
// no statement meanwhile, and gives it back once it has held none for
// keepFor, as it gives back the form's idle writers, until stop is
// closed.
func (h *keyHolder) pings(stop <-chan struct{}) {
	t := time.NewTicker(pingEvery)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		h.f.writers.giveBack(false)
		h.mu.Lock()
		switch {
		case h.sess == nil:
		case len(h.held) == 0:
			if time.Since(h.used) >= keepFor {
				h.giveBack()
			}
		case time.Since(h.used) >= pingEvery:
			ctx, cancel := context.WithTimeout(context.Background(), holderTimeout)
			if err := h.sess.PingContext(ctx); err != nil {
				h.fail()
			}
			cancel()
			h.used = time.Now()
		}
		h.mu.Unlock()
	}
}

// fail closes the session for good (the server drops its keys) and loses
// its deliveries. Keys that the server does not hold (SQLite keeps them in
// the process) would outlive the session: they are released on another
// connection, which for keys the server held releases nothing.
func (h *keyHolder) fail() {
	core.Discard(h.sess)
	h.gen.lose()
	if len(h.held) > 0 {
		keys := make([]string, 0, len(h.held))
		for k := range h.held {
			keys = append(keys, k)
		}
		ctx, cancel := stmtCtx(context.Background())
		if conn, err := h.f.db.Connx(ctx); err == nil {
			_ = h.unlockKeys(ctx, conn, keys)
			conn.Close()
		}
		cancel()
	}
	h.sess, h.gen, h.held = nil, nil, nil
}

// close gives back a session that holds no key when the form closes.
func (h *keyHolder) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.sess != nil && len(h.held) == 0 {
		h.giveBack()
	}
}

// giveBack returns the session, which holds no key, to the pool, its lock
// wait limit reset; a session that cannot be reset is closed instead.
func (h *keyHolder) giveBack() {
	h.f.giveBack(h.sess)
	h.sess, h.gen, h.held = nil, nil, nil
}

// lockKeys tries keys on conn, in statements of up to batchKeys keys, and
// returns which it locked and how many (from the first) it tried: all, or
// with want > 0 and the dialect's AdvisoryFirstLocker, those up to the
// want-th locked.
func (h *keyHolder) lockKeys(ctx context.Context, conn *sqlx.Conn, keys []string, want int) ([]bool, int, error) {
	caps := h.f.plan.Caps
	if first := caps.AdvisoryFirstLocker; want > 0 && first != nil {
		ok := make([]bool, len(keys))
		tried, got := 0, 0
		for i := 0; i < len(keys) && got < want; i += batchKeys {
			batch := keys[i:min(i+batchKeys, len(keys))]
			n := min(want-got, len(batch))
			at, err := first.TryFirstAdvisoryLocks(ctx, &core.AdvisoryParams{Pool: h.f.pool, Conn: conn, Keys: batch}, n)
			if err != nil {
				return nil, 0, err
			}
			if len(at) > n || !slices.IsSorted(at) || len(at) > 0 && (at[0] < 0 || at[len(at)-1] >= len(batch)) {
				return nil, 0, fmt.Errorf("the dialect's TryFirstAdvisoryLocks returned positions %v for %d keys, at most %d", at, len(batch), n)
			}
			for _, j := range at {
				ok[i+j] = true
			}
			got += len(at)
			tried = i + len(batch)
			if len(at) == n {
				tried = i + at[n-1] + 1
			}
		}
		return ok, tried, nil
	}
	var out []bool
	for i := 0; i < len(keys); i += batchKeys {
		ok, err := caps.AdvisoryLocker.TryAdvisoryLocks(ctx, &core.AdvisoryParams{Pool: h.f.pool, Conn: conn, Keys: keys[i:min(i+batchKeys, len(keys))]})
		if err != nil {
			return nil, 0, err
		}
		out = append(out, ok...)
	}
	if len(out) != len(keys) {
		return nil, 0, fmt.Errorf("the dialect's TryAdvisoryLocks returned %d results for %d keys", len(out), len(keys))
	}
	return out, len(keys), nil
}

// unlockKeys releases keys on conn, batched as lockKeys tries them.
func (h *keyHolder) unlockKeys(ctx context.Context, conn *sqlx.Conn, keys []string) error {
	for i := 0; i < len(keys); i += batchKeys {
		if err := h.f.plan.Caps.AdvisoryLocker.AdvisoryUnlocks(ctx, &core.AdvisoryParams{Pool: h.f.pool, Conn: conn, Keys: keys[i:min(i+batchKeys, len(keys))]}); err != nil {
			return err
		}
	}
	return nil
}

// holding is one session's deliveries: their OnLost functions are called
// when the session ends while it holds keys.
type holding struct {
	mu   sync.Mutex
	gone bool
	fns  map[*advisoryClaim]func()
}

func (g *holding) lose() {
	g.mu.Lock()
	g.gone = true
	fns := g.fns
	g.fns = nil
	g.mu.Unlock()
	for _, fn := range fns {
		fn()
	}
}

func (g *holding) isLost() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.gone
}

func (g *holding) onLost(c *advisoryClaim, fn func()) {
	g.mu.Lock()
	if g.gone {
		g.mu.Unlock()
		fn()
		return
	}
	if g.fns == nil {
		g.fns = map[*advisoryClaim]func(){}
	}
	g.fns[c] = fn
	g.mu.Unlock()
}

func (g *holding) forget(c *advisoryClaim) {
	g.mu.Lock()
	delete(g.fns, c)
	g.mu.Unlock()
}
