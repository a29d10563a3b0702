package core

import (
	"context"
	"time"

	"github.com/jmoiron/sqlx"
)

// OutcomeKind says what a completion does to a row.
type OutcomeKind int

const (
	// Succeeded: the row is deleted, or marked done when the table has a
	// DoneAt column.
	Succeeded OutcomeKind = iota + 1
	// Retry: the row is returned for another attempt, at RetryAt when the
	// table has a ReadyAt column.
	Retry
	// Dead: the row is kept with its DeadAt column set.
	Dead
	// Released: the row is given back untouched apart from what the form
	// already counted (a stopping subscription returns work it cannot
	// finish this way).
	Released
)

func (k OutcomeKind) String() string {
	switch k {
	case Succeeded:
		return "succeeded"
	case Retry:
		return "retry"
	case Dead:
		return "dead"
	case Released:
		return "released"
	}
	return "unknown"
}

// Outcome is what the engine asks a claim form to record for a delivery.
type Outcome struct {
	Kind    OutcomeKind
	RetryAt time.Time // Retry only; zero: at once
	Err     error     // the handler's error, for Retry and Dead
}

// Row is a claimed row as a form hands it to the engine, which builds the
// handler's delivery from it.
type Row struct {
	ID      any    // the primary key as the driver returned it
	Attempt int    // the attempt as it stood before the claim: 1 for a new row
	Key     string // the advisory key held for it; "" in other forms
	// Columns and Values are every column of the row, as the driver
	// returned them; the attempt column holds Attempt.
	Columns []string
	Values  []any
}

// Claim is one row held by a claim form for its handler.
type Claim interface {
	// Row is the claimed row.
	Row() *Row
	// Tx returns the transaction that holds the row (the row-lock form),
	// for the handler's own writes: writes through it commit with the
	// outcome and are rolled back with a failure. The first call may run
	// a statement (a savepoint). Forms that hold no transaction return
	// ErrNoTx; once the completion has started, sql.ErrTxDone.
	Tx() (*sqlx.Tx, error)
	// OnLost arranges for f to be called once when the form's hold on the
	// row is gone before completion (a lease that could not be renewed in
	// time, an advisory key session that ended), at once when it already
	// is, from whatever goroutine notices; f must not block. A form that
	// cannot lose a row while it is held never calls f.
	OnLost(f func())
	// Complete records o and lets the row go. It is called once. done is
	// called exactly once with the result, from this goroutine before
	// Complete returns or from the form's own (a form that writes
	// completions in batches), within a bounded time: nil when recorded,
	// ErrLeaseLost (and nothing changed) when the hold was lost, or the
	// statement's error.
	Complete(ctx context.Context, o Outcome, done func(error))
}

// Traits say how the engine should ask a form for claims.
type Traits struct {
	// Batches: one claim is one statement however many rows it takes (the
	// lease form): while work is in flight the engine waits for half a
	// batch of free handlers before it claims. False: the engine claims as
	// soon as a handler is free, as suits a form that claims row by row.
	Batches bool
	// ClaimsAtOnce is how many claims a batching form may run at once,
	// each for handlers the others do not claim for, so one claim's round
	// trips overlap another's (the advisory form: candidate rows, their
	// keys, the take); 1 or less is one at a time. Each may use a
	// connection of its own.
	ClaimsAtOnce int
}

// ClaimForm is a claim form bound to one table and one database.
type ClaimForm interface {
	// Traits say how the engine asks for claims.
	Traits() Traits
	// Start takes what the form needs for its life (AdvisoryLocker's
	// in-process keys, the row-lock statements of the server); it is
	// called once, after the broker checked the server and the table, and
	// before Claim.
	Start(ctx context.Context) error
	// Claim claims up to max ready rows (max >= 1). Zero claims and a nil
	// error mean nothing is ready. Claims already made are returned even
	// when a later one fails. Claim is called from several goroutines at
	// once (a form that does not batch its claims is asked by each worker
	// for its next row), and no row may be claimed twice.
	Claim(ctx context.Context, max int) ([]Claim, error)
	// Close stops the form's background work (lease renewal) and releases
	// what Start took. Claims not completed stay as the form left them:
	// leases run out, row locks and advisory keys stay with their
	// transactions and connections until completed.
	Close() error
}
