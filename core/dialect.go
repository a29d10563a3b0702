package core

import (
	"context"
	"database/sql"
	"time"

	"github.com/jmoiron/sqlx"
)

// Dialect speaks one database family's SQL. The required part is small;
// each claim form and each further ability is one optional interface below,
// found in one place (CapabilitiesOf), and each says what happens without
// it. A table whose form needs a capability the dialect lacks fails at
// Subscribe with ErrFormUnavailable, never a panic.
//
// Implementing a dialect (docs/implementing-a-dialect.md has the guide):
//
//  1. Implement Dialect and the capabilities your database offers.
//  2. Register it in init() with sqlxbroker.Register under the database/sql
//     driver name(s) it serves (Register binds the name's sqlx bind type).
//  3. Run conformance.Run from a test of your package, or a main of ten
//     lines with conformance.Main; pass it before calling the dialect
//     production ready.
//
// A Dialect is a value without state, called from many goroutines at once.
// What it keeps per pool (a listening connection, a setting read from the
// server) lives in the *Pool its methods receive, never in package
// globals: the broker owns the pool and closes it.
type Dialect interface {
	// Name is a human name for messages, e.g. "PostgreSQL".
	Name() string
	// QuoteIdent quotes one identifier that CheckIdent accepted, e.g.
	// `"jobs"` or "`jobs`". It must not fail.
	QuoteIdent(ident string) string
	// BindType is the sqlx bind type of the driver (sqlx.DOLLAR,
	// sqlx.QUESTION, ...). Statements are written with '?' and rebound.
	BindType() int
	// EncodeTime turns a host time (UTC, microseconds) into the argument
	// that the dialect's timestamp columns store and compare exactly: a
	// lease deadline written by EncodeTime must compare equal to the same
	// EncodeTime value in a later statement on any session.
	EncodeTime(t time.Time) any
	// Features are facts about the dialect's SQL.
	Features() Features
}

// Features are facts about a dialect's SQL that generic statements use.
type Features struct {
	// UpdateReturning and DeleteReturning: UPDATE (DELETE) .. RETURNING
	// <columns> works. Without them the forms update and read again (a
	// read under the same condition), and batch lease completions that
	// cannot say which rows they changed run one by one when one fails.
	UpdateReturning, DeleteReturning bool
	// LeaseClaimStatement: Leaser.ClaimLeases is one statement that waits
	// for no lock, so outside FIFO claims it runs on the pool and commits
	// by itself, saving BEGIN and COMMIT. Leave it false when the claim
	// waits (SQLite's one writer): the deadline is then read once the
	// claim transaction holds what it waited for.
	LeaseClaimStatement bool
	// ClaimIsolation is the isolation of claim transactions when the
	// description names none; LevelDefault is the server's own.
	ClaimIsolation sql.IsolationLevel
	// MaxParams is the most arguments one statement should carry (a batch
	// insert is cut to fit); 0 means 30,000.
	MaxParams int
}

// RowLocker is the capability of the RowLock form: the database locks the
// rows a SELECT returns until the transaction ends, and a concurrent locking
// SELECT skips them instead of waiting. Without it the form is unavailable.
type RowLocker interface {
	// RowLock says how row-lock claims are written on pool's server. It is
	// called once when a subscription starts.
	RowLock(ctx context.Context, pool *Pool) (*RowLockSQL, error)
}

// RowLockSQL is how a server takes row locks. Only SkipLocked is required; each
// other field's zero value is a plainer way that always works.
type RowLockSQL struct {
	// SkipLocked is the clause appended to a SELECT to lock its rows and
	// skip rows others hold, e.g. "FOR UPDATE SKIP LOCKED".
	SkipLocked string
	// ChainCommit commits and opens the next transaction alike in one
	// statement ("COMMIT AND CHAIN"): a worker then keeps its transaction
	// for its next claim and a delivery saves a BEGIN. "": COMMIT, BEGIN.
	ChainCommit string
	// Prepare lets the form prepare its claim and completion once per
	// connection; false where prepared statements do not survive (a
	// pooler in transaction mode). A prepared statement that fails is
	// prepared again at its next use.
	Prepare bool
}

// LeaseClaimParams is the input of Leaser.ClaimLeases.
type LeaseClaimParams struct {
	Plan *Plan
	// Where is the claimable condition over the table aliased Plan.Alias,
	// with '?'s bound by Args. It holds the lease check and, for a FIFO
	// table, the group head.
	Where string
	Args  []any
	Limit int // the most rows to claim, at least 1
	// Deadline is the new lease deadline, encoded (EncodeTime).
	Deadline any
}

// Querier is what a claim runs its statements on: the claim transaction or,
// for a claim of one statement, the pool (sqlx's ExtContext).
type Querier = sqlx.ExtContext

// Leaser is the capability of the Lease form. Without it the form is
// unavailable.
type Leaser interface {
	// ClaimLeases claims up to p.Limit rows matching p.Where on q, in the
	// plan's order, skipping rows other transactions hold, and returns
	// them with every column, as they are after the claim: the lease
	// column set to p.Deadline and the attempt to Plan.NextAttempt. No row
	// may be returned twice, or to two concurrent calls. Zero rows is not
	// an error.
	ClaimLeases(ctx context.Context, q Querier, p *LeaseClaimParams) (*sqlx.Rows, error)
	// FenceLeases returns a condition over the unaliased table (quoted
	// names of the plan) that holds for exactly the rows whose ID equals
	// ids[i] and whose lease column equals tokens[i] for some i, with the
	// arguments of its '?'s: a batch of completions is one statement.
	// len(ids) == len(tokens) >= 1, ids distinct. FencePairs writes the
	// portable condition; a dialect whose planner spends more on it than
	// on the rows (PostgreSQL) writes one that does not grow with the
	// batch.
	FenceLeases(p *Plan, ids, tokens []any) (cond string, args []any)
}

// AdvisoryParams is the input of AdvisoryLocker's methods.
type AdvisoryParams struct {
	Pool *Pool
	// Conn is the session that holds the form's keys: one session holds
	// many keys at once, until each is released or the session ends.
	Conn *sqlx.Conn
	Keys []string // distinct, at most 500, none held by Conn when tried
}

// AdvisoryLocker is the capability of the Advisory form: locks on keys
// that belong to the database (equal keys from two tables exclude each
// other), held by a session. Without it the form is unavailable.
type AdvisoryLocker interface {
	// TryAdvisoryLocks tries each key's lock for p.Conn's session without
	// waiting and says, in the order of p.Keys, which it took (false: held
	// by another session). Any key string must work, whatever its length
	// or content. On an error the caller cannot know which keys it holds
	// and discards the session.
	TryAdvisoryLocks(ctx context.Context, p *AdvisoryParams) ([]bool, error)
	// AdvisoryUnlocks releases keys p.Conn's session took; a key not held
	// is not an error.
	AdvisoryUnlocks(ctx context.Context, p *AdvisoryParams) error
	// LockWaitLimit returns the statements that make a session's
	// statements give up a row lock wait after about d (whole seconds, at
	// least 1 s) and restore the default; the key session runs them when
	// taken and before it goes back to the pool, so a completion blocked
	// by an application's transaction fails alone. "", "": the server
	// cannot bound it, and such a completion ends the key session (its
	// deliveries come back).
	LockWaitLimit(d time.Duration) (set, reset string)
}

// GroupGuardParams is the input of GroupGuard.GuardGroup.
type GroupGuardParams struct {
	Plan  *Plan
	Group any // the group value of the head row about to be claimed
}

// GroupGuard is the capability of FIFO tables (Table.Group): it keeps a
// group's order across brokers. Without it a FIFO table is refused with a
// TableError naming Group.
type GroupGuard interface {
	// GuardGroup locks group p.Group of the table for the rest of tx,
	// without waiting: false, nil means another transaction holds it and
	// the claim skips the group. A database that runs one writer at a
	// time (SQLite) returns true at once: the claim that sees the head is
	// the only writer.
	GuardGroup(ctx context.Context, tx *sqlx.Tx, p *GroupGuardParams) (bool, error)
}

// Starter is called once when a subscription starts, before the broker
// reads the live table's columns (a column Start does not find is left to
// that check). It fails with a
// *sqlxbroker.VersionError (ErrServerTooOld) on a server too old for
// p.Form, a *sqlxbroker.TableError for a column that cannot work (a lease
// column that would not keep the token exactly), or another clear error
// for a connection the dialect cannot live with. It may take what the
// subscription needs for its life and return how to give it back, called
// when the subscription stops (SQLite's advisory form takes a file lock
// that keeps a second process off its in-process keys: ErrAdvisoryConflict).
// Without it nothing is checked beyond the columns.
type Starter interface {
	Start(ctx context.Context, pool *Pool, p *Plan) (stop func() error, err error)
}

// Waker is an optional capability: subscribers are woken when rows arrive,
// so they claim at once rather than on the next poll. Without it
// subscriptions of other processes poll; those of the publishing broker are
// woken in the process.
type Waker interface {
	// WakeStatement returns a statement and its args that Publish runs in
	// the publishing transaction to wake the table's listeners; "" none.
	WakeStatement(p *Plan) (string, []any)
	// Listen returns a channel that receives after rows arrive in the
	// table, closed when ctx ends. An error means the subscription polls.
	Listen(ctx context.Context, pool *Pool, p *Plan) (<-chan struct{}, error)
}

// DDLParams is the input of TableCreator.CreateTable.
type DDLParams struct {
	Plan *Plan
	// Payload lists extra columns as name and portable type: "text",
	// "bigint", "int", "bool", "timestamp", "bytes".
	Payload [][2]string
}

// TableCreator is an optional capability: the statements that create the
// recommended table and indexes. Without it Broker.TableDDL fails.
type TableCreator interface {
	CreateTable(p *DDLParams) ([]string, error)
}

// Capabilities are a dialect's optional interfaces, found once. A nil field
// is a capability the dialect lacks.
type Capabilities struct {
	RowLocker      RowLocker
	Leaser         Leaser
	AdvisoryLocker AdvisoryLocker
	GroupGuard     GroupGuard
	Starter        Starter
	Waker          Waker
	TableCreator   TableCreator
}

// CapabilitiesOf discovers d's capabilities. This is the one place the
// library asserts them.
func CapabilitiesOf(d Dialect) Capabilities {
	var c Capabilities
	c.RowLocker, _ = d.(RowLocker)
	c.Leaser, _ = d.(Leaser)
	c.AdvisoryLocker, _ = d.(AdvisoryLocker)
	c.GroupGuard, _ = d.(GroupGuard)
	c.Starter, _ = d.(Starter)
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
