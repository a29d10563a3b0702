package core

import (
	"context"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jmoiron/sqlx"
)

// OutcomeKind says what a completion does to a row: Succeeded deletes it
// (or sets DoneAt), Retry returns it for another attempt (ReadyAt set to
// RetryAt), Dead keeps it with DeadAt set, Released gives it back untouched
// apart from what the form already counted, Snoozed returns it at RetryAt
// with the attempt uncounted.
//
// The attempt column holds what the next delivery reports. Retry and Dead
// leave it one above the delivery's attempt: the row-lock form adds the
// count in their statement, the lease and advisory forms counted it at
// claim. Snoozed leaves it at the delivery's attempt: the row-lock form
// adds nothing, the lease and advisory forms take back the count of their
// claim (never below 1). Released: the row-lock form rolls back (nothing
// counted), the others keep their claim's count.
//
// Retry, Dead and Snoozed write LastError where the table has the column:
// Retry and Dead the error's text (cut to LastErrorLimit bytes), Snoozed
// leaves it as it was.
type OutcomeKind int

// The outcomes.
const (
	Succeeded OutcomeKind = iota + 1
	Retry
	Dead
	Released
	Snoozed
)

// LastErrorLimit is the most bytes of an error's text written to the last
// error column; a longer text is cut at a character boundary and ends in
// "...".
const LastErrorLimit = 2000

// ErrorText is err's text as the last error column stores it: at most
// LastErrorLimit bytes of valid UTF-8.
func ErrorText(err error) string {
	if err == nil {
		return ""
	}
	s := strings.ReplaceAll(strings.ToValidUTF8(err.Error(), "\uFFFD"), "\x00", "")
	if len(s) <= LastErrorLimit {
		return s
	}
	cut := LastErrorLimit - len("...")
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "..."
}

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
	case Snoozed:
		return "snoozed"
	}
	return "unknown"
}

// Outcome is what the engine asks a form to record: Kind, RetryAt (Retry
// and Snoozed; zero: at once) and the handler's error.
type Outcome struct {
	Kind    OutcomeKind
	RetryAt time.Time
	Err     error
}

// Row is a claimed row, from which the engine builds the delivery: every
// column as the driver returned it, the attempt column holding Attempt.
type Row struct {
	ID      any
	Attempt int    // as it stood before the claim: 1 for a new row
	Key     string // the advisory key held; "" in other forms
	Columns []string
	Values  []any
}

// Claim is one row held by a claim form for its handler.
type Claim interface {
	Row() *Row
	// Tx returns the row-lock transaction for the handler's writes (they
	// commit with the outcome, roll back with a failure; the first call
	// may take a savepoint); ErrNoTx in other forms; sql.ErrTxDone once
	// completion started.
	Tx() (*sqlx.Tx, error)
	// OnLost has f called once, without blocking, when the hold is lost
	// before completion (a lease not renewed in time, an ended advisory
	// key session), at once when it already is.
	OnLost(f func())
	// Complete records o and lets the row go; it is called once. done is
	// called exactly once, within a bounded time, before Complete returns
	// or from the form's goroutine (batched completions): nil, ErrLeaseLost
	// (nothing changed), or the statement's error.
	Complete(ctx context.Context, o Outcome, done func(error))
}

// Traits say how the engine asks a form for claims. Batches: a claim is one
// statement however many rows it takes, so while work is in flight the
// engine waits for half a batch of free handlers (else it claims as soon as
// one is free). ClaimsAtOnce: how many claims of a batching form may run at
// once, each for handlers of its own (1 or less: one at a time).
// ClaimsAtOnceBelow, when above 0, runs more than one claim at once only for
// subscriptions whose batches (SubscribeParams.BatchSize) are smaller: a
// small claim costs its round trips, so a second one overlaps them, where a
// large one costs its rows, and claims at once step over each other's.
// HalfBatches: the database runs the form's claims and completions on one
// table side by side (concurrent writers that skip each other's rows), so
// a claim of a large batch takes at most the half the engine waits for,
// not every free handler's row: claims and completions stay small enough
// to overlap. A database that writes one transaction at a time gains
// nothing from that and pays a commit per claim: leave it false there.
type Traits struct {
	Batches           bool
	ClaimsAtOnce      int
	ClaimsAtOnceBelow int
	HalfBatches       bool
}

// Rescanner is an optional capability of a ClaimForm whose claims start
// past the rows it claimed last (a claim cursor) in a claim order where a
// row published now may sort before that cursor: an order other than the
// ID alone (a priority first, say), so the cursor would leave it until the
// form's next periodic scan from the first row.
//
// The engine calls Rescan on each wake-up (a publish to the table seen in
// the process or through the dialect's Waker), whether it is busy or idle;
// the form's claims then read from the first row of the claim order until
// one has taken every row published before the cursor (a wake-up may stand
// for several publishes), and leave the cursor where it was. A wake-up
// that comes while such a claim runs is not spent by it: its row may have
// been committed after that claim's snapshot. Rescan must be cheap and
// must not block. A form whose cursor cannot miss a new row (ID order)
// does not implement it, and its wake-ups cost nothing more. RescannerOf
// finds it.
type Rescanner interface {
	Rescan()
}

// RescannerOf returns f's Rescanner, looking through wrappers that have
// an Unwrap() ClaimForm method; nil when it has none.
func RescannerOf(f ClaimForm) Rescanner { return capabilityOf[Rescanner](f) }

// capabilityOf returns f's capability T, looking through wrappers that
// have an Unwrap() ClaimForm method; the zero T when it has none.
func capabilityOf[T any](f ClaimForm) T {
	for f != nil {
		if c, ok := f.(T); ok {
			return c
		}
		u, ok := f.(interface{ Unwrap() ClaimForm })
		if !ok {
			break
		}
		f = u.Unwrap()
	}
	var none T
	return none
}

// ClaimStreamer is an optional capability of a ClaimForm that claims
// row by row (Traits.Batches false), each row in a step of its own (the
// row-lock form: a transaction, and so a connection, per row): it hands
// each row on as soon as it is claimed, so the row's handler starts while
// the claim goes on for the rest, rather than when the last of them is
// claimed (a claim of several rows that each open a new connection takes
// as long as the slowest of them, and more).
//
// ClaimEach claims as Claim does, up to max rows (max >= 1), and calls
// found once with each row claimed, before ClaimEach returns; found may be
// called from several goroutines at once and must not block. It returns
// how many rows it handed to found and its error: rows are handed on
// whether or not an error follows, and none and nil mean nothing was
// ready. Every row Claim could return is handed to found instead; none is
// returned. The engine uses ClaimEach for the claims its loop makes and
// Claim where it wants one row back (a worker's next row). ClaimStreamerOf
// finds it.
type ClaimStreamer interface {
	ClaimEach(ctx context.Context, max int, found func(Claim)) (int, error)
}

// ClaimStreamerOf returns f's ClaimStreamer, looking through wrappers that
// have an Unwrap() ClaimForm method (a wrapper that changes what Claim
// does must implement ClaimEach itself, or have no Unwrap); nil when it
// has none.
func ClaimStreamerOf(f ClaimForm) ClaimStreamer { return capabilityOf[ClaimStreamer](f) }

// ClaimForm is a claim form bound to one table and one database.
type ClaimForm interface {
	Traits() Traits
	// Start is called once, after the broker's checks, before Claim.
	Start(ctx context.Context) error
	// Claim claims up to max ready rows (max >= 1); none and nil: nothing
	// is ready. Claims made are returned with a later error. It is called
	// from several goroutines at once; no row may be claimed twice.
	Claim(ctx context.Context, max int) ([]Claim, error)
	// Close stops background work (renewal); claims not completed stay as
	// they are: leases run out, locks and keys stay until completed.
	Close() error
}
