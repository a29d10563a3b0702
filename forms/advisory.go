package forms

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/sqlxbroker/sqlxbroker/core"
)

// advisory: ready rows are read with their keys; the keys are tried
// without waiting on the session that holds the form's keys (keyHolder); the
// rows are taken (attempt counted) while still claimable; the handler runs
// with the key locked; completions are written in batches, successes
// fenced by the attempt their take counted, then their keys are parked for
// the next claims and released within parkFor (keyHolder.park).
// No transaction stays open, and deliveries hold no connection: one
// session holds the keys of all of them.
type advisory struct {
	base
	mu      sync.Mutex
	held    map[string]bool // keys this form holds or is trying
	keys    keyHolder
	writers writers       // the connections successes are written on
	stop    chan struct{} // ends the holder's pings
	stopped sync.Once

	batch batcher[*advisoryClaim] // completions, written in batches by flush

	// contended: the last wave found keys another session holds.
	contended atomic.Bool

	fmu     sync.Mutex
	writing int           // batches being written
	written chan struct{} // closed when a batch has been written
}

func newAdvisory(b base) *advisory {
	f := &advisory{base: b, held: map[string]bool{}, stop: make(chan struct{}), written: make(chan struct{})}
	f.keys.f, f.writers.f = f, f
	f.batch.flush = f.flush
	if !f.beside() {
		// Batches are written on the one key session, one after
		// another: a second writer would only wait for it with a batch
		// that could have grown meanwhile.
		f.batch.most = 1
	}
	return f
}

// Traits: one candidate read and one take serve a batch, and two claims
// run at once, so one claim's candidate read, key try and take overlap
// another's. Where the database writes side by side (a row locker), a
// claim of a large batch takes half of it (core.Traits.HalfBatches), so
// the two claims both run: one of every free handler's row left the other
// none to claim for.
func (f *advisory) Traits() core.Traits {
	return core.Traits{Batches: true, ClaimsAtOnce: advisoryClaimers, HalfBatches: f.plan.Caps.RowLocker != nil}
}

// advisoryClaimers is how many claims an advisory subscription runs at once.
const advisoryClaimers = 2

// AdvisoryConnections is the most connections of its pool an
// advisory-form subscription uses at once, whatever its concurrency: the
// session holding the keys, one per claim running, and flushers writing
// completion batches. Handlers hold none.
const AdvisoryConnections = 1 + advisoryClaimers + flushers

func (f *advisory) Start(ctx context.Context) error {
	go f.keys.pings(f.stop)
	return nil
}

// Close ends the holder's pings. Keys still held stay held until their
// claims complete; the holder's session goes back to the pool with the
// last of them.
func (f *advisory) Close() error {
	f.stopped.Do(func() { close(f.stop) })
	f.keys.close()
	f.writers.giveBack(true)
	return nil
}

// candidates is how many rows per wanted claim are read: rows whose keys are
// held elsewhere are skipped, so a claim looks further than it needs.
const candidates = 4

// pages is how many pages of candidates one claim reads at most: the first
// rows of a busy table mostly have keys in work elsewhere.
const pages = 8

// enough reports whether a claim of max rows that has taken got reads no
// further page: a quarter of its rows, and at least enoughRows of them.
// The rows a claim has taken wait for its end, their keys held, while its
// later pages read four candidates per row still wanted; where keys are
// few against the handlers (most held by the form's own deliveries),
// those pages find little, and the rows taken reach their handlers, and
// their keys the next claim, a page later each. Ended, the claim hands
// them over at once, and the next claim (the handlers it left free) reads
// on from the cursor. A small claim reads its next page instead: a page
// of a few rows costs less than the claim that would follow. Measured at
// 1,000 handlers over 1,000 keys (docs/performance.md): faster on
// PostgreSQL in every pair of runs (by 2-29%), and alike at 8 and 64
// handlers.
func enough(got, max int) bool { return got >= enoughRows && got*4 >= max }

// enoughRows is the fewest rows after which a claim ends (see enough).
const enoughRows = 64

func (f *advisory) Claim(ctx context.Context, max int) ([]core.Claim, error) {
	p := f.plan
	f.awaitBatch(ctx)
	f.scan.refreshFloor(ctx, f.db, p)
	where, args := p.Ready(p.Alias, core.Now())
	cols := f.candidateCols()
	// The rows of this form's own deliveries are still claimable (their
	// keys are what hold them) and mostly lie behind the cursor (see
	// cursor), where the last claims found rows: a claim reads from there
	// first. A full scan (periodic, or when the rows ahead of the cursor
	// were too few) starts at the first row and looks past them too.
	//
	// From the cursor a claim reads only rows no claim has counted yet
	// (Plan.Uncounted): ahead of it lie the deliveries other
	// subscriptions took since (another process's, their attempts counted
	// as they were taken), whose keys would be tried in vain, and whose
	// rows, once finished, would be locked and looked for in vain. A
	// counted row that is claimable again (a retry) is found by the next
	// full scan, as one behind the cursor is.
	f.mu.Lock()
	held := len(f.held)
	f.mu.Unlock()
	var out []core.Claim
	tried := make(map[string]bool, max)
	for retry := false; ; retry = true {
		from, fromArgs, keep, full := "", []any(nil), rescanOf(0), true
		if p.QGroup == "" {
			from, fromArgs, keep, full = f.scan.from(p, p.Alias, retry)
		}
		// Ahead of the cursor, most rows are claimable: the first page
		// reads a little more than is wanted (a full scan, the rows held
		// too), the next pages (past rows whose keys are held) more.
		first := max - len(out)
		first += first/candidates + 1
		if full {
			first += held
		}
		w := where + from
		if !full {
			w = where + " AND " + p.Uncounted(p.Alias) + from
		}
		want := max - len(out)
		got, end, last, err := f.claimFrom(ctx, cols, w, append(append([]any{}, args...), fromArgs...), first, want, tried, keep != 0)
		out = append(out, got...)
		if keep != 0 {
			// A rescan's rows leave the cursor where it was (see cursor).
			// A claim that ended with enough rows (see enough) counts as
			// full: more rows may stand before the cursor.
			f.scan.rescanned(p, keep, last, len(got) == want || !end && enough(len(got), want))
		}
		if err != nil {
			return out, err
		}
		if full || len(out) == max || !end {
			break
		}
		// Fewer rows ahead of the cursor than asked: scan from the start
		// at once (the cursor's rows were tried already).
	}
	return out, nil
}

// candidateCols is the select list of a page of candidates: the ID, the
// order columns and the key's columns, each once (the ID is mostly the
// order too; every value is decoded and kept per candidate).
func (f *advisory) candidateCols() string {
	p := f.plan
	seen := map[string]bool{p.QID: true}
	cols := p.Alias + "." + p.QID
	add := func(q string) {
		if !seen[q] {
			seen[q] = true
			cols += ", " + p.Alias + "." + q
		}
	}
	for _, k := range p.OrderKeys {
		add(k.Q)
	}
	for _, k := range p.QKeyCols {
		add(k)
	}
	return cols
}

// batchWait is the longest a claim waits for a completion batch being
// written.
const batchWait = 20 * time.Millisecond

// awaitBatch waits, for at most batchWait, for a completion batch being
// written to end: the handlers that freed the claim's places have their
// keys parked with it (keyHolder.park), and their keys' next rows are
// what the claim reads first (a claim that ran meanwhile would find those
// keys held and read page after page for little).
func (f *advisory) awaitBatch(ctx context.Context) {
	var t *time.Timer
	for {
		f.batch.mu.Lock()
		queued := len(f.batch.queue)
		f.batch.mu.Unlock()
		f.fmu.Lock()
		n, ch := f.writing, f.written
		f.fmu.Unlock()
		if n == 0 {
			return // nothing written now; what is queued starts at once
		}
		if t == nil {
			t = time.NewTimer(batchWait)
			defer t.Stop()
		}
		select {
		case <-ch:
		case <-t.C:
			return
		case <-ctx.Done():
			return
		}
		if queued == 0 {
			return
		}
	}
}

// claimFrom is one scan of Claim: pages of candidates over where (the
// first of up to first rows, the others of candidates rows per row still
// wanted), until max claims are taken or a page leaves enough of them
// (see enough); end reports that the scan reached
// the last ready row. The cursor moves past each wave of candidates as its
// keys are tried, so a claim running meanwhile starts after them; in a
// rescan (keep) it stays, and last is the order position of the last
// candidate tried (nil: none), for cursor.rescanned.
func (f *advisory) claimFrom(ctx context.Context, cols, where string, args []any, first, max int, tried map[string]bool, keep bool) (out []core.Claim, end bool, last []any, err error) {
	p := f.plan
	var after []any // the order values the next page starts after
	for n := 0; n < pages && len(out) < max && ctx.Err() == nil; n++ {
		size := (max - len(out)) * candidates // rows per row still wanted
		if n == 0 {
			size = first
		}
		page := fmt.Sprintf("SELECT %s FROM %s %s WHERE %s%%s ORDER BY %s LIMIT %d", cols, p.QTable, p.Alias, where, p.OrderBy(p.Alias), size)
		q, a := fmt.Sprintf(page, ""), args
		if after != nil {
			cond, ca := p.From(p.Alias, after, true)
			q, a = fmt.Sprintf(page, " AND "+cond), append(append([]any{}, args...), ca...)
		}
		rs, err := f.db.QueryxContext(ctx, p.Rebind(q), a...)
		if err != nil {
			return out, false, last, fmt.Errorf("sqlxbroker: advisory candidates on %s: %w", p.Table, err)
		}
		cands, err := readRowsN(rs, size)
		if err != nil {
			return out, false, last, fmt.Errorf("sqlxbroker: advisory candidates on %s: %w", p.Table, err)
		}
		// Lock the keys of as many candidates as are wanted on the key
		// session, a wave of them in one statement; then take their rows
		// together. A row another subscription took and finished since
		// the page was read cannot be taken: the page's next candidates
		// are tried before the next page, so no ready row is passed over.
		for i := 0; i < len(cands) && len(out) < max && ctx.Err() == nil; {
			var locked []*advisoryClaim
			for i < len(cands) && len(out)+len(locked) < max && err == nil && ctx.Err() == nil {
				// Once a wave has found keys held by another session (other
				// processes read the same rows, and a wave of as many keys
				// as are wanted loses some to them, and another follows),
				// a dialect that can stop at the keys wanted is given the
				// page's every candidate left; the candidates it did not
				// try are tried by the next wave or claim. Not before: the
				// form's other claim running meanwhile passes over the
				// keys of a wave.
				need := max - len(out) - len(locked)
				size := need
				if f.plan.Caps.AdvisoryFirstLocker != nil && f.contended.Load() {
					size = len(cands) - i
				}
				wave := make([]*advisoryClaim, 0, min(len(cands)-i, size))
				at := make([]int, 0, cap(wave)) // the candidate of each
				for ; i < len(cands) && len(wave) < size; i++ {
					r := &cands[i]
					key := p.Key.Render(r.get)
					if tried[key] || !f.hold(key) {
						continue
					}
					tried[key] = true
					wave = append(wave, &advisoryClaim{f: f, key: key, id: r.vals[0]})
					at = append(at, i)
				}
				if len(wave) == 0 {
					break
				}
				// The next claim starts after this wave's rows, not among them.
				if last = p.OrderValues(cands[i-1].get); !keep {
					f.scan.advance(last)
				}
				var got []*advisoryClaim
				var n int
				got, n, err = f.tryLocks(ctx, wave, need)
				f.contended.Store(len(got) < n)
				locked = append(locked, got...)
				if n < len(wave) {
					// Untried: the next wave (or claim) starts at them.
					for _, c := range wave[n:] {
						delete(tried, c.key)
					}
					i = at[n]
					if last = p.OrderValues(cands[at[n-1]].get); !keep {
						f.scan.advance(last)
					}
				}
			}
			taken, terr := f.takeAll(ctx, locked)
			out = append(out, taken...)
			if err = errors.Join(err, terr); err != nil {
				return out, false, last, err
			}
			if len(locked) == 0 {
				break
			}
		}
		if enough(len(out), max) {
			return out, false, last, nil
		}
		if len(cands) < size {
			return out, true, last, nil
		}
		if after = orderPosition(p.OrderValues(cands[len(cands)-1].get)); after == nil {
			break // a NULL order value: no page can start after it
		}
	}
	return out, false, last, nil
}

// takeAll takes the rows of claims whose keys are locked: it counts each
// row's attempt while the row is still claimable and reads it, and returns
// the claims whose rows it took. The keys of the rest are released. A plain
// table takes every row in one statement; a FIFO table takes each row under
// the dialect's group guard.
//
// Claims whose session already ended are not taken: another subscription
// may hold their keys by now. The rows are taken without ctx's end (with
// holderTimeout): an attempt counted by a statement that was then cut
// short would be counted for a row nobody runs.
func (f *advisory) takeAll(ctx context.Context, claims []*advisoryClaim) ([]core.Claim, error) {
	var gone []*advisoryClaim
	claims = slices.DeleteFunc(claims, func(c *advisoryClaim) bool {
		lost := c.gen.isLost()
		if lost {
			gone = append(gone, c)
		}
		return lost
	})
	lostErr := f.keys.unlock(ctx, gone...) // drops their keys; the server let them go
	if len(claims) == 0 {
		return nil, lostErr
	}
	ctx, cancel := stmtCtx(ctx)
	defer cancel()
	var out []core.Claim
	errs := lostErr
	var free []*advisoryClaim
	keep := func(c *advisoryClaim, r *row, err error) {
		if err == nil && r != nil {
			var attempt int
			if attempt, err = f.attemptOf(r); err == nil {
				c.row, c.attempt = f.delivery(r, counted(attempt), c.key), attempt
				out = append(out, c)
				return
			}
		}
		if err != nil {
			errs = errors.Join(errs, fmt.Errorf("sqlxbroker: take advisory row %v: %w", c.id, err))
		}
		free = append(free, c)
	}
	if f.plan.QGroup != "" {
		for _, c := range claims {
			r, err := f.count(ctx, c.id)
			keep(c, r, err)
		}
		return out, errors.Join(errs, f.keys.unlock(ctx, free...))
	}
	rows, err := f.countAll(ctx, claims)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("sqlxbroker: take advisory rows on %s: %w", f.plan.Table, err), f.keys.unlock(ctx, claims...))
	}
	byID := make(map[string]*row, len(rows))
	for i := range rows {
		byID[idKey(rows[i].get(f.plan.ID))] = &rows[i]
	}
	for _, c := range claims {
		keep(c, byID[idKey(c.id)], nil)
	}
	return out, errors.Join(errs, f.keys.unlock(ctx, free...))
}

// countAll adds 1 to the attempt of each row of claims that is still
// claimable and returns those rows as they now are (updateRows: the rows'
// keys are held, so no completion changes a row between an UPDATE and its
// read, and the condition does not depend on the attempt).
func (f *advisory) countAll(ctx context.Context, claims []*advisoryClaim) ([]row, error) {
	p := f.plan
	ids := make([]any, len(claims))
	for i, c := range claims {
		ids[i] = c.id
	}
	where, args := p.Ready(p.QTable, core.Now())
	in, inArgs := p.Caps.MatchIDs(p, p.QTable+"."+p.QID, ids)
	return f.updateRows(ctx, f.db, p.QAttempt+" = "+p.NextAttempt(""), in+" AND "+where, append(inArgs, args...), len(ids))
}

// tryLocks tries the keys of wave on the holder's session, with want > 0
// only until want are locked where the dialect can stop there
// (core.AdvisoryFirstLocker), and returns the claims whose keys it locked
// and how many of wave (from the first) it tried; the keys of the others
// are dropped.
func (f *advisory) tryLocks(ctx context.Context, wave []*advisoryClaim, want int) ([]*advisoryClaim, int, error) {
	keys := make([]string, len(wave))
	for i, c := range wave {
		keys[i] = c.key
	}
	ok, tried, gen, err := f.keys.try(ctx, keys, want)
	var out []*advisoryClaim
	for i, c := range wave {
		if err == nil && ok[i] {
			c.gen = gen
			out = append(out, c)
		} else {
			f.drop(c.key)
		}
	}
	if err != nil {
		tried = len(wave) // the claim ends: nothing is left to try again
	}
	return out, tried, err
}

// hold marks key as held by this form; false when it already is.
func (f *advisory) hold(key string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.held[key] {
		return false
	}
	f.held[key] = true
	return true
}

func (f *advisory) drop(key string) {
	f.mu.Lock()
	delete(f.held, key)
	f.mu.Unlock()
}

// count adds 1 to the row's attempt while it is still claimable and reads
// it back; nil when it is not claimable any more. For a FIFO table the
// dialect's group guard is held around the check in a short transaction.
func (f *advisory) count(ctx context.Context, id any) (*row, error) {
	p := f.plan
	where, args := p.Ready(p.QTable, core.Now())
	in := p.QTable + "." + p.QID + " = ? AND " + where
	args = append([]any{id}, args...)
	var q sqlx.ExtContext = f.db
	var tx *sqlx.Tx
	if p.QGroup != "" {
		var err error
		if tx, err = f.begin(ctx); err != nil {
			return nil, err
		}
		defer tx.Rollback() //nolint:errcheck // no-op after Commit
		q = tx
		g, err := f.groupOf(ctx, tx, id)
		if err != nil || g == nil {
			return nil, err
		}
		ok, err := p.Caps.GroupGuard.GuardGroup(ctx, tx, &core.GroupGuardParams{Plan: p, Group: g})
		if err != nil || !ok {
			return nil, err
		}
	}
	rows, err := f.updateRows(ctx, q, p.QAttempt+" = "+p.NextAttempt(""), in, args, 1)
	if err != nil {
		return nil, err
	}
	if len(rows) == 0 {
		return nil, nil
	}
	if tx != nil {
		if err := tx.Commit(); err != nil {
			return nil, err
		}
	}
	return &rows[0], nil
}

func (f *advisory) groupOf(ctx context.Context, q sqlx.QueryerContext, id any) (any, error) {
	p := f.plan
	var g any
	err := q.QueryRowxContext(ctx, p.Rebind("SELECT "+p.QGroup+" FROM "+p.QTable+" WHERE "+p.QID+" = ?"), id).Scan(&g)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil // completed by another claim since the candidates were read
	}
	if err != nil {
		return nil, err
	}
	if g == nil {
		return "", nil // no group: any non-nil value lets the take go on unguarded
	}
	return g, nil
}

type advisoryClaim struct {
	noTx
	f       *advisory
	gen     *holding // the holder's session that locked the key
	key     string
	id      any
	attempt int // the row's attempt as the take counted it: the completion's fence
	row     core.Row
	o       core.Outcome // the completion, while it waits for its batch
	done    func(error)
}

func (c *advisoryClaim) Row() *core.Row { return &c.row }

// OnLost calls fn when the session holding the key ends before the
// claim completes.
func (c *advisoryClaim) OnLost(fn func()) { c.gen.onLost(c, fn) }

// lost is what completing a claim whose session ended returns.
func (c *advisoryClaim) lost(o core.Outcome) error {
	return fmt.Errorf("%w: the session holding advisory key %q ended before the %s completion", core.ErrLeaseLost, c.key, o.Kind)
}

// Complete queues the completion (batcher) and returns at once:
// completions that queue while a batch is written go together in the next
// (flush), which records o and then parks the key, so completions use
// no more connections than flushers whatever the concurrency. When the
// session holding the key ended first, another claim may already have the
// row: the completion changes nothing and done gets core.ErrLeaseLost (the
// row, attempt counted, is claimable again).
func (c *advisoryClaim) Complete(ctx context.Context, o core.Outcome, done func(error)) {
	c.o, c.done = o, done
	c.f.batch.add(c) // never closed: the key session outlives Close until its last key
}

// completeOne records o for one claim on q.
func (f *advisory) completeOne(ctx context.Context, q sqlx.ExecerContext, c *advisoryClaim, o core.Outcome) error {
	if stmt, args := f.completion(o, false, false, ""); stmt != "" {
		if _, err := q.ExecContext(ctx, stmt, append(args, c.row.ID)...); err != nil {
			return fmt.Errorf("sqlxbroker: advisory completion (%s): %w", o.Kind, err)
		}
	}
	return nil
}

// flush records a batch, then parks its keys on the key session for the
// next claims (keyHolder.park) and answers each claim. A claim whose
// session ended is answered with ErrLeaseLost and changes nothing: the
// server dropped its key, and another subscription may have taken the row.
//
// The successes are written in one statement (succeedAll), fenced by the
// attempt each take counted: a row another subscription took since (its
// key dropped with a session that ended while the statement ran) has its
// attempt counted again and is not changed, so no row is recorded
// finished twice. (Were that subscription's handler to snooze the row
// within that statement's round trip, which takes the count back, the
// success would still be written: a row both ran is then finished.) Where
// the database writes side by side (beside), the statement runs on a
// connection of its own, and the key session meanwhile tries the keys of
// claims: a batch written on it kept every claim waiting for the batch's
// commit (the tries of a claim waited 1 ms of its 6 at 1,000 handlers on
// PostgreSQL, docs/performance.md). That connection waits for row locks
// no longer than the key session does (writers): a row an application's
// transaction holds locked fails the batch's successes with the
// statement's error (their rows, attempt counted, are claimable again),
// and costs no other delivery. The keys are parked (and so may be
// released) only once the statement has returned: no row of a key starts
// while the one before it may still be written.
//
// Every other outcome is written alone on the key session, as the key's
// holder: those statements do not change the attempt consistently enough
// to fence by it (a snooze takes the count back). Each statement on the
// session has holderTimeout of its own (stmtCtx), and so does the ping
// that follows a failure: a statement that failed by itself (a
// constraint, a row lock waited on for longer than the session's limit,
// AdvisoryLocker.LockWaitLimit) costs only its own deliveries. One that
// ran out of time costs the session: lib/pq and go-sql-driver give up a
// connection whose statement they cancel, so its keys go with it and
// every delivery it held is lost; the rows come back with their attempt
// counted.
func (f *advisory) flush(batch []*advisoryClaim) {
	f.fmu.Lock()
	f.writing++
	f.fmu.Unlock()
	defer func() {
		f.fmu.Lock()
		f.writing--
		close(f.written)
		f.written = make(chan struct{})
		f.fmu.Unlock()
	}()
	ctx := context.Background()
	errs := make([]error, len(batch))
	h := &f.keys
	h.mu.Lock()
	wins, won := make([]*advisoryClaim, 0, len(batch)), make([]int, 0, len(batch))
	live := make([]*advisoryClaim, 0, len(batch))
	failed := false
	for i, c := range batch {
		c.gen.forget(c)
		switch {
		case h.sess == nil || c.gen != h.gen || c.gen.isLost():
			errs[i] = c.lost(c.o)
			continue
		case c.o.Kind == core.Succeeded:
			wins, won = append(wins, c), append(won, i)
		default:
			sctx, cancel := stmtCtx(ctx)
			if errs[i] = f.completeOne(sctx, h.sess, c, c.o); errs[i] != nil {
				failed = true
			}
			cancel()
		}
		live = append(live, c)
	}
	beside := f.beside()
	if len(wins) > 0 && !beside {
		sctx, cancel := stmtCtx(ctx)
		failed = f.succeedAll(sctx, h.sess, wins, won, errs) || failed
		cancel()
	}
	// A statement that failed may have failed with the session: then its
	// keys are gone, and so is every other delivery it held.
	if failed {
		sctx, cancel := stmtCtx(ctx)
		if h.sess.PingContext(sctx) != nil {
			h.fail()
		}
		cancel()
	}
	h.mu.Unlock()
	if len(wins) > 0 && beside {
		sctx, cancel := stmtCtx(ctx)
		if conn, err := f.writers.get(sctx); err != nil {
			for _, i := range won {
				errs[i] = err
			}
		} else {
			f.writers.put(conn, f.succeedAll(sctx, conn, wins, won, errs))
		}
		cancel()
	}
	h.mu.Lock()
	_ = h.park(ctx, live) // a failed release closes the session, which releases the keys
	h.mu.Unlock()
	for _, c := range batch {
		f.drop(c.key)
	}
	for i, c := range batch {
		c.done(errs[i])
	}
}

// beside reports whether successes are written beside the key session,
// on connections of their own (writers): where the database writes side
// by side (a row locker). Where it has one writer (SQLite), its writes
// take turns whatever the connection, and successes are written on the
// key session, one batch at a time (SQLite drained 6-26% slower at 1 to
// 64 handlers with them beside it, docs/performance.md).
func (f *advisory) beside() bool { return f.plan.Caps.RowLocker != nil }

// succeedAll completes the rows of claims (the batch's at won) as
// succeeded on conn in one statement that commits itself, deleted or
// marked done when the table has a DoneAt column, each while its attempt
// is the one its take counted (core.Plan.AttemptFence), and sets errs for
// those it did not complete; it reports whether the statement failed.
// Mostly it changed every row, as its rows affected say, in one round
// trip; where it changed fewer, they are read back: a row deleted, or
// marked done at the statement's time with its attempt as counted. (A row
// another subscription took, finished and deleted since would read as
// this one's: finished once either way.) A statement that commits itself
// is safe on a multi-primary cluster too: one that loses certification is
// run again by the node whole (Galera's wsrep_retry_autocommit), or fails.
func (f *advisory) succeedAll(ctx context.Context, conn *sqlx.Conn, claims []*advisoryClaim, won []int, errs []error) bool {
	p := f.plan
	ids, attempts := make([]any, len(claims)), make([]any, len(claims))
	for i, c := range claims {
		ids[i], attempts[i] = c.row.ID, c.attempt
	}
	fence, fenceArgs := p.AttemptFence(ids, attempts)
	head, args := "DELETE FROM "+p.QTable, []any(nil)
	var at any
	if p.QDoneAt != "" {
		at = p.Time(core.Now())
		head, args = "UPDATE "+p.QTable+" SET "+p.QDoneAt+" = ?", []any{at}
	}
	var n int64
	err := f.retryConflicts(ctx, func() error {
		res, err := conn.ExecContext(ctx, p.Rebind(head+" WHERE "+fence), append(args, fenceArgs...)...)
		if err == nil {
			n, err = res.RowsAffected()
		}
		return err
	})
	hit := make([]bool, len(claims))
	if err == nil && n < int64(len(claims)) {
		err = f.changed(ctx, conn, ids, fence, fenceArgs, at, hit)
	}
	for j, i := range won {
		switch {
		case err != nil:
			errs[i] = fmt.Errorf("sqlxbroker: advisory completion (%d succeeded): %w", len(claims), err)
		case n < int64(len(claims)) && !hit[j]:
			c := claims[j]
			errs[i] = fmt.Errorf("%w: row %v was taken again (its attempt is no longer %d) after the session holding advisory key %q ended", core.ErrLeaseLost, c.row.ID, c.attempt, c.key)
		}
	}
	return err != nil
}

// changed sets hit for the rows of ids that succeedAll changed: those
// gone, or, with a DoneAt column, marked done at at and still matching its
// fence (their attempt as counted).
func (f *advisory) changed(ctx context.Context, q sqlx.QueryerContext, ids []any, fence string, fenceArgs []any, at any, hit []bool) error {
	p := f.plan
	cond, args := p.Caps.MatchIDs(p, p.QID, ids)
	if at != nil {
		cond, args = "("+fence+") AND "+p.QDoneAt+" = ?", append(append([]any{}, fenceArgs...), at)
	}
	rows, err := q.QueryxContext(ctx, p.Rebind("SELECT "+p.QID+" FROM "+p.QTable+" WHERE "+cond), args...)
	if err != nil {
		return err
	}
	found, err := readColumn(rows, len(ids))
	if err != nil {
		return err
	}
	in := make(map[string]bool, len(found))
	for _, id := range found {
		in[idKey(id)] = true
	}
	for i, id := range ids {
		hit[i] = in[idKey(id)] == (at != nil)
	}
	return nil
}
