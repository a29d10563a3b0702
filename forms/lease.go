package forms

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/sqlxbroker/sqlxbroker/core"
)

// lease: one claim statement writes a host-computed deadline into the lease
// column and counts the attempt; it commits at once. The deadline is the
// delivery token: renewal (every half lease) and completion take effect only
// while the row still holds it. Successful completions that finish together
// are written in one statement.
type lease struct {
	base
	dur time.Duration

	mu     sync.Mutex
	groups map[*leaseGroup]struct{} // the groups with claims in work (renewer)

	done     chan struct{}
	wg       sync.WaitGroup
	startOne sync.Once

	batch batcher[*leaseClaim] // completions, written in batches by flush

	// clock is the host's clock (core.Now) the leases are written and
	// compared with; tests skew it.
	clock func() time.Time
}

func newLease(b base) *lease {
	f := &lease{base: b, dur: b.plan.Lease, groups: map[*leaseGroup]struct{}{}, done: make(chan struct{}), clock: core.Now}
	f.batch.flush = f.flush
	f.batch.linger = completionLinger
	return f
}

// Traits: one statement claims the whole batch. Where the database skips
// the rows another claim holds (a row locker), two claims of batches under
// leasePipelineBelow rows run at once: a claim of a few dozen rows is
// mostly round trips and a commit (MariaDB's claim is a transaction of
// four statements), and the second overlaps them; and a claim of a large
// batch takes half of it (core.Traits.HalfBatches), as the database writes
// claims and completions side by side.
func (f *lease) Traits() core.Traits {
	t := core.Traits{Batches: true, ClaimsAtOnce: 1}
	if f.plan.QGroup == "" && f.plan.Caps.RowLocker != nil {
		t.ClaimsAtOnce, t.ClaimsAtOnceBelow = leaseClaimers, leasePipelineBelow
		t.HalfBatches = true
	}
	return t
}

// leaseClaimers is the most lease claims one subscription runs at once.
const leaseClaimers = 2

// leasePipelineBelow is the batch size from which lease claims run one at
// a time again. From 512 rows on, two at once drained slower than one on
// PostgreSQL (the second steps over the rows the first holds), at 128-256
// alike; and four processes of 250 handlers each, eight claims at once,
// drained a sixth slower than with one claim each.
const leasePipelineBelow = 128

func (f *lease) Start(ctx context.Context) error {
	f.startOne.Do(func() {
		f.wg.Add(1)
		go f.renewer()
	})
	return nil
}

// Close stops renewal and completion batching: queued completions are
// written, later ones run alone. Leases in work then run out unless
// completed through the fence by a live form.
func (f *lease) Close() error {
	select {
	case <-f.done:
	default:
		close(f.done)
	}
	f.wg.Wait()
	f.batch.close()
	return nil
}

func (f *lease) Claim(ctx context.Context, max int) ([]core.Claim, error) {
	p := f.plan
	fifo := p.QGroup != ""
	// The floor before the claim's transaction: a pool of one connection
	// (an SQLite file's writer) has none to spare while it is open.
	f.scan.refreshFloor(ctx, f.db, p)
	if !fifo && p.Dialect.Features().LeaseClaimStatement {
		// One statement that waits for nothing commits by itself. It is
		// not cut short when ctx ends (a stopping subscription): rows it
		// leased would wait out their lease unhandled; they are handed out
		// instead, and the stop waits for them.
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), claimTimeout)
		defer cancel()
		cs, err := f.claimOn(sctx, f.db, nil, f.clock(), max)
		return cs, f.conflict(err)
	}
	tx, err := f.begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("sqlxbroker: begin lease claim: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // after Commit it is a no-op
	// The clock is read once the transaction is open: a begin that waited
	// for the database (SQLite's one writer) must not shorten the lease.
	// Rows are handed out only once the commit succeeded: a claim that
	// lost to another transaction (a deadlock, another node's claim on a
	// multi-primary cluster) delivers nothing and says ErrConflict.
	cs, err := f.claimOn(ctx, tx, tx, f.clock(), max)
	return cs, f.conflict(err)
}

// completionLinger is the longest a lease completion batch waits for the
// rest of the deliveries in work when it began (batcher.linger).
const completionLinger = 2 * time.Millisecond

// claimTimeout bounds a claim statement that a stop does not cut short.
const claimTimeout = 30 * time.Second

// claimOn claims up to max rows on q with deadlines from now and commits
// tx when it is not nil (a FIFO claim guards its groups in tx first).
func (f *lease) claimOn(ctx context.Context, q sqlx.ExtContext, tx *sqlx.Tx, now time.Time, max int) ([]core.Claim, error) {
	p := f.plan
	deadline := now.Add(f.dur)
	where, args := p.Ready(p.Alias, now)
	if p.QGroup != "" {
		ids, err := guardedHeads(ctx, tx, p, where, args, max)
		if err != nil {
			return nil, fmt.Errorf("sqlxbroker: lease claim on %s: %w", p.Table, err)
		}
		if len(ids) == 0 {
			return nil, nil
		}
		in, inArgs := p.Caps.MatchIDs(p, p.Alias+"."+p.QID, ids)
		where += " AND " + in
		args = append(args, inArgs...)
	}
	buf := claimRows.Get().(*[]row)
	var rows []row
	defer func() {
		// The claims keep the values, not the list; a read that failed
		// left its rows in the list.
		if clear(rows); rows == nil {
			clear((*buf)[:cap(*buf)])
		}
		if cap(rows) > cap(*buf) {
			*buf = rows[:0]
		}
		claimRows.Put(buf)
	}()
	var keep rescanOf
	for retry := false; ; retry = true {
		// Outside FIFO tables, from the cursor first (see cursor); when
		// that finds nothing, from the start (or the floor).
		from, fromArgs, full := "", []any(nil), true
		if p.QGroup == "" {
			from, fromArgs, keep, full = f.scan.from(p, p.Alias, retry)
		}
		rs, err := p.Caps.Leaser.ClaimLeases(ctx, q, &core.LeaseClaimParams{Plan: p, Where: where + from, Args: append(args, fromArgs...), Limit: max, Deadline: p.Time(deadline), Cursor: !full})
		if err == nil {
			rows, err = readRowsInto(rs, (*buf)[:0])
		}
		if err != nil {
			return nil, fmt.Errorf("sqlxbroker: lease claim on %s: %w", p.Table, err)
		}
		if full || len(rows) == max {
			break
		}
		// Fewer rows ahead of the cursor than asked: the next claim
		// scans from the start, and at once if none were found.
		if len(rows) > 0 {
			f.scan.reset()
			break
		}
	}
	if len(rows) == 0 {
		if keep != 0 {
			f.scan.rescanned(p, keep, nil, false)
		}
		return nil, nil
	}
	if p.QGroup == "" && keep != 0 {
		f.scan.rescanned(p, keep, p.OrderValues(rows[len(rows)-1].get), len(rows) == max)
	} else if p.QGroup == "" && len(rows) == max {
		f.scan.advance(p.OrderValues(rows[len(rows)-1].get))
	}
	out := make([]core.Claim, len(rows))
	claims := make([]*leaseClaim, len(rows))
	idAt, attemptAt := colAt(rows[0].cols, p.ID), colAt(rows[0].cols, p.Attempt)
	for i := range rows {
		attempt, err := f.attemptAt(&rows[i], attemptAt)
		if err != nil {
			return nil, err
		}
		c := &leaseClaim{f: f, token: deadline}
		c.row = f.deliveryAt(&rows[i], idAt, attemptAt, counted(attempt), "")
		claims[i], out[i] = c, c
	}
	if tx != nil {
		if err := tx.Commit(); err != nil {
			return nil, fmt.Errorf("sqlxbroker: commit lease claim on %s: %w", p.Table, err)
		}
	}
	f.batch.working.Add(int64(len(claims)))
	f.group(claims, deadline)
	return out, nil
}

// claimRows keeps the row lists lease claims read, for the next claims.
var claimRows = sync.Pool{New: func() any { return new([]row) }}

// leaseGroup watches the deadline of claims that got it together: the
// rows of one claim, or the leases one renewal statement renewed. One
// timer per group, not per claim: a claim of 1,000 rows starts one. A
// claim leaves its group when it finishes or is renewed into a later
// one; the group ends (its timer stopped, the renewer forgets it) when
// the last leaves.
type leaseGroup struct {
	timer  *time.Timer
	claims []atomic.Pointer[leaseClaim] // a claim's slot; nil once it left
	left   atomic.Int64                 // claims still in the group
}

// group puts claims, whose locks the caller holds or which no one else
// knows yet, in a new group that expires at deadline.
func (f *lease) group(claims []*leaseClaim, deadline time.Time) {
	if len(claims) == 0 {
		return
	}
	g := &leaseGroup{claims: make([]atomic.Pointer[leaseClaim], len(claims))}
	for i, c := range claims {
		g.claims[i].Store(c)
		c.grp, c.slot = g, i
	}
	g.left.Store(int64(len(claims)))
	// The timer is set before the renewer can see the group: a renewal
	// may end it at once.
	g.timer = time.AfterFunc(time.Until(deadline), g.expire)
	f.mu.Lock()
	f.groups[g] = struct{}{}
	f.mu.Unlock()
}

// expire tells each claim still in the group that its deadline passed.
func (g *leaseGroup) expire() {
	for i := range g.claims {
		if c := g.claims[i].Load(); c != nil {
			c.expire()
		}
	}
}

// leave takes c out of its group (c.mu held), ending the group when c
// was the last in it.
func (c *leaseClaim) leave() {
	g := c.grp
	if g == nil {
		return
	}
	c.grp = nil
	g.claims[c.slot].Store(nil)
	if g.left.Add(-1) == 0 {
		g.timer.Stop()
		c.f.mu.Lock()
		delete(c.f.groups, g)
		c.f.mu.Unlock()
	}
}

// inWork lists the claims in the form's groups: those not finished.
func (f *lease) inWork() []*leaseClaim {
	f.mu.Lock()
	groups := make([]*leaseGroup, 0, len(f.groups))
	for g := range f.groups {
		groups = append(groups, g)
	}
	f.mu.Unlock()
	var claims []*leaseClaim
	for _, g := range groups {
		for i := range g.claims {
			if c := g.claims[i].Load(); c != nil {
				claims = append(claims, c)
			}
		}
	}
	return claims
}

type leaseClaim struct {
	noTx
	f   *lease
	row core.Row

	mu       sync.Mutex
	token    time.Time   // the deadline the row holds for us
	grp      *leaseGroup // the group that watches token; nil once finished
	slot     int         // c's slot in grp
	finished bool        // completion started: renewal stops

	// lmu, not mu (which a renewal round holds while its statement runs,
	// however long the network makes it), guards the loss, so a lease
	// whose renewal cannot reach the database is told lost at its end.
	lmu     sync.Mutex
	wasLost bool   // the lease was lost
	onLost  func() // called once the lease is lost

	// The completion, while it waits in the form's batcher.
	o    core.Outcome
	done func(error)
}

func (c *leaseClaim) Row() *core.Row { return &c.row }

// markLost records the loss and runs the OnLost function once.
func (c *leaseClaim) markLost() {
	c.lmu.Lock()
	fn := c.onLost
	if c.wasLost {
		fn = nil
	}
	c.wasLost = true
	c.lmu.Unlock()
	if fn != nil {
		fn()
	}
}

// lost reports whether the lease was lost.
func (c *leaseClaim) lost() bool {
	c.lmu.Lock()
	defer c.lmu.Unlock()
	return c.wasLost
}

// OnLost runs fn when the lease is lost.
func (c *leaseClaim) OnLost(fn func()) {
	c.lmu.Lock()
	if c.wasLost {
		c.lmu.Unlock()
		fn()
		return
	}
	c.onLost = fn
	c.lmu.Unlock()
}

// expire runs when the deadline of c's group passes (leaseGroup): without
// a renewal another claim may now take the row, so the handler is told. A
// renewal round still running then (it holds c.mu) has not renewed the
// lease in time: whatever it does later, the row was claimable meanwhile.
func (c *leaseClaim) expire() {
	if !c.mu.TryLock() {
		c.markLost()
		return
	}
	defer c.mu.Unlock()
	if !c.finished && !time.Now().Before(c.token) {
		c.markLost()
	}
}

// finish stops renewal and returns the token completion must name. It is
// called when the completion statement is about to run, so a completion that
// waits its turn in a batch keeps its lease renewed meanwhile.
func (c *leaseClaim) finish() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stop()
}

// stop ends renewal and the expiry watch (c.mu held) and returns the token.
func (c *leaseClaim) stop() time.Time {
	c.finished = true
	c.leave()
	return c.token
}

// finishAll finishes a batch of claims (finish).
func (f *lease) finishAll(batch []*leaseClaim) []time.Time {
	tokens := make([]time.Time, len(batch))
	for i, c := range batch {
		c.mu.Lock() // one at a time: a renewal round holds several
		tokens[i] = c.stop()
		c.mu.Unlock()
	}
	return tokens
}

// Complete queues the completion (batcher), written with what has queued
// together: successes in one statement, other outcomes one statement each,
// on at most flushers connections; done gets the result (a flush is bounded
// by its own timeout, so done is always called). Once the form is closed
// the completion runs alone. Whatever the result, the lease is renewed no
// more.
func (c *leaseClaim) Complete(ctx context.Context, o core.Outcome, done func(error)) {
	c.o, c.done = o, done
	if !c.f.batch.add(c) { // the claim leaves batch.working
		done(c.f.completeOne(ctx, c, o))
	}
}

// completeOne records o for one claim, fenced by its token.
func (f *lease) completeOne(ctx context.Context, c *leaseClaim, o core.Outcome) error {
	token := c.finish()
	q, args := f.completion(o, false, true, " AND "+f.plan.QLockedUntil+" = ?")
	args = append(args, c.row.ID, f.plan.Time(token))
	return f.retryConflicts(ctx, func() error {
		res, err := f.db.ExecContext(ctx, q, args...)
		if err != nil {
			return fmt.Errorf("sqlxbroker: lease completion (%s): %w", o.Kind, err)
		}
		return fenced(res.RowsAffected())
	})
}

func fenced(n int64, err error) error {
	switch {
	case err != nil:
		return fmt.Errorf("sqlxbroker: lease completion: rows affected: %w", err)
	case n == 0:
		return core.ErrLeaseLost
	}
	return nil
}

// fence returns the condition that matches each claim's row while it still
// holds the claim's token (Leaser.FenceLeases).
func (f *lease) fence(claims []*leaseClaim, tokens []time.Time) (string, []any) {
	p := f.plan
	ids := make([]any, len(claims))
	toks := make([]any, len(claims))
	for i, c := range claims {
		ids[i] = c.row.ID
		if i > 0 && tokens[i].Equal(tokens[i-1]) {
			toks[i] = toks[i-1] // a batch's tokens are mostly one claim's
		} else {
			toks[i] = p.Time(tokens[i])
		}
	}
	return p.Caps.Leaser.FenceLeases(p, ids, toks)
}

// fencedBatch runs "<head> WHERE <fence of claims>" and reports, per
// claim, whether its row matched. With RETURNING (returning true, the head
// ends before " RETURNING id") the statement names the rows it changed.
// Where the dialect reports no conflicts (core.Capabilities.ReturningAlone)
// it runs alone, committing itself:
// one round trip where a transaction around it took three (four
// processes of 250 handlers drained a PostgreSQL lease table 12% faster).
// Its outcome is as certain as a COMMIT's: an error before the reply (a
// connection lost, the 30 s bound of a flush) leaves unknown whether the
// rows changed, and the deliveries report the error; a row that did not
// change keeps its lease and is claimed again when the lease ends. A
// dialect with a ConflictDetector keeps the transaction: on a
// multi-primary cluster a statement run alone that loses certification is
// run again by the node itself (Galera's wsrep_retry_autocommit) after it
// may have returned the rows of its first run, where a transaction's loss
// is reported at its COMMIT and the form runs the batch again. Without
// RETURNING, the statement runs in a transaction that commits only when it
// changed every row; otherwise it is rolled back and each claim runs alone
// in one transaction, so a lost lease costs a second pass, never a wrong
// answer. headArgs bind the head's '?'s.
func (f *lease) fencedBatch(ctx context.Context, head string, headArgs []any, returning bool, claims []*leaseClaim, tokens []time.Time) ([]bool, error) {
	p := f.plan
	if len(claims) > 1 && returning {
		hit := make([]bool, len(claims))
		cond, args := f.fence(claims, tokens)
		q := p.Rebind(head + " WHERE " + cond)
		args = append(append([]any{}, headArgs...), args...)
		var on sqlx.QueryerContext = f.db
		var tx *sqlx.Tx
		if !p.Caps.ReturningAlone() {
			var err error
			if tx, err = f.db.BeginTxx(ctx, nil); err != nil {
				return nil, err
			}
			defer tx.Rollback() //nolint:errcheck // no-op after Commit
			on = tx
		}
		rows, err := on.QueryxContext(ctx, q+" RETURNING "+p.QID, args...)
		if err != nil {
			return nil, err
		}
		got, err := readColumn(rows, len(claims))
		if err != nil {
			return nil, err
		}
		if len(got) == len(claims) { // ids are distinct: every row matched
			for i := range hit {
				hit[i] = true
			}
		} else {
			changed := make(map[string]bool, len(got))
			for _, g := range got {
				changed[idKey(g)] = true
			}
			for i, c := range claims {
				hit[i] = changed[idKey(c.row.ID)]
			}
		}
		if tx != nil {
			return hit, tx.Commit()
		}
		return hit, nil
	}
	one := p.Rebind(head + " WHERE " + p.QID + " = ? AND " + p.QLockedUntil + " = ?")
	oneArgs := func(i int) []any {
		return append(append([]any{}, headArgs...), claims[i].row.ID, p.Time(tokens[i]))
	}
	if len(claims) == 1 {
		res, err := f.db.ExecContext(ctx, one, oneArgs(0)...)
		if err != nil {
			return nil, err
		}
		n, err := res.RowsAffected()
		return []bool{n > 0}, err
	}
	cond, args := f.fence(claims, tokens)
	hit, tx, err := f.allOrEach(ctx, len(claims), p.Rebind(head+" WHERE "+cond), append(append([]any{}, headArgs...), args...), one, oneArgs)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback() //nolint:errcheck // no-op after Commit
	return hit, tx.Commit()
}

// renewer renews every lease in work once per half lease.
func (f *lease) renewer() {
	defer f.wg.Done()
	t := time.NewTicker(f.dur / 2)
	defer t.Stop()
	for {
		select {
		case <-f.done:
			return
		case <-t.C:
		}
		claims := f.inWork()
		for len(claims) > 0 {
			n := min(len(claims), maxBatch)
			f.renewAll(claims[:n])
			claims = claims[n:]
		}
	}
}

// renewAll renews claims in one statement where the dialect can say which
// rows it changed, else in one transaction, so a single-writer database
// takes its write lock once per round. Each claim is locked until the round
// ends: a completion waiting for one then names the renewed token. Tokens
// change only when the renewal commits.
func (f *lease) renewAll(claims []*leaseClaim) {
	p := f.plan
	var live []*leaseClaim
	var tokens []time.Time
	// A renewal may take until the earliest lease runs out: a busy
	// database (SQLite's one writer) makes it wait for its turn. A lease
	// already run out does not count: its handler was told, and may go on
	// for as long as it likes while the others are renewed.
	now := time.Now()
	until := now.Add(f.dur)
	for _, c := range claims {
		c.mu.Lock()
		if c.finished || c.lost() {
			// A lost lease is another claim's now: nothing to renew.
			c.mu.Unlock()
			continue
		}
		live = append(live, c)
		tokens = append(tokens, c.token)
		if c.token.After(now) {
			until = minTime(until, c.token)
		}
	}
	defer func() {
		for _, c := range live {
			c.mu.Unlock()
		}
	}()
	if len(live) == 0 {
		return
	}
	ctx, cancel := context.WithDeadline(context.Background(), until)
	defer cancel()
	next := f.clock().Add(f.dur)
	head := "UPDATE " + p.QTable + " SET " + p.QLockedUntil + " = ?"
	hit, err := f.fencedBatch(ctx, head, []any{p.Time(next)}, p.Dialect.Features().UpdateReturning, live, tokens)
	if err != nil {
		return // the expiry timers tell the handlers if this goes on
	}
	renewed := live[:0:0]
	for i, c := range live {
		if !hit[i] {
			c.markLost()
			continue
		}
		c.token = next
		c.leave()
		renewed = append(renewed, c)
	}
	f.group(renewed, next)
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// LeaseConnections is the most connections of its pool a lease-form
// subscription uses at once, whatever its concurrency: up to leaseClaimers
// claim, flushers write completions, one renews. (On PostgreSQL a pool's listening
// connection, shared by all its subscriptions, comes on top unless the
// dialect listens on a connection of its own.)
const LeaseConnections = leaseClaimers + flushers + 1

// flush records a batch: the successes in one fenced statement, every other
// outcome alone, and answers each request.
func (f *lease) flush(batch []*leaseClaim) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	wins := make([]*leaseClaim, 0, len(batch))
	seen := seenIDs.Get().(map[any]bool)
	defer func() {
		clear(seen)
		seenIDs.Put(seen)
	}()
	for _, r := range batch {
		id := mapKey(r.row.ID)
		if r.o.Kind != core.Succeeded || seen[id] {
			// A row claimed twice by this form (its first lease lost)
			// cannot be fenced twice in one statement.
			r.done(f.completeOne(ctx, r, r.o))
			continue
		}
		seen[id] = true
		wins = append(wins, r)
	}
	if len(wins) == 0 {
		return
	}
	errs := f.succeed(ctx, wins)
	for i, r := range wins {
		r.done(errs[i])
	}
}

// seenIDs holds the maps flush finds a batch's repeated ids with, kept
// from batch to batch rather than grown again for each.
var seenIDs = sync.Pool{New: func() any { return map[any]bool{} }}

// succeed completes successful deliveries together: deleted, or marked done
// when the table has a DoneAt column. Per request: nil, ErrLeaseLost, or
// the statement's error.
func (f *lease) succeed(ctx context.Context, batch []*leaseClaim) []error {
	p := f.plan
	tokens := f.finishAll(batch)
	head, args := "DELETE FROM "+p.QTable, []any(nil)
	returning := p.Dialect.Features().DeleteReturning
	if p.QDoneAt != "" {
		head = "UPDATE " + p.QTable + " SET " + p.QDoneAt + " = ?, " + p.QLockedUntil + " = NULL"
		args = []any{p.Time(core.Now())}
		returning = p.Dialect.Features().UpdateReturning
	}
	var hit []bool
	err := f.retryConflicts(ctx, func() (err error) {
		hit, err = f.fencedBatch(ctx, head, args, returning, batch, tokens)
		return err
	})
	errs := make([]error, len(batch))
	for i := range errs {
		switch {
		case err != nil:
			errs[i] = fmt.Errorf("sqlxbroker: lease completion: %w", err)
		case !hit[i]:
			errs[i] = core.ErrLeaseLost
		}
	}
	return errs
}
