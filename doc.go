// Package sqlxbroker turns ordinary SQL tables into a message broker: rows
// are messages, a subscription claims ready rows and runs a handler for each,
// and a completion statement records the outcome.
//
// It runs on any database/sql driver through dialects (PostgreSQL,
// MySQL/MariaDB and SQLite are built in; blank-import the one you use) and
// offers three claim forms, chosen by the table description:
//
//   - row lock (no form named): SELECT .. FOR UPDATE SKIP LOCKED in a
//     transaction held open while the handler runs; the handler may write
//     through Delivery.Tx and its writes commit with the outcome;
//   - lease (Table.LockedUntil): a deadline written into the row; no
//     connection is held while the handler runs; completion is fenced by the
//     deadline and returns ErrLeaseLost when another claim took the row;
//   - advisory lock (Table.AdvisoryLock = "accounts-{account}"): rows with
//     equal keys run one at a time.
//
// A table with a Group column is FIFO: each group is delivered in order,
// one row at a time, across brokers.
//
// Claims take rows in Table.Order: the ID by default, or columns each with
// its direction, such as "priority DESC, id" (the ID is appended when an
// order of several keys does not end with it, so no two rows tie). The
// order holds across brokers and within FIFO groups.
//
// # Publishing
//
// Publish inserts messages (structs with `db` tags, or maps) in the
// caller's transaction or on the pool. In a table with a ReadyAt column a
// row that gives no ReadyAt gets the publish time, so Counts.OldestReady
// says how long the oldest ready row has waited. PublishWith takes
// PublishParams and reports how many rows it inserted:
//
//   - Delay or ReadyAt (one of them): the rows become ready then, written
//     to the ReadyAt column in the dialect's encoding and compared with
//     the host clock as every claim is; they win over a ReadyAt value the
//     message carries. Both need Table.ReadyAt (else a *TableError).
//   - SkipDuplicates: a column with a unique index; a row whose value is
//     in the table already, or earlier in the call, is skipped, not an
//     error, and not counted. PostgreSQL and SQLite write INSERT ..
//     ON CONFLICT (col) DO NOTHING, MySQL and MariaDB INSERT ..
//     ON DUPLICATE KEY UPDATE col = col (any unique key counts there; a
//     DSN with clientFoundRows=true is refused, as it would count skipped
//     rows). A dialect without core.DuplicateSkipper refuses it with
//     ErrUnsupported.
//
// # Outcomes
//
// A handler that returns nil completes its row: deleted, or marked done
// when the table has a DoneAt column. Any error, and a panic, returns the
// row for another attempt after SubscribeParams.RetryDelay (which sees the
// attempt and the error), and moves it to the dead state after the table's
// last attempt (MaxAttempts), kept with DeadAt set. Three errors, returned
// as they are or wrapped, say otherwise:
//
//   - Permanent(err): the row is bad for good; it goes dead at once, kept
//     with its attempt and err.
//   - RetryAfter(d, err): a failure retried no earlier than d from now; it
//     counts an attempt, so MaxAttempts still ends it.
//   - Snooze(d): not a failure; the row comes back d from now and the
//     delivery uses no attempt, so a row snoozed any number of times still
//     gets its MaxAttempts.
//
// Permanent needs a DeadAt column, RetryAfter and Snooze a ReadyAt column;
// without it the delivery counts as a plain failure and its log line says
// which column is missing. In the row-lock form every non-nil return rolls
// back the handler's writes through Delivery.Tx. A table with a LastError
// column keeps the text of the last failure (retry or dead) there.
//
// Failed deliveries are logged through SubscribeParams.Logger at
// FailureLevel (warn by default), a panic's line with its stack, at most
// FailureLogLimit lines a second: beyond it one line a second sums up the
// failures not logged.
//
// For metrics and traces: SubscribeParams.OnClaim reports each claim's
// time and rows, OnOutcome each completion; a table's Metadata column
// carries a text from each publisher (Broker.SetMetadataFunc) to the
// handlers (Delivery.Metadata). Package otelbroker builds OpenTelemetry
// metrics and traces on them; this package imports none of it.
package sqlxbroker

import (
	"fmt"
	"slices"
	"strings"

	"github.com/sqlxbroker/sqlxbroker/core"
)

// Form names a claim form: what holds a row while its handler runs, and so
// what returns the row when a process crashes. Table.Form says which form a
// description selects; String names it ("row-lock", "lease", "advisory").
type Form = core.Form

// The claim forms.
const (
	// RowLock: SELECT .. FOR UPDATE SKIP LOCKED in a transaction that stays
	// open while the handler runs; the outcome commits with the handler's
	// writes through Delivery.Tx. A crash rolls back: the row is claimable
	// at once, its attempt uncounted. The form of a table that names no
	// other.
	RowLock = core.RowLock
	// Lease: a deadline written into the row's lease column and committed
	// at once; completion takes effect only while the row still holds it
	// (else ErrLeaseLost). A crash leaves the row until its lease runs out.
	Lease = core.Lease
	// Advisory: a database advisory lock on a key built from the row; rows
	// with equal keys run one at a time. A crash ends the session and the
	// database drops its keys: the row is claimable at once.
	Advisory = core.Advisory
)

// ParseForms reads a comma-separated list of form names as Form.String
// gives them ("row-lock,lease"); spaces around a name are ignored and ""
// is the empty list. An unknown name is an error that names it and lists
// the known ones.
func ParseForms(s string) ([]Form, error) {
	var out []Form
	for _, name := range strings.Split(s, ",") {
		name = strings.TrimSpace(name)
		if name == "" {
			continue
		}
		i := slices.IndexFunc(core.Forms, func(f Form) bool { return f.String() == name })
		if i < 0 {
			return nil, fmt.Errorf("sqlxbroker: unknown form %q (row-lock, lease or advisory)", name)
		}
		out = append(out, core.Forms[i])
	}
	return out, nil
}

// OutcomeKind says what a completion did to a row; Outcome carries it to
// SubscribeParams.OnOutcome. String names it.
type OutcomeKind = core.OutcomeKind

// The outcomes of a delivery.
const (
	// Succeeded: the handler returned nil; the row is deleted, or marked
	// done when the table has a DoneAt column.
	Succeeded = core.Succeeded
	// Retry: the handler failed (or panicked); the row is returned for
	// another attempt, at Outcome.RetryAt when the table has a ReadyAt
	// column.
	Retry = core.Retry
	// Dead: the handler failed its last attempt (Table.MaxAttempts); the
	// row is kept with its DeadAt column set.
	Dead = core.Dead
	// Released: the subscription stopped without time to finish; the row is
	// given back untouched apart from what the form already counted.
	Released = core.Released
	// Snoozed: the handler returned Snooze; the row comes back at
	// Outcome.RetryAt with no attempt used: the next delivery reports the
	// attempt this one did (the lease and advisory forms take back the
	// count of their claim, the row-lock form adds none).
	Snoozed = core.Snoozed
)

// LastErrorLimit is the most bytes of an error's text the LastError column
// receives; a longer text is cut at a character boundary and ends in "...".
const LastErrorLimit = core.LastErrorLimit

// Outcome is what a completion recorded for a delivery, as
// SubscribeParams.OnOutcome sees it: Kind, RetryAt (Retry and Snoozed; zero
// means at once) and Err (the handler's error, for Retry, Dead, Released
// and Snoozed).
type Outcome = core.Outcome
