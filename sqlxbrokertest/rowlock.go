package sqlxbrokertest

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"time"

	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/core"
)

// MaxPassed is the most ready rows NewRowLockDelivery claims on the way to
// the row it was asked for: each holds a transaction, and so a connection,
// until the row is found.
const MaxPassed = 16

// claimTimeout bounds the claims and the completion of a RowLockDelivery.
const claimTimeout = 30 * time.Second

// RowLockDelivery is one row of a row-lock table claimed for real by the
// broker's row-lock form: its Delivery is what a subscription hands a
// handler, and Delivery.Tx is the open claim transaction (SELECT .. FOR
// UPDATE), so a handler's writes through it commit with the row's outcome
// or roll back with it. Until it is completed the row stays locked and no
// subscription claims it.
//
// Complete it once, with Succeed, Fail, Release, Complete or Run; a
// delivery not completed when the test ends is released (rolled back) by
// the test's cleanup. A RowLockDelivery is not safe for concurrent use.
type RowLockDelivery struct {
	*sqlxbroker.Delivery
	t     TB
	claim core.Claim
	form  core.ClaimForm

	mu   sync.Mutex
	done bool
}

// NewRowLockDelivery claims the row of table whose ID is id through b's
// row-lock form, as a subscription would: in a claim transaction, locked
// FOR UPDATE SKIP LOCKED, its attempt read from the row. Ready rows that
// come before it in the claim order are claimed on the way and released at
// once it is found (rolled back, their attempts unchanged). It fails the
// test (Fatalf) when table is not a row-lock table or the dialect has no
// row-lock form (SQLite), when the row is not claimable (missing, not yet
// ready, dead, done, or locked by another transaction), or when more than
// MaxPassed ready rows come before it.
func NewRowLockDelivery(t TB, b *sqlxbroker.Broker, table sqlxbroker.Table, id any) *RowLockDelivery {
	t.Helper()
	d, err := newRowLockDelivery(t, b, table, id)
	if err != nil {
		t.Fatalf("sqlxbrokertest: NewRowLockDelivery: %v", err)
	}
	return d
}

func newRowLockDelivery(t TB, b *sqlxbroker.Broker, table sqlxbroker.Table, id any) (*RowLockDelivery, error) {
	if b == nil {
		return nil, errors.New("nil broker")
	}
	if f := table.Form(); f != sqlxbroker.RowLock {
		return nil, fmt.Errorf("table %s is a %s table; a row-lock table names neither LockedUntil nor AdvisoryLock", table.Name, f)
	}
	want, err := driverValue(id)
	if err != nil || want == nil {
		return nil, fmt.Errorf("id %v (%T) is not a row ID", id, id)
	}
	form, err := b.Form(table)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), claimTimeout)
	defer cancel()
	if err := form.Start(ctx); err != nil {
		form.Close()
		return nil, err
	}
	var passed []core.Claim
	release := func() {
		for _, c := range passed {
			c.Complete(ctx, core.Outcome{Kind: core.Released}, func(error) {})
		}
	}
	for {
		cs, err := form.Claim(ctx, 1)
		if err == nil && len(cs) == 0 {
			err = fmt.Errorf("row %s of %s is not claimable: not in the table, not ready yet (ReadyAt), dead, done, or locked by another transaction (%d other ready rows claimed and released)",
				show(want), table.Name, len(passed))
		}
		if err != nil {
			passed = append(passed, cs...) // claims made before an error
			release()
			form.Close()
			return nil, err
		}
		c := cs[0]
		passed = append(passed, cs[1:]...) // at most one was asked for
		if sameValue(want, c.Row().ID) {
			release()
			d := &RowLockDelivery{Delivery: sqlxbroker.NewDelivery(c), t: t, claim: c, form: form}
			t.Cleanup(func() {
				d.mu.Lock()
				open := !d.done
				d.done = true
				d.mu.Unlock()
				if open {
					d.complete(core.Outcome{Kind: core.Released})
				}
				form.Close()
			})
			return d, nil
		}
		passed = append(passed, c)
		if len(passed) > MaxPassed {
			release()
			form.Close()
			return nil, fmt.Errorf("more than %d ready rows of %s come before row %s in the claim order (MaxPassed)", MaxPassed, table.Name, show(want))
		}
	}
}

// Complete records o as a subscription does after the handler returned:
// the completion statement in the claim transaction, then the commit. A
// Succeeded outcome commits the handler's writes through Tx; Retry, Dead
// and Snoozed roll them back and record the row's new state; Released rolls
// everything back. It returns the completion's error, and an error when
// the delivery was completed before.
func (d *RowLockDelivery) Complete(o sqlxbroker.Outcome) error {
	d.mu.Lock()
	if d.done {
		d.mu.Unlock()
		return fmt.Errorf("sqlxbrokertest: delivery %s was completed before", show(d.ID()))
	}
	d.done = true
	d.mu.Unlock()
	return d.complete(o)
}

func (d *RowLockDelivery) complete(o sqlxbroker.Outcome) error {
	ctx, cancel := context.WithTimeout(context.Background(), claimTimeout)
	defer cancel()
	errc := make(chan error, 1)
	d.claim.Complete(ctx, o, func(err error) { errc <- err })
	return <-errc
}

// Succeed completes the delivery as a handler's nil does: the handler's
// writes through Tx commit, and the row is deleted (or marked DoneAt). An
// error fails the test.
func (d *RowLockDelivery) Succeed() {
	d.t.Helper()
	if err := d.Complete(sqlxbroker.Outcome{Kind: sqlxbroker.Succeeded}); err != nil {
		d.t.Fatalf("sqlxbrokertest: Succeed: %v", err)
	}
}

// Fail completes the delivery as a failed attempt: the handler's writes
// through Tx roll back, and the row is returned for another attempt, ready
// at once, with its attempt counted and LastError written where the table
// has the column. (A subscription decides more: dead after MaxAttempts or
// for Permanent, a retry delay; use Complete for those outcomes, or Drain.)
// An error fails the test.
func (d *RowLockDelivery) Fail(err error) {
	d.t.Helper()
	if err == nil {
		err = errors.New("failed")
	}
	if cerr := d.Complete(sqlxbroker.Outcome{Kind: sqlxbroker.Retry, Err: err}); cerr != nil {
		d.t.Fatalf("sqlxbrokertest: Fail: %v", cerr)
	}
}

// Release rolls the claim transaction back: the handler's writes and the
// claim are undone, and the row is claimable again with its attempt
// unchanged. An error fails the test.
func (d *RowLockDelivery) Release() {
	d.t.Helper()
	if err := d.Complete(sqlxbroker.Outcome{Kind: sqlxbroker.Released}); err != nil {
		d.t.Fatalf("sqlxbrokertest: Release: %v", err)
	}
}

// Run calls h with the delivery as a subscription does (a panic becomes a
// *sqlxbroker.PanicError), then completes it: Succeed when h returns nil,
// Fail otherwise. It returns h's error; a completion that fails fails the
// test.
func (d *RowLockDelivery) Run(ctx context.Context, h sqlxbroker.Handler) error {
	d.t.Helper()
	err := call(ctx, h, d.Delivery)
	if err == nil {
		d.Succeed()
	} else {
		d.Fail(err)
	}
	return err
}

// call runs h, turning a panic into an error.
func call(ctx context.Context, h sqlxbroker.Handler, d *sqlxbroker.Delivery) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = &sqlxbroker.PanicError{Value: r, Stack: debug.Stack()}
		}
	}()
	return h(ctx, d)
}
