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
// completion batch's keys are parked once the batch is written
// (advisory.flush: its successes on another connection, fenced by
// attempt, every other outcome on the session), for a claim that wants
// them again, and released together within parkFor (park); the keys of
// rows a claim did not take are released at once (unlock).
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

	// parked: keys sess holds whose deliveries are finished, kept for a
	// claim that wants them again (park); a release of them is due
	// (sweepDue) within parkFor.
	parked   map[string]struct{}
	sweepDue bool
	closed   bool // the form closed: finished keys are released at once
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
	ok, tried, err := h.lockOrTakeParked(sctx, keys, want)
	if err != nil {
		h.fail()
		return nil, 0, fmt.Errorf("sqlxbroker: try advisory locks (%d keys): %w", len(keys), err)
	}
	return ok, tried, nil
}

// lockOrTakeParked is lockKeys on the session, but a parked key (park) is
// taken as it is, with no statement: the session holds it already. The
// others are tried, with want less the parked ones. Where the parked keys
// alone are as many as want, the keys up to the want-th of them count as
// tried: the others among them are tried too, and of those locked beyond
// want, the last are parked rather than taken. No key before the last one
// tried is passed over, and no key locked is lost.
func (h *keyHolder) lockOrTakeParked(ctx context.Context, keys []string, want int) ([]bool, int, error) {
	ok := make([]bool, len(keys))
	parked := 0
	for i, k := range keys {
		if _, p := h.parked[k]; p {
			ok[i] = true
			parked++
		}
	}
	tried, w := len(keys), want
	if want > 0 {
		if parked >= want {
			n := 0
			for tried = 0; n < want; tried++ {
				if ok[tried] {
					n++
				}
			}
			w = tried - want // every key of the prefix not parked
		} else {
			w = want - parked
		}
	}
	rest, at := make([]string, 0, tried), make([]int, 0, tried)
	for i, k := range keys[:tried] {
		if !ok[i] {
			rest, at = append(rest, k), append(at, i)
		}
	}
	if len(rest) > 0 {
		got, n, err := h.lockKeys(ctx, h.sess, rest, w)
		if err != nil {
			return nil, 0, err
		}
		h.used = time.Now()
		for j, b := range got {
			if b {
				ok[at[j]] = true
				h.held[rest[j]] = struct{}{}
			}
		}
		if n < len(rest) {
			tried = at[n]
		}
	}
	taken := 0
	for i, k := range keys {
		switch {
		case i >= tried:
			ok[i] = false // untried: a parked key stays parked
		case !ok[i]:
		case want > 0 && taken == want:
			ok[i] = false // locked beyond want: parked for the next claim
			h.parkKey(k)
		default:
			taken++
			delete(h.parked, k)
		}
	}
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
	return h.releaseKeys(ctx, keys)
}

// releaseKeys unlocks keys, which the session holds, as release does.
func (h *keyHolder) releaseKeys(ctx context.Context, keys []string) error {
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

// parkFor is the longest the key of a finished delivery is kept on the
// session for the form's next claims (park).
var parkFor = 10 * time.Millisecond

// park keeps the keys of finished deliveries cs (their completions
// written) on the session, for a claim of a row of the same key, which
// takes it with no statement (lockOrTakeParked); the keys no claim took
// are released together within parkFor (sweep). Where keys are few
// against the handlers, a key's next row is mostly read by one of the
// next claims: the key is then neither released nor tried again, and
// the keys of many batches are released in one statement (at 1,000
// handlers over 1,000 keys on PostgreSQL, docs/performance.md). A key
// parked counts as held: another session's claim passes over its rows
// for at most parkFor longer than it did. After the form closed, keys
// are released at once. The caller holds h.mu.
func (h *keyHolder) park(ctx context.Context, cs []*advisoryClaim) error {
	if h.closed || parkFor <= 0 {
		return h.release(ctx, cs)
	}
	for _, c := range cs {
		if h.sess != nil && c.gen == h.gen {
			h.parkKey(c.key)
		}
	}
	return nil
}

// parkKey parks key, which the session holds, and has it released within
// parkFor unless a claim takes it; the caller holds h.mu.
func (h *keyHolder) parkKey(key string) {
	if h.parked == nil {
		h.parked = map[string]struct{}{}
	}
	h.parked[key] = struct{}{}
	h.sweepSoon()
}

// sweepSoon has the parked keys released within parkFor; the caller holds
// h.mu.
func (h *keyHolder) sweepSoon() {
	if len(h.parked) > 0 && !h.sweepDue {
		h.sweepDue = true
		time.AfterFunc(parkFor, h.sweep)
	}
}

// sweep releases the parked keys no claim took.
func (h *keyHolder) sweep() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.sweepDue = false
	_ = h.releaseParked(context.Background()) // a failure closes the session, which releases them
}

// releaseParked releases every parked key; the caller holds h.mu.
func (h *keyHolder) releaseParked(ctx context.Context) error {
	if len(h.parked) == 0 || h.sess == nil {
		return nil
	}
	keys := make([]string, 0, len(h.parked))
	for k := range h.parked {
		keys = append(keys, k)
	}
	h.parked = nil
	return h.releaseKeys(ctx, keys)
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
	h.sess, h.gen, h.held, h.parked = nil, nil, nil, nil
}

// close releases the parked keys and gives back a session that holds no
// other key when the form closes; keys finished later are released at
// once.
func (h *keyHolder) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	_ = h.releaseParked(context.Background()) // a failure closes the session, which releases them
	if h.sess != nil && len(h.held) == 0 {
		h.giveBack()
	}
}

// giveBack returns the session, which holds no key, to the pool, its lock
// wait limit reset; a session that cannot be reset is closed instead.
func (h *keyHolder) giveBack() {
	h.f.giveBack(h.sess)
	h.sess, h.gen, h.held, h.parked = nil, nil, nil, nil
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
