package core

import (
	"context"
	"database/sql"
	"time"

	"github.com/jmoiron/sqlx"
)

// Dialect speaks one database family's SQL. The required interface is small;
// every claim form and extra ability is an optional capability interface
// below, discovered in one place (CapabilitiesOf). A dialect that lacks the
// capability a table's form needs makes Subscribe fail with a *FormError
// (ErrFormUnavailable), never a panic.
//
// Implementing a dialect (see docs/implementing-a-dialect.md):
//
//  1. Implement Dialect and the capabilities your database offers.
//  2. Register it in init() with sqlxbroker.Register under the database/sql
//     driver name(s) it serves.
//  3. Call conformance.Run from a test of your package with a Target that
//     opens your database; pass it before calling the dialect production
//     ready.
//
// Methods of a Dialect are called from many goroutines at once.
type Dialect interface {
	// Name is a human name for messages, e.g. "PostgreSQL".
	Name() string

	// QuoteIdent quotes one identifier that CheckIdent accepted, e.g.
	// `"jobs"` or "`jobs`". It must not fail.
	QuoteIdent(ident string) string

	// BindType is the sqlx bind type of the driver (sqlx.DOLLAR,
	// sqlx.QUESTION, ...). Statements are written with '?' and rebound.
	BindType() int

	// EncodeTime turns a host time (UTC, truncated to microseconds) into
	// the argument that the dialect's timestamp columns store and compare
	// exactly: a lease deadline written by EncodeTime must compare equal
	// to the same EncodeTime value in a later statement on any session.
	EncodeTime(t time.Time) any

	// Features reports which optional SQL syntax generic statements may use.
	Features() Features
}

// Features are SQL syntax facts about a dialect.
type Features struct {
	// DeleteReturning: DELETE .. RETURNING <columns> is supported.
	DeleteReturning bool
	// UpdateReturning: UPDATE .. RETURNING <columns> is supported.
	UpdateReturning bool
	// SingleWriter: the database runs one write transaction at a time
	// (SQLite), so every claim statement sees the last committed claim and
	// FIFO tables need no GroupGuard.
	SingleWriter bool
	// LeaseClaimStatement: Leaser.ClaimLeases runs one statement that
	// waits for no lock (it skips locked rows), so outside a FIFO claim
	// the lease form runs it on the pool, where it commits by itself,
	// saving a transaction's BEGIN and COMMIT round trips. A dialect whose
	// claim waits for a lock (SQLite's one writer) must leave it false:
	// the form reads the clock for the deadline once its transaction
	// holds what it waits for.
	LeaseClaimStatement bool
	// MaxParams is the most arguments one statement should carry (a batch
	// insert is cut to fit); 0 means 30,000, which every built-in driver
	// takes.
	MaxParams int
}

// RowLocker is the capability of the RowLock form: the database locks the
// rows a SELECT returns until the transaction ends, and a concurrent locking
// SELECT skips them instead of waiting.
type RowLocker interface {
	// SkipLocked returns the clause appended to a SELECT to lock its rows
	// and skip rows that others hold, e.g. "FOR UPDATE SKIP LOCKED".
	SkipLocked() string
	// ClaimIsolation is the isolation level of claim transactions when the
	// table description gives none (sql.LevelDefault: the server's own).
	ClaimIsolation() sql.IsolationLevel
}

// LeaseClaimParams is the input of Leaser.ClaimLeases.
type LeaseClaimParams struct {
	Plan *Plan
	// Where is the claimable condition over the table aliased as Plan.Alias
	// ("c"), with '?' placeholders bound by Args. It already includes the
	// lease check (lease column NULL or not after now) and, for a FIFO
	// table, the group-head condition.
	Where string
	Args  []any
	// Limit is the most rows to claim (at least 1).
	Limit int
	// Deadline is the encoded new lease deadline (EncodeTime).
	Deadline any
}

// Querier is what a claim runs its statements on: the claim transaction, a
// *sqlx.Tx, or for a claim of one statement the pool, a *sqlx.DB (sqlx's
// ExtContext, which both implement).
type Querier = sqlx.ExtContext

// Leaser is the capability of the Lease form.
type Leaser interface {
	// ClaimLeases claims up to p.Limit claimable rows on q, the open claim
	// transaction (or the pool, see Features.LeaseClaimStatement), ordered
	// by the plan's order column, skipping rows that
	// other transactions hold, and returns them with every column: for each
	// row it sets the lease column to p.Deadline and the attempt column to
	// Plan.NextAttempt (one more, a NULL or an attempt below 1 counting as
	// 1), and the returned attempt is the new value. No row may
	// be returned twice, and no row may be claimed by two concurrent calls.
	// Zero rows is not an error.
	ClaimLeases(ctx context.Context, q Querier, p *LeaseClaimParams) (*sqlx.Rows, error)
}

// LeaseFencer is an optional capability of a Leaser: it matches many leased
// rows, each by its own token, in one condition that the database plans and
// runs in time proportional to the rows, so the lease form completes a batch
// in one statement.
//
// Without it the lease form writes the batch's condition as
// "id IN (?, ?, ..) AND ((id = ? AND lease = ?) OR (id = ? AND lease = ?)
// ..)": the id list lets the server find the rows by primary key, but some
// planners (PostgreSQL's) spend more time on the pairs than on the rows
// themselves.
type LeaseFencer interface {
	// FenceLeases returns a condition over the table, unaliased and with
	// the plan's quoted column names, that holds for exactly the rows
	// whose ID column equals ids[i] and whose lease column equals
	// tokens[i] for some i, and the arguments that bind its '?'s. ids are
	// distinct, as the driver returned them; tokens are encoded with
	// EncodeTime; len(ids) == len(tokens) >= 1.
	FenceLeases(p *Plan, ids, tokens []any) (cond string, args []any)
}

// AdvisoryLocker is the capability of the Advisory form. The form holds
// all the keys of its deliveries in work on one session (one connection
// kept while any key is held), so one session must be able to hold many
// keys at once, until each is released or the session ends. The form never
// tries a key its session already holds (a server whose locks nest would
// count it twice).
type AdvisoryLocker interface {
	// TryAdvisoryLock tries to take the lock on key for the session of
	// conn, without waiting. It returns false, nil when another session
	// holds the key. The lock is the database's, not the table's: equal
	// keys from two tables exclude each other. Any key string must work,
	// whatever its length or content.
	TryAdvisoryLock(ctx context.Context, conn *sqlx.Conn, key string) (bool, error)
	// AdvisoryUnlock releases a lock taken by TryAdvisoryLock on the same
	// conn. Releasing a key not held is not an error.
	AdvisoryUnlock(ctx context.Context, conn *sqlx.Conn, key string) error
}

// AdvisoryBatcher is an optional capability of an AdvisoryLocker: it tries
// and releases several keys in one statement, so a claim's keys cost one
// round trip, and so do the keys of completions that end together. Without
// it the form calls TryAdvisoryLock and AdvisoryUnlock key by key.
type AdvisoryBatcher interface {
	// TryAdvisoryLocks tries each of keys as TryAdvisoryLock does, on
	// conn's session, and returns whether each was taken: len(keys)
	// results, in the order of keys. keys are distinct, none is held by
	// the session, and there are at most 500. On an error the caller
	// cannot know which keys the session holds and discards it.
	TryAdvisoryLocks(ctx context.Context, conn *sqlx.Conn, keys []string) ([]bool, error)
	// AdvisoryUnlocks releases keys taken on conn's session (at most 500);
	// a key not held is not an error.
	AdvisoryUnlocks(ctx context.Context, conn *sqlx.Conn, keys []string) error
}

// AdvisoryAttacher is an optional capability of an AdvisoryLocker whose keys
// are not held by the database server (SQLite keeps them in the process).
// AttachAdvisory is called when an advisory subscription starts; it must fail
// with ErrAdvisoryConflict when another process could hold keys of the same
// database. The returned release is called when the subscription stops.
type AdvisoryAttacher interface {
	AttachAdvisory(ctx context.Context, db *sqlx.DB) (release func() error, err error)
}

// GroupGuardParams is the input of GroupGuard.GuardGroup.
type GroupGuardParams struct {
	Plan  *Plan
	Group any // the group value of the head row about to be claimed
}

// GroupGuard is the capability that keeps a FIFO group's order across
// brokers: it locks the group inside the claim transaction.
type GroupGuard interface {
	// GuardGroup locks group p.Group of the table for the rest of tx,
	// without waiting: false, nil means another transaction holds it and
	// the claim must skip the group. A dialect without GroupGuard must
	// report Features.SingleWriter to offer FIFO tables.
	GuardGroup(ctx context.Context, tx *sqlx.Tx, p *GroupGuardParams) (bool, error)
}

// ServerChecker is an optional capability: CheckServer is called once when a
// subscription starts and fails with a *VersionError (ErrServerTooOld) when
// the server is too old for form, or with another clear error when the
// connection cannot work (a DSN option the dialect cannot live with).
type ServerChecker interface {
	CheckServer(ctx context.Context, db *sqlx.DB, form Form) error
}

// TableChecker is an optional capability: CheckTable is called once when a
// subscription starts, after Plan.CheckLive found every column, and fails
// with a *TableError when a column's type cannot work with the dialect (a
// lease column that would not keep the deadline token exactly).
type TableChecker interface {
	CheckTable(ctx context.Context, db *sqlx.DB, p *Plan) error
}

// TxChainer is an optional capability of a RowLocker dialect: the server
// commits a transaction and opens the next, with the same isolation and
// access mode, in one statement (COMMIT AND CHAIN). The row-lock form then
// keeps a worker's claim transaction, and its connection, from one delivery
// to the next: a delivery costs its claim, its completion and the chained
// commit, with no BEGIN. The form chains only a transaction whose handler
// never asked for it (Delivery.Tx), and rolls back a chained transaction
// that finds no row, so a connection is not kept for a table that is empty.
//
// ChainCommit is called once, when a subscription starts. It returns the
// statement, or "" when the server connected to has none (PostgreSQL
// before 12); an error only when the server could not be asked.
type TxChainer interface {
	ChainCommit(ctx context.Context, db *sqlx.DB) (string, error)
}

// ClaimBeginner is an optional capability: BeginClaim opens claim
// transactions (SQLite opens them IMMEDIATE). Without it the forms call
// db.BeginTxx with the claim isolation.
type ClaimBeginner interface {
	BeginClaim(ctx context.Context, db *sqlx.DB, opts *sql.TxOptions) (*sqlx.Tx, error)
}

// Waker is an optional capability: subscribers are woken when rows arrive,
// so they claim at once rather than on the next poll.
type Waker interface {
	// WakeStatement returns a statement (and args) that Publish runs in the
	// publishing transaction to wake the table's listeners; "" for none.
	// Placeholders are written '?' and rebound, like every statement.
	WakeStatement(p *Plan) (string, []any)
	// Listen returns a channel that receives after rows arrive in the
	// table. The channel is closed when ctx ends. An error means the
	// subscription polls only.
	Listen(ctx context.Context, db *sqlx.DB, p *Plan) (<-chan struct{}, error)
}

// DDLParams is the input of TableCreator.CreateTable.
type DDLParams struct {
	Plan *Plan
	// Payload lists extra columns as name and portable type: "text",
	// "bigint", "int", "bool", "timestamp", "bytes".
	Payload [][2]string
}

// StatementPreparer is an optional capability: PrepareStatements reports
// whether forms may prepare the statements they repeat for every delivery
// (the row-lock claim and completion), once per connection, instead of
// sending their text each time. The server then parses and plans them once;
// on PostgreSQL a row-lock delivery costs about a quarter less. A dialect
// returns false where prepared statements do not survive (PgBouncer in
// transaction mode before 1.21, which hands each transaction another
// server session). Without the capability nothing is prepared.
//
// A prepared statement that fails is dropped and prepared again on its next
// use, so a table altered while subscriptions run (PostgreSQL's "cached
// plan must not change result type") costs one failed claim.
type StatementPreparer interface {
	PrepareStatements() bool
}

// LockWaitLimiter is an optional capability: statements that bound how long
// a session's statements wait for a row lock. The advisory form's key
// session runs the set statement when it is taken from the pool and the
// reset statement before it goes back, so a completion that waits on a row
// an application's transaction holds fails alone, as a statement error,
// before the form's own statement time (10 s) runs out: the drivers give
// up a connection whose statement they cancel, and with the key session
// every delivery it holds would be lost. Without the capability such a
// completion ends the session.
type LockWaitLimiter interface {
	// LockWaitLimit returns the statement that makes the session's
	// statements give up a row lock wait after about d (d is whole
	// seconds, at least 1 s; a server that counts in seconds rounds up),
	// and the statement that restores the session's default. Both run
	// outside any transaction and take no arguments.
	LockWaitLimit(d time.Duration) (set, reset string)
}

// TableCreator is an optional capability: CreateTable returns the
// statements that create the recommended table and indexes.
type TableCreator interface {
	CreateTable(p *DDLParams) ([]string, error)
}

// Capabilities are a dialect's optional interfaces, found once. A nil field
// is a capability the dialect lacks.
type Capabilities struct {
	RowLocker        RowLocker
	Leaser           Leaser
	LeaseFencer      LeaseFencer
	AdvisoryLocker   AdvisoryLocker
	AdvisoryBatcher  AdvisoryBatcher
	AdvisoryAttacher AdvisoryAttacher
	GroupGuard       GroupGuard
	ServerChecker    ServerChecker
	TableChecker     TableChecker
	ClaimBeginner    ClaimBeginner
	TxChainer        TxChainer
	Preparer         StatementPreparer
	LockWaitLimiter  LockWaitLimiter
	Waker            Waker
	TableCreator     TableCreator
}

// CapabilitiesOf discovers d's capabilities. This is the one place the
// library asserts them.
func CapabilitiesOf(d Dialect) Capabilities {
	var c Capabilities
	c.RowLocker, _ = d.(RowLocker)
	c.Leaser, _ = d.(Leaser)
	c.LeaseFencer, _ = d.(LeaseFencer)
	c.AdvisoryLocker, _ = d.(AdvisoryLocker)
	c.AdvisoryBatcher, _ = d.(AdvisoryBatcher)
	c.AdvisoryAttacher, _ = d.(AdvisoryAttacher)
	c.GroupGuard, _ = d.(GroupGuard)
	c.ServerChecker, _ = d.(ServerChecker)
	c.TableChecker, _ = d.(TableChecker)
	c.ClaimBeginner, _ = d.(ClaimBeginner)
	c.TxChainer, _ = d.(TxChainer)
	c.Preparer, _ = d.(StatementPreparer)
	c.LockWaitLimiter, _ = d.(LockWaitLimiter)
	c.Waker, _ = d.(Waker)
	c.TableCreator, _ = d.(TableCreator)
	return c
}

// Offers reports whether the capabilities include form's.
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
