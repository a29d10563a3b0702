package forms

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/hashicorp/go-multierror"

	"github.com/jmoiron/sqlx"
	"github.com/sqlxbroker/sqlxbroker/core"
)

// rowLock: BEGIN; SELECT .. FOR UPDATE SKIP LOCKED; the handler runs with the
// transaction open; the completion statement, then COMMIT. One transaction,
// and so one connection, per delivery in work.
type rowLock struct {
	base
	life   context.Context
	cancel context.CancelFunc
}

func newRowLock(b base) *rowLock {
	f := &rowLock{base: b}
	f.life, f.cancel = newLife()
	return f
}

func (f *rowLock) Form() core.Form                 { return core.RowLock }
func (f *rowLock) Start(ctx context.Context) error { return f.start(ctx, core.RowLock) }

// Close rolls back every claim transaction still open: those rows are
// claimable again at once, their attempts uncounted.
func (f *rowLock) Close() error { f.cancel(); return nil }

const savepoint = "sqlxbroker_handler"

// claimers is the most row-lock claims made at once, each in its own
// transaction on its own connection: a claim is a few round trips, so
// claiming one row after another would bound a subscription's rate by
// their latency rather than by the database.
const claimers = 8

// Claim claims up to max rows, one transaction each. It starts with one
// claimer and adds another with each row found, up to claimers at once, so
// an empty or nearly empty table costs one connection, not claimers. It
// stops once a claim finds nothing.
func (f *rowLock) Claim(ctx context.Context, max int) ([]core.Claim, error) {
	var (
		mu      sync.Mutex
		out     []core.Claim
		errs    error
		left    = max   // claims not yet started
		running = 0     // claimers at work
		dry     = false // a claim found nothing
		wg      sync.WaitGroup
	)
	var claimer func()
	// next reports whether the calling claimer should claim once more.
	next := func() bool {
		mu.Lock()
		defer mu.Unlock()
		if dry || errs != nil || left == 0 {
			running--
			return false
		}
		left--
		return true
	}
	claimer = func() {
		defer wg.Done()
		for next() {
			c, err := f.claimOne(ctx)
			mu.Lock()
			switch {
			case err != nil:
				errs = multierror.Append(errs, err)
			case c == nil:
				dry = true
			default:
				out = append(out, c)
				// A row found: another claimer may find the next.
				if running < claimers && left > running {
					running++
					wg.Add(1)
					go claimer()
				}
			}
			mu.Unlock()
		}
	}
	running = 1
	wg.Add(1)
	claimer()
	wg.Wait()
	return out, errs
}

func (f *rowLock) claimOne(ctx context.Context) (core.Claim, error) {
	if err := ctx.Err(); err != nil {
		return nil, nil
	}
	p := f.plan
	txCtx, txCancel := context.WithCancel(f.life)
	tx, err := f.begin(txCtx)
	if err != nil {
		txCancel()
		return nil, fmt.Errorf("sqlxbroker: begin claim: %w", err)
	}
	fail := func(err error) (core.Claim, error) {
		_ = tx.Rollback()
		txCancel()
		return nil, err
	}
	where, args := p.Ready(p.Alias, core.Now())
	lockSQL := "SELECT * FROM " + p.QTable + " " + p.Alias + " WHERE " + where
	var rows []row
	if p.QGroup != "" && p.Caps.GroupGuard != nil {
		rows, err = f.claimHead(ctx, tx, where, args)
	} else {
		var r *sqlx.Rows
		r, err = tx.QueryxContext(ctx, p.Rebind(lockSQL+" ORDER BY "+p.OrderBy(p.Alias)+" LIMIT 1 "+p.Caps.RowLocker.SkipLocked()), args...)
		if err == nil {
			rows, err = readRows(r)
		}
	}
	if err != nil {
		return fail(fmt.Errorf("sqlxbroker: row-lock claim on %s: %w", p.Table.Name, err))
	}
	if len(rows) == 0 {
		return fail(nil)
	}
	r := &rows[0]
	attempt, err := f.attemptOf(r)
	if err != nil {
		return fail(err)
	}
	d := f.delivery(r, attempt, "")
	d.WithTx(tx, func(tx *sqlx.Tx) error {
		_, err := tx.ExecContext(txCtx, "SAVEPOINT "+savepoint)
		return err
	})
	return &rowLockClaim{f: f, tx: tx, ctx: txCtx, cancel: txCancel, d: d}, nil
}

// claimHead claims the head of one FIFO group under the dialect's group
// guard: candidate heads are read without locks, the group is guarded, and
// the head is then locked and checked again.
func (f *rowLock) claimHead(ctx context.Context, tx *sqlx.Tx, where string, args []any) ([]row, error) {
	p := f.plan
	r, err := tx.QueryxContext(ctx, p.Rebind("SELECT "+p.Alias+"."+p.QID+", "+p.Alias+"."+p.QGroup+" FROM "+p.QTable+" "+p.Alias+
		" WHERE "+where+" ORDER BY "+p.OrderBy(p.Alias)+" LIMIT 16"), args...)
	if err != nil {
		return nil, err
	}
	cands, err := readRows(r)
	if err != nil {
		return nil, err
	}
	lockSQL := p.Rebind("SELECT * FROM " + p.QTable + " " + p.Alias + " WHERE " + where + " AND " + p.Alias + "." + p.QID + " = ? " + p.Caps.RowLocker.SkipLocked())
	// Guard one group at a time and stop at the first head locked: the
	// guard lasts as long as the delivery's transaction, so guarding more
	// groups than the one delivered would hold them all up.
	for _, c := range cands {
		if g := c.vals[1]; g != nil {
			ok, err := p.Caps.GroupGuard.GuardGroup(ctx, tx, &core.GroupGuardParams{Plan: p, Group: g})
			if err != nil {
				return nil, fmt.Errorf("guard FIFO group %v: %w", g, err)
			}
			if !ok {
				continue
			}
		}
		r, err := tx.QueryxContext(ctx, lockSQL, append(args, c.vals[0])...)
		if err != nil {
			return nil, err
		}
		rows, err := readRows(r)
		if err != nil || len(rows) > 0 {
			return rows, err
		}
	}
	return nil, nil
}

type rowLockClaim struct {
	f      *rowLock
	tx     *sqlx.Tx
	ctx    context.Context
	cancel context.CancelFunc
	d      *core.Delivery
}

func (c *rowLockClaim) Delivery() *core.Delivery { return c.d }
func (c *rowLockClaim) Lost() <-chan struct{}    { return nil }

// Complete runs the completion statement in the delivery's transaction and
// commits. A failed handler's writes through Delivery.Tx are rolled back to
// the savepoint first. Any error rolls everything back: the row is
// claimable again with its attempt unchanged.
func (c *rowLockClaim) Complete(ctx context.Context, o core.Outcome) error {
	defer c.cancel()
	if o.Kind == core.Released {
		return c.tx.Rollback()
	}
	if o.Kind != core.Succeeded && c.d.TxUsed() {
		if _, err := c.tx.ExecContext(ctx, "ROLLBACK TO SAVEPOINT "+savepoint); err != nil {
			return errors.Join(fmt.Errorf("sqlxbroker: roll back handler writes: %w", err), c.tx.Rollback())
		}
	}
	q, args := c.f.completion(o, true, false, "")
	if _, err := c.tx.ExecContext(ctx, q, append(args, c.d.ID())...); err != nil {
		return errors.Join(fmt.Errorf("sqlxbroker: row-lock completion (%s): %w", o.Kind, err), c.tx.Rollback())
	}
	if err := c.tx.Commit(); err != nil {
		return fmt.Errorf("sqlxbroker: row-lock commit (%s): %w", o.Kind, err)
	}
	return nil
}
