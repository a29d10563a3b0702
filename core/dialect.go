package core

import (
	"context"
	"database/sql"
	"slices"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"
)

// Dialect speaks one database family's SQL: a small required part, and one
// optional interface per form or ability, found in one place
// (CapabilitiesOf), each saying what happens without it (a form without its
// capability fails at Subscribe with ErrFormUnavailable). Implement it and
// the capabilities your database has, Register it in init(), and pass the
// conformance suite (docs/implementing-a-dialect.md). A Dialect has no
// state and is called from many goroutines; what it keeps per pool lives in
// the *Pool its methods receive, which the broker owns and closes.
type Dialect interface {
	// Name is a human name for messages, e.g. "PostgreSQL".
	Name() string
	// QuoteIdent quotes one identifier that CheckIdent accepted, e.g.
	// `"jobs"` or "`jobs`". It must not fail.
	QuoteIdent(ident string) string
	// BindType is the driver's sqlx bind type; statements are written
	// with '?' and rebound.
	BindType() int
	// EncodeTime turns a host time (UTC, microseconds) into the argument
	// the timestamp columns store and compare exactly, on any session.
	EncodeTime(t time.Time) any
	Features() Features
}

// Features are facts about the dialect's SQL.
type Features struct {
	// UpdateReturning, DeleteReturning: UPDATE (DELETE) .. RETURNING works;
	// without, the forms update and read again under the same condition.
	UpdateReturning, DeleteReturning bool
	// LeaseClaimStatement: ClaimLeases is one statement that waits for no
	// lock, so outside FIFO claims it runs on the pool, without BEGIN and
	// COMMIT. False (SQLite's one writer): in a transaction.
	LeaseClaimStatement bool
	ClaimIsolation      sql.IsolationLevel // when the description names none; LevelDefault: the server's
	MaxParams           int                // the most arguments a statement carries; 0: 30,000
	// ListScanWaits: an UPDATE or DELETE of a list of ids (id IN (..))
	// may be planned as a scan of the table that waits for each row
	// another transaction holds, in the list or not (InnoDB, on a small
	// table). The operations then change the rows of a row-lock table,
	// whose rows in work stay locked while their handlers run, one
	// statement each; false (PostgreSQL, SQLite): a list per statement.
	ListScanWaits bool
}

// RowLocker is the capability of the RowLock form: the rows a SELECT locks
// stay locked until the transaction ends, and a concurrent locking SELECT
// skips them. RowLock is called once per subscription start.
type RowLocker interface {
	RowLock(ctx context.Context, pool *Pool) (*RowLockSQL, error)
}

// RowLockSQL is how a server takes row locks. SkipLocked is required; each
// other zero value is a plainer way that always works.
type RowLockSQL struct {
	SkipLocked string // appended to a SELECT: "FOR UPDATE SKIP LOCKED"
	// ChainCommit commits and opens the next transaction alike ("COMMIT
	// AND CHAIN"), saving a BEGIN per delivery; "": COMMIT, then BEGIN.
	ChainCommit string
	// Prepare: statements may be prepared once per connection; false where
	// they do not survive (a pooler in transaction mode).
	Prepare bool
	// ByID: a claim from the cursor locks its row by ID, the first it can
	// among a few candidates read without locks (a read of a page of
	// them serves many claims), not by a range from the cursor. For a
	// server whose optimizer estimates the rows of a range on every
	// statement by descending the index to both of its ends (MariaDB):
	// those descents latch the pages at the head of the queue, where
	// every claim transaction locks and deletes, while an equality on
	// the key is estimated without them. Full scans (periodic, or after
	// a wake-up) still read a range, as do the claims of a table ordered
	// by more than its ID and of a FIFO table.
	ByID bool
}

// LeaseClaimParams is the input of Leaser.ClaimLeases. Where is the
// claimable condition (lease check and FIFO head included) over the table
// aliased Plan.Alias, its '?'s bound by Args.
type LeaseClaimParams struct {
	Plan     *Plan
	Where    string
	Args     []any
	Limit    int // the most rows to claim, at least 1
	Deadline any // the new lease deadline, encoded (EncodeTime)
	// Cursor reports a claim that starts at the subscription's cursor
	// (Where then holds the condition that starts it there): a later
	// claim from the first row finds every row this one passes over, as
	// it finds the rows behind the cursor. Such a claim may pass over
	// rows it can tell another transaction has taken, or is taking,
	// since the statement's snapshot, instead of locking them.
	Cursor bool
}

// Leaser is the capability of the Lease form.
type Leaser interface {
	// ClaimLeases claims up to p.Limit rows matching p.Where on q (the
	// claim transaction, or the pool: LeaseClaimStatement), in the
	// plan's order, skipping rows other transactions hold, and returns
	// them with every column, as they are after the claim: the lease
	// column set to p.Deadline and the attempt to Plan.NextAttempt. No row
	// may be returned twice, or to two concurrent calls. Zero rows is not
	// an error. A claim from the cursor (p.Cursor) may return fewer rows
	// than are claimable (see LeaseClaimParams.Cursor); one from the
	// first row may not pass over a claimable row it can lock.
	ClaimLeases(ctx context.Context, q sqlx.ExtContext, p *LeaseClaimParams) (*sqlx.Rows, error)
	// FenceLeases returns a condition over the unaliased table that holds
	// for exactly the rows whose ID is ids[i] and lease column tokens[i]
	// for some i, and its args (len(ids) == len(tokens) >= 1, ids
	// distinct). FencePairs is the portable one; PostgreSQL writes one
	// whose planning does not grow with the batch.
	FenceLeases(p *Plan, ids, tokens []any) (cond string, args []any)
}

// AdvisoryParams is the input of AdvisoryLocker's methods. Conn is the one
// session that holds all of a form's keys until each is released or the
// session ends.
type AdvisoryParams struct {
	Pool *Pool
	Conn *sqlx.Conn
	Keys []string // distinct, at most 500, none held by Conn when tried
}

// AdvisoryLocker is the capability of the Advisory form: locks on keys of
// the database (equal keys from two tables exclude each other), held by a
// session.
type AdvisoryLocker interface {
	// TryAdvisoryLocks tries each key without waiting and says, in order,
	// which it took (false: another session holds it). Any key string
	// must work. After an error the caller discards the session.
	TryAdvisoryLocks(ctx context.Context, p *AdvisoryParams) ([]bool, error)
	// AdvisoryUnlocks releases keys; a key not held is not an error.
	AdvisoryUnlocks(ctx context.Context, p *AdvisoryParams) error
	// LockWaitLimit returns the statements that bound a session's row
	// lock waits to about d (whole seconds) and restore the default, run
	// when the key session, or a connection the form writes successes on,
	// is taken and given back, so a completion an application's
	// transaction blocks fails alone. "", "": unbounded, and such a
	// completion on the key session ends it.
	LockWaitLimit(d time.Duration) (set, reset string)
}

// AdvisoryFirstLocker is an optional capability of an AdvisoryLocker:
// trying keys in order only until enough are locked, in one statement.
// Where other processes claim from the same rows, the advisory form then
// tries all of a page's keys at once instead of as many as it wants, wave
// after wave, and leaves the keys after the last it needs untried (never
// locked for a moment and released: another process would pass over their
// rows). Without it the form tries as many keys as it wants per statement.
type AdvisoryFirstLocker interface {
	// TryFirstAdvisoryLocks tries p.Keys in order, without waiting, until
	// want of them (1 <= want <= len(p.Keys)) are locked, and returns the
	// positions in p.Keys of the keys it locked, ascending. Keys after the
	// want-th key locked are not tried. Fewer than want positions: every
	// key was tried. After an error the caller discards the session.
	TryFirstAdvisoryLocks(ctx context.Context, p *AdvisoryParams, want int) ([]int, error)
}

// FirstPositions reads the answer of a TryFirstAdvisoryLocks statement
// that selects one column, the positions of the keys it locked counted
// from 1, in any order: it returns them counted from 0, ascending, and
// closes rows.
func FirstPositions(rows *sql.Rows) ([]int, error) {
	defer rows.Close()
	var out []int
	for rows.Next() {
		var i int
		if err := rows.Scan(&i); err != nil {
			return nil, err
		}
		out = append(out, i-1)
	}
	slices.Sort(out)
	return out, rows.Err()
}

// GroupGuardParams is the input of GroupGuard.GuardGroup.
type GroupGuardParams struct {
	Plan  *Plan
	Group any // the group of the head row about to be claimed
}

// GroupGuard is the capability of FIFO tables: GuardGroup locks p.Group of
// the table for the rest of tx without waiting (false: another transaction
// holds it, the claim skips the group). A database with one writer at a
// time (SQLite) returns true. Without it FIFO tables are refused.
type GroupGuard interface {
	GuardGroup(ctx context.Context, tx *sqlx.Tx, p *GroupGuardParams) (bool, error)
}

// Starter is called when a subscription starts, before the broker checks
// the columns. It fails with a *sqlxbroker.VersionError on a server too old
// for p.Form, a *sqlxbroker.FormError for a connection that cannot serve
// p.Form (PostgreSQL's advisory form behind a transaction-mode pooler), a
// *sqlxbroker.TableError for a column type that cannot work, or a clear
// error for a connection it cannot live with. It may take what
// the subscription needs (SQLite's file lock against a second process:
// ErrAdvisoryConflict) and return stop, called when it ends.
type Starter interface {
	Start(ctx context.Context, pool *Pool, p *Plan) (stop func() error, err error)
}

// Waker wakes subscribers when rows arrive: Publish runs WakeStatement ("":
// none) in the publishing transaction; Listen's channel receives after rows
// arrive and closes when ctx ends (an error: the subscription polls; one
// matching ErrUnsupported says the connection is set up without wake-ups,
// and is logged at Info). Without it other processes' subscriptions poll.
type Waker interface {
	WakeStatement(p *Plan) (string, []any)
	Listen(ctx context.Context, pool *Pool, p *Plan) (<-chan struct{}, error)
}

// DDLParams is the input of TableCreator.CreateTable: extra columns as name
// and portable type ("text", "bigint", "int", "bool", "timestamp", "bytes").
type DDLParams struct {
	Plan    *Plan
	Payload [][2]string
}

// TableCreator returns the recommended table and indexes; without it
// Broker.TableDDL fails. The lease column must accept NULL (the release
// and retry outcomes write it); every statement reads NULL and a time
// past alike as no lease held, so a default long past is allowed, and
// where the database rewrites a row whose length changes (PostgreSQL's
// heap-only updates, InnoDB's updates in place) it makes claims cheaper:
// the built-in dialects default it to 1970-01-01.
type TableCreator interface {
	CreateTable(p *DDLParams) ([]string, error)
}

// SkipDuplicatesParams is the input of DuplicateSkipper.SkipDuplicates.
type SkipDuplicatesParams struct {
	Pool   *Pool  // the broker's pool (the statements may run on another session: the caller's transaction)
	Plan   *Plan  // the table
	Column string // the unique column, as the caller named it (CheckIdent accepted it)
}

// InsertSQL is how one multi-row INSERT INTO table (cols) VALUES (..), ..
// skips duplicates: Insert replaces its "INSERT INTO" ("": kept), Suffix
// follows the VALUES list.
type InsertSQL struct {
	Insert string // e.g. "INSERT IGNORE INTO"; "": "INSERT INTO"
	Suffix string // e.g. `ON CONFLICT ("key") DO NOTHING`
}

// DuplicateSkipper is the capability of PublishParams.SkipDuplicates:
// SkipDuplicates returns the clauses that make an insert of p.Plan's table
// skip, without an error and without changing the row already there, each
// row whose p.Column value equals that of a row in the table or of an
// earlier row of the same statement. The column must have a unique
// constraint or unique index of its own; on a column without one the call
// must fail and insert nothing (the database's own error at insert time,
// as ON CONFLICT (col) gives, is enough), never insert duplicates as
// INSERT IGNORE would. Other errors (NOT NULL, a value too long) must stay
// errors. The statement's
// RowsAffected must be exactly the number of rows inserted (a skipped row
// counts 0): Publish reports their sum over its statements. SkipDuplicates
// is called once per publishing call and may read the database through
// p.Pool (a check it keeps with Keep). Without it, a publish that asks to
// skip duplicates fails with ErrUnsupported, naming the dialect and the
// capability, and inserts nothing.
type DuplicateSkipper interface {
	SkipDuplicates(ctx context.Context, p *SkipDuplicatesParams) (*InsertSQL, error)
}

// StateMarks are conditions over Plan.Alias on a column the table keeps
// for the operations' counts, each true for exactly the rows of one class:
// Unfinished for rows with neither DeadAt nor DoneAt set, Dead for rows
// with DeadAt set, Done for rows with DoneAt set and DeadAt not. A class
// the description has no column for is "".
type StateMarks struct {
	Unfinished, Dead, Done string
}

// StateMarker is the capability of cheap counts on a database that cannot
// index the state columns for them (no partial indexes, and an index on
// DeadAt and DoneAt becomes the claims' plan): the recommended table
// (TableCreator) derives a row's class from DeadAt and DoneAt into a
// column of its own, in an index no claim statement can use, since none
// names the column. StateMarks checks that p's table has that column,
// derived from p's columns, and returns the conditions on it; nil, nil
// when it has none (a table made otherwise), and the counts use the state
// columns. Counts runs the conditions in place of the state columns'
// (Plan.Unfinished and the dead and done conditions), so a wrong one makes
// wrong counts. Only the counts use it: no claim, completion or locking
// statement names the column. Without the capability the counts use the
// state columns.
type StateMarker interface {
	StateMarks(ctx context.Context, pool *Pool, p *Plan) (*StateMarks, error)
}

// ConflictDetector tells conflicts apart from other errors. Conflict
// reports whether err, returned by a statement or a COMMIT, means the
// database rolled back the whole transaction (or the statement run alone)
// because a concurrent transaction won: a deadlock victim, or on a
// multi-primary cluster a write set that lost certification to another
// node's. Nothing the transaction did stays, so running it again from the
// start is safe. It must answer false for any other error, above all one
// after which the COMMIT may have taken effect (a connection lost during
// COMMIT).
//
// With it, the lease form reports a claim that conflicted as ErrConflict
// (nothing delivered; the engine claims again at once and counts it in
// Stats.Conflicts) and runs a completion that conflicted again, its fence
// keeping it from taking effect twice; its completion batches with
// RETURNING run in a transaction, whose loss is reported at COMMIT (a
// cluster node may run a statement that ran alone again by itself, after
// returning the rows of its first run). Without it every error is final: a
// claim that fails is tried again after the idle wait, a completion's
// error is reported and its row comes back when its lease runs out.
type ConflictDetector interface {
	Conflict(err error) bool
}

// IDMatcher is an optional capability: a condition that matches a list of
// IDs with one argument however long the list, where the portable
// "id IN (?, ?, ..)" makes the server parse and plan one parameter per
// row (PostgreSQL planned an UPDATE of 500 IDs in 1.2 ms from a list, in
// 0.2 ms from one array). The advisory form takes its rows and writes its
// completion batches with it; without it, the list.
type IDMatcher interface {
	// MatchIDs returns a condition that holds for exactly the rows whose
	// column col (quoted, perhaps qualified by the table's name) holds
	// one of ids, and its args in the order of its '?'s. ids holds at
	// least one value, each as the driver returned it or as it was
	// published (int64, string, []byte, ...); ids may repeat.
	MatchIDs(p *Plan, col string, ids []any) (cond string, args []any)
}

// MatchIDs is the condition of IDMatcher: the dialect's, or
// "col IN (?, ?, ..)".
func (c Capabilities) MatchIDs(p *Plan, col string, ids []any) (string, []any) {
	if c.IDMatcher != nil {
		return c.IDMatcher.MatchIDs(p, col, ids)
	}
	return col + " IN (?" + strings.Repeat(", ?", len(ids)-1) + ")", ids[:len(ids):len(ids)]
}

// Capabilities are a dialect's optional interfaces (nil: lacking), found by
// CapabilitiesOf, the one place the library asserts them.
type Capabilities struct {
	RowLocker      RowLocker
	Leaser         Leaser
	AdvisoryLocker AdvisoryLocker
	// AdvisoryFirstLocker: see AdvisoryFirstLocker; nil: keys are tried
	// as many as are wanted per statement.
	AdvisoryFirstLocker AdvisoryFirstLocker
	GroupGuard          GroupGuard
	Starter             Starter
	Waker               Waker
	TableCreator        TableCreator
	// DuplicateSkipper: PublishParams.SkipDuplicates; nil: refused.
	DuplicateSkipper DuplicateSkipper
	// StateMarker: the counts read an indexed column of the table's own
	// instead of the state columns; nil: they read the state columns.
	StateMarker StateMarker
	// ConflictDetector: conflicts are retried (see ConflictDetector).
	ConflictDetector ConflictDetector
	// IDMatcher: lists of IDs are matched by one argument (see
	// IDMatcher and Capabilities.MatchIDs); nil: by a list.
	IDMatcher IDMatcher
}

func CapabilitiesOf(d Dialect) Capabilities {
	var c Capabilities
	c.RowLocker, _ = d.(RowLocker)
	c.Leaser, _ = d.(Leaser)
	c.AdvisoryLocker, _ = d.(AdvisoryLocker)
	if c.AdvisoryLocker != nil {
		c.AdvisoryFirstLocker, _ = d.(AdvisoryFirstLocker)
	}
	c.GroupGuard, _ = d.(GroupGuard)
	c.Starter, _ = d.(Starter)
	c.Waker, _ = d.(Waker)
	c.TableCreator, _ = d.(TableCreator)
	c.DuplicateSkipper, _ = d.(DuplicateSkipper)
	c.StateMarker, _ = d.(StateMarker)
	c.ConflictDetector, _ = d.(ConflictDetector)
	c.IDMatcher, _ = d.(IDMatcher)
	return c
}

// ReturningAlone reports whether a fenced batch with RETURNING (a lease
// completion or renewal) may run as one statement that commits itself:
// where the dialect reports no conflicts. With a ConflictDetector it runs
// in a transaction (see ConflictDetector).
func (c Capabilities) ReturningAlone() bool { return c.ConflictDetector == nil }

func (c Capabilities) Offers(f Form) bool {
	switch f {
	case RowLock:
		return c.RowLocker != nil
	case Lease:
		return c.Leaser != nil
	case Advisory:
		return c.AdvisoryLocker != nil
	}
	return false
}

// FormsOf lists the forms d offers.
func FormsOf(d Dialect) []Form {
	c := CapabilitiesOf(d)
	var out []Form
	for _, f := range Forms {
		if c.Offers(f) {
			out = append(out, f)
		}
	}
	return out
}
