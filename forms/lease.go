package forms

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

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
	active map[*leaseClaim]struct{}

	done     chan struct{}
	wg       sync.WaitGroup
	startOne sync.Once
	complete chan *leaseDone
}

func newLease(b base) *lease {
	return &lease{base: b, dur: b.plan.Table.LeaseDuration(), active: map[*leaseClaim]struct{}{},
		done: make(chan struct{}), complete: make(chan *leaseDone)}
}

func (f *lease) Form() core.Form { return core.Lease }

func (f *lease) Start(ctx context.Context) error {
	if err := f.start(ctx, core.Lease); err != nil {
		return err
	}
	f.startOne.Do(func() {
		f.wg.Add(2)
		go f.renewer()
		go f.completer()
	})
	return nil
}

// Close stops renewal and completion batching. Leases in work then run out
// unless completed through the fence by a live form.
func (f *lease) Close() error {
	select {
	case <-f.done:
	default:
		close(f.done)
	}
	f.wg.Wait()
	return nil
}

func (f *lease) Claim(ctx context.Context, max int) ([]core.Claim, error) {
	p := f.plan
	tx, err := f.begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("sqlxbroker: begin lease claim: %w", err)
	}
	// The clock is read once the transaction is open: a begin that waited
	// for the database (SQLite's one writer) must not shorten the lease.
	now := core.Now()
	deadline := now.Add(f.dur)
	defer tx.Rollback() //nolint:errcheck // after Commit it is a no-op
	where, args := p.Ready(p.Alias, now)
	if p.QGroup != "" && p.Caps.GroupGuard != nil {
		ids, err := guardedHeads(ctx, tx, p, where, args, max)
		if err != nil {
			return nil, fmt.Errorf("sqlxbroker: lease claim on %s: %w", p.Table.Name, err)
		}
		if len(ids) == 0 {
			return nil, nil
		}
		where += " AND " + p.Alias + "." + p.QID + " IN (?" + strings.Repeat(", ?", len(ids)-1) + ")"
		args = append(args, ids...)
	}
	rs, err := p.Caps.Leaser.ClaimLeases(ctx, tx, &core.LeaseClaimParams{Plan: p, Where: where, Args: args, Limit: max, Deadline: p.Time(deadline)})
	if err != nil {
		return nil, fmt.Errorf("sqlxbroker: lease claim on %s: %w", p.Table.Name, err)
	}
	rows, err := readRows(rs)
	if err != nil {
		return nil, fmt.Errorf("sqlxbroker: lease claim on %s: %w", p.Table.Name, err)
	}
	if len(rows) == 0 {
		return nil, nil
	}
	ds := make([]*core.Delivery, len(rows))
	for i := range rows {
		attempt, err := f.attemptOf(&rows[i])
		if err != nil {
			return nil, err
		}
		ds[i] = f.delivery(&rows[i], attempt-1, "")
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("sqlxbroker: commit lease claim on %s: %w", p.Table.Name, err)
	}
	out := make([]core.Claim, len(ds))
	f.mu.Lock()
	for i, d := range ds {
		c := &leaseClaim{f: f, d: d, token: deadline, lost: make(chan struct{})}
		c.timer = time.AfterFunc(time.Until(deadline), c.expire)
		f.active[c] = struct{}{}
		out[i] = c
	}
	f.mu.Unlock()
	return out, nil
}

type leaseClaim struct {
	f *lease
	d *core.Delivery

	mu       sync.Mutex
	token    time.Time // the deadline the row holds for us
	timer    *time.Timer
	finished bool // completion started: renewal stops
	lostOnce sync.Once
	lost     chan struct{}
}

func (c *leaseClaim) Delivery() *core.Delivery { return c.d }
func (c *leaseClaim) Lost() <-chan struct{}    { return c.lost }

func (c *leaseClaim) markLost() { c.lostOnce.Do(func() { close(c.lost) }) }

// expire fires when the deadline passes without a renewal: another claim may
// now take the row, so the handler is told.
func (c *leaseClaim) expire() {
	c.mu.Lock()
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
	c.finished = true
	c.timer.Stop()
	c.f.mu.Lock()
	delete(c.f.active, c)
	c.f.mu.Unlock()
	return c.token
}

func (c *leaseClaim) Complete(ctx context.Context, o core.Outcome) error {
	f := c.f
	if o.Kind == core.Succeeded && f.plan.QDoneAt == "" {
		req := &leaseDone{claim: c, reply: make(chan error, 1)}
		select {
		case f.complete <- req:
			select {
			case err := <-req.reply:
				return err
			case <-ctx.Done():
				return ctx.Err()
			}
		case <-f.done:
			// Batching has stopped: complete alone.
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	token := c.finish()
	q, args := f.completion(o, false, true, " AND "+f.plan.QLockedUntil+" = ?")
	res, err := f.db.ExecContext(ctx, q, append(args, c.d.ID(), f.plan.Time(token))...)
	if err != nil {
		return fmt.Errorf("sqlxbroker: lease completion (%s): %w", o.Kind, err)
	}
	return fenced(res.RowsAffected())
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
		f.mu.Lock()
		claims := make([]*leaseClaim, 0, len(f.active))
		for c := range f.active {
			claims = append(claims, c)
		}
		f.mu.Unlock()
		f.renewAll(claims)
	}
}

// renewAll renews claims in one transaction, so a single-writer database
// takes its write lock once per round. Each claim is locked until the round
// ends: a completion waiting for one then names the renewed token. Tokens
// change only when the transaction commits.
func (f *lease) renewAll(claims []*leaseClaim) {
	p := f.plan
	var held []*leaseClaim
	defer func() {
		for _, c := range held {
			c.mu.Unlock()
		}
	}()
	// A renewal may take until the earliest lease runs out: a busy
	// database (SQLite's one writer) makes it wait for its turn. A lease
	// already run out does not count: its handler was told, and may go on
	// for as long as it likes while the others are renewed.
	now := time.Now()
	until := now.Add(f.dur)
	for _, c := range claims {
		c.mu.Lock()
		if !c.finished && c.token.After(now) && c.token.Before(until) {
			until = c.token
		}
		c.mu.Unlock()
	}
	ctx, cancel := context.WithDeadline(context.Background(), until)
	defer cancel()
	tx, err := f.db.BeginTxx(ctx, nil)
	if err != nil {
		return // the expiry timers tell the handlers if this goes on
	}
	defer tx.Rollback() //nolint:errcheck // no-op after Commit
	next := core.Now().Add(f.dur)
	q := p.Rebind("UPDATE " + p.QTable + " SET " + p.QLockedUntil + " = ? WHERE " + p.QID + " = ? AND " + p.QLockedUntil + " = ?")
	var renewed, lost []*leaseClaim
	for _, c := range claims {
		c.mu.Lock()
		held = append(held, c)
		if c.finished {
			continue
		}
		res, err := tx.ExecContext(ctx, q, p.Time(next), c.d.ID(), p.Time(c.token))
		if err != nil {
			return
		}
		if n, err := res.RowsAffected(); err == nil && n == 0 {
			lost = append(lost, c)
		} else {
			renewed = append(renewed, c)
		}
	}
	if err := tx.Commit(); err != nil {
		return
	}
	for _, c := range lost {
		c.markLost()
	}
	for _, c := range renewed {
		c.token = next
		c.timer.Reset(time.Until(next))
	}
}

type leaseDone struct {
	claim *leaseClaim
	reply chan error
}

// maxBatch is the most completions written in one statement.
const maxBatch = 500

// completer deletes completed rows in batches: whatever has queued while the
// previous batch was written goes in the next statement.
func (f *lease) completer() {
	defer f.wg.Done()
	for {
		var batch []*leaseDone
		select {
		case <-f.done:
			// Finish what is queued, then stop.
			for {
				select {
				case r := <-f.complete:
					f.flush([]*leaseDone{r})
				default:
					return
				}
			}
		case r := <-f.complete:
			batch = append(batch, r)
		}
	drain:
		for len(batch) < maxBatch {
			select {
			case r := <-f.complete:
				batch = append(batch, r)
			default:
				break drain
			}
		}
		f.flush(batch)
	}
}

func (f *lease) flush(batch []*leaseDone) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	errs := f.deleteBatch(ctx, batch)
	for i, r := range batch {
		r.reply <- errs[i]
	}
}

// deleteBatch deletes each row of batch that still holds its token and
// returns, per row, nil or ErrLeaseLost (or the statement's error).
func (f *lease) deleteBatch(ctx context.Context, batch []*leaseDone) []error {
	p := f.plan
	errs := make([]error, len(batch))
	if len(batch) == 1 || !p.Dialect.Features().DeleteReturning {
		tx, err := f.db.BeginTxx(ctx, nil)
		if err != nil {
			for i := range errs {
				errs[i] = fmt.Errorf("sqlxbroker: lease completion: %w", err)
			}
			return errs
		}
		q := p.Rebind("DELETE FROM " + p.QTable + " WHERE " + p.QID + " = ? AND " + p.QLockedUntil + " = ?")
		for i, r := range batch {
			res, err := tx.ExecContext(ctx, q, r.claim.d.ID(), p.Time(r.claim.finish()))
			if err != nil {
				errs[i] = fmt.Errorf("sqlxbroker: lease completion: %w", err)
				continue
			}
			errs[i] = fenced(res.RowsAffected())
		}
		if err := tx.Commit(); err != nil {
			for i := range errs {
				errs[i] = fmt.Errorf("sqlxbroker: lease completion commit: %w", err)
			}
		}
		return errs
	}
	var b strings.Builder
	args := make([]any, 0, 2*len(batch))
	b.WriteString("DELETE FROM " + p.QTable + " WHERE ")
	for i, r := range batch {
		if i > 0 {
			b.WriteString(" OR ")
		}
		b.WriteString("(" + p.QID + " = ? AND " + p.QLockedUntil + " = ?)")
		args = append(args, r.claim.d.ID(), p.Time(r.claim.finish()))
	}
	b.WriteString(" RETURNING " + p.QID)
	rows, err := f.db.QueryxContext(ctx, p.Rebind(b.String()), args...)
	if err == nil {
		var got []row
		got, err = readRows(rows)
		if err == nil {
			deleted := make(map[string]bool, len(got))
			for _, g := range got {
				deleted[idKey(g.vals[0])] = true
			}
			for i, r := range batch {
				if !deleted[idKey(r.claim.d.ID())] {
					errs[i] = core.ErrLeaseLost
				}
			}
			return errs
		}
	}
	for i := range errs {
		errs[i] = fmt.Errorf("sqlxbroker: lease completion: %w", err)
	}
	return errs
}
