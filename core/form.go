package core

import (
	"context"
	"time"
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

// Claim is one row held by a claim form for its handler.
type Claim interface {
	// Delivery is what the handler receives.
	Delivery() *Delivery
	// Lost is closed when the form's hold on the row is gone before
	// completion (a lease that could not be renewed in time, an advisory
	// key session that ended). Nil when the form cannot lose a row while
	// it is held.
	Lost() <-chan struct{}
	// Complete records o and lets the row go. It is called once. It
	// returns ErrLeaseLost (and changes nothing) when the hold was lost.
	Complete(ctx context.Context, o Outcome) error
}

// LostNotifier is an optional interface of a Claim whose hold can be lost.
// OnLost arranges for f to be called once when Lost is closed (at once when
// it already is), from whatever goroutine closes it; f must not block. The
// engine cancels the handler's context through it; without it the engine
// watches Lost with a goroutine per delivery.
type LostNotifier interface {
	OnLost(f func())
}

// AsyncCompleter is an optional interface of a Claim whose completions are
// queued and written together (the lease and advisory forms).
// CompleteAsync records o as Complete does, but returns at once and calls
// done with what Complete would have returned once the outcome is written
// (or failed), from another goroutine; done is called exactly once, and
// the form must bound how long that takes. The engine then frees the handler at once, so claims
// go on while completions wait for their batch; it keeps at most
// Concurrency completions waiting this way, and Stop waits for them.
type AsyncCompleter interface {
	CompleteAsync(ctx context.Context, o Outcome, done func(error))
}

// Batching is an optional interface of a ClaimForm. A form whose claim is
// one statement however many rows it takes (the lease form) reports true:
// while work is in flight the engine then waits for half a batch of free
// handlers before it claims. Without it (or with false) the engine claims
// as soon as a handler is free, as suits a form that claims row by row.
type Batching interface {
	BatchesClaims() bool
}

// Pipelining is an optional interface of a batching ClaimForm whose claim
// is several round trips one after another (the advisory form: candidate
// rows, their keys, the take). ClaimsAtOnce is how many claims the engine
// may run at once, each for handlers the others do not claim for, so one
// claim's round trips overlap another's; 1 (or less) is one at a time.
// Each claim running may use a connection of its own.
type Pipelining interface {
	ClaimsAtOnce() int
}

// ClaimForm is a claim form bound to one table and one database.
type ClaimForm interface {
	// Form says which form this is.
	Form() Form
	// Plan is the table the form claims from.
	Plan() *Plan
	// Start checks the server (ServerChecker) and takes what the form needs
	// for its life (AdvisoryAttacher); it is called once, before Claim.
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
