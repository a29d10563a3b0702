// Package postgres is the PostgreSQL dialect of sqlxbroker. It serves the
// database/sql driver names "postgres" (github.com/lib/pq) and "pgx" (the
// jackc/pgx stdlib driver, which this package does not import). Import it
// for its side effect:
//
//	import _ "github.com/sqlxbroker/sqlxbroker/dialects/postgres"
//
// What PostgreSQL offers (9.5 or newer; the advisory form needs 11):
//
//   - row lock: SELECT .. FOR UPDATE SKIP LOCKED at the server's isolation
//     (READ COMMITTED unless the table description sets one);
//   - lease: one statement locks the claimable rows (skipping locked ones),
//     writes the deadline and counts the attempt, and returns the rows in
//     claim order; on a plain table (not partitioned, no child tables) it
//     finds the rows it locked again by their address (ctid);
//   - advisory lock: pg_try_advisory_lock on hashtextextended(key, 0), a
//     64-bit hash of the key (PostgreSQL 11+). The lock belongs to the
//     session, so the form needs a direct connection or a pooler in session
//     mode: behind PgBouncer in transaction or statement mode a key would be
//     taken on one server session and released on another (the form is
//     refused there: Dialect.TransactionPooling);
//   - FIFO guard: pg_try_advisory_xact_lock(table oid, hashtext(group)), the
//     two-key form, so guards never share a lock with the advisory form's
//     one-key locks, and works on every supported server;
//   - duplicate skipping (PublishParams.SkipDuplicates): INSERT ..
//     ON CONFLICT (col) DO NOTHING; the server refuses a column without a
//     unique index or constraint of its own;
//   - wake-ups: Publish runs pg_notify in the publishing transaction and
//     subscriptions LISTEN: on a pq.Listener when the dialect knows the DSN
//     (Open, Dialect.ListenDSN), a publish then wakes them within a round
//     trip; otherwise on one pooled connection per pool, read every 100 ms
//     (lib/pq only; see Dialect.Listen).
//
// Behind a pooler in transaction mode (PgBouncer pool_mode = transaction)
// set Dialect.TransactionPooling, or open the pool with the driver name
// "postgres-txpool" (TxPoolDriver): the advisory form is refused, wake-ups
// poll and nothing is prepared. A pooler in session mode needs nothing.
//
// A server older than a form needs fails the subscription at start with a
// *sqlxbroker.VersionError (core.ErrServerTooOld).
//
// Failover: a pool from Open drops a connection whose statement failed
// because its server is a standby, read-only or shutting down (Stale), so
// with a multi-host DSN and target_session_attrs=read-write, or a name the
// deployment moves to the new primary, subscriptions resume on a promoted
// standby by themselves; the wake-up listener reconnects with a backoff
// and does not loop on "cannot execute LISTEN during recovery". See
// docs/operations.md, "PostgreSQL failover".
package postgres

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/core"
)

func init() {
	sqlxbroker.Register("postgres", Dialect{})
	sqlxbroker.Register("pgx", Dialect{})
}

// Dialect is the PostgreSQL dialect. The zero value is ready to use, e.g.
// with sqlxbroker.OpenDialect for a driver registered under another name.
type Dialect struct {
	// ListenDSN, when set, is the DSN wake-ups listen with: a pq.Listener
	// on its own connection delivers each notification as the server
	// sends it. Without it, a pool opened by Open listens with its own
	// DSN, and any other pool reads notifications on a pooled connection
	// every heartbeat (100 ms).
	ListenDSN string
	// NoPrepare keeps the row-lock form from preparing its statements
	// (core.RowLockSQL.Prepare): set it behind PgBouncer in transaction mode
	// before 1.21, or with max_prepared_statements = 0. TransactionPooling
	// implies it.
	NoPrepare bool
	// Logger receives the wake-up listener's connection failures (each at
	// debug level; a warning once it has been down for a second, then at
	// most every 30 s) and its recovery; default slog.Default().
	// Subscriptions poll while it is down.
	Logger *slog.Logger
	// TransactionPooling says the connections go through a pooler in
	// transaction (or statement) mode, such as PgBouncer with pool_mode =
	// transaction, where a server session serves one client for one
	// transaction only. Subscriptions to advisory tables are then refused
	// at start with a *sqlxbroker.FormError (a session-scoped lock does not
	// survive the pooling: use the lease or row-lock form), subscriptions
	// do not LISTEN and poll instead, unless ListenDSN names a direct or
	// session-mode DSN, and the row-lock form prepares nothing (NoPrepare).
	// The driver name TxPoolDriver ("postgres-txpool") registers this
	// dialect. Without the setting, the first subscription start of a pool
	// probes for such a pooler and acts as if it were set when it finds
	// one; the probe can miss a pooler (pooling.go), so set it. With lib/pq
	// the DSN needs binary_parameters=yes as well: otherwise a statement
	// with arguments is parsed and bound in two round trips, which the
	// pooler may send to two server sessions ("unnamed prepared statement
	// does not exist"); TxPoolDriver adds it.
	TransactionPooling bool
}

var _ interface {
	core.Dialect
	core.RowLocker
	core.Leaser
	core.AdvisoryLocker
	core.GroupGuard
	core.Starter
	core.Waker
	core.TableCreator
	core.DuplicateSkipper
} = Dialect{}

func (Dialect) Name() string { return "PostgreSQL" }

// LockWaitLimit sets and resets the session's lock_timeout.
func (Dialect) LockWaitLimit(d time.Duration) (set, reset string) {
	return fmt.Sprintf("SET lock_timeout = %d", max(d, time.Second).Milliseconds()), "RESET lock_timeout"
}

// QuoteIdent double-quotes ident.
func (Dialect) QuoteIdent(ident string) string { return pq.QuoteIdentifier(ident) }

func (Dialect) BindType() int { return sqlx.DOLLAR }

// EncodeTime passes times as time.Time in UTC: a timestamptz column keeps
// microseconds, so a deadline compares equal on every session.
func (Dialect) EncodeTime(t time.Time) any { return t.UTC() }

// Features: RETURNING everywhere, a lease claim of one statement that
// skips locked rows (run on the pool outside FIFO claims), and claims at the
// server's isolation, READ COMMITTED unless configured otherwise: each
// statement of a claim sees the latest commits.
func (Dialect) Features() core.Features {
	return core.Features{DeleteReturning: true, UpdateReturning: true, LeaseClaimStatement: true}
}

// minChain is the first server with COMMIT AND CHAIN (12).
const minChain = 120000

// RowLock locks with FOR UPDATE SKIP LOCKED, chains commits from
// PostgreSQL 12 on, and prepares statements unless NoPrepare or the pool
// goes through a transaction-mode pooler.
func (d Dialect) RowLock(ctx context.Context, pool *core.Pool) (*core.RowLockSQL, error) {
	n, err := serverVersion(ctx, pool.DB)
	if err != nil {
		return nil, err
	}
	pooled, _ := d.txPooling(ctx, pool)
	rl := &core.RowLockSQL{SkipLocked: "FOR UPDATE SKIP LOCKED", Prepare: !d.NoPrepare && !pooled}
	if n >= minChain {
		rl.ChainCommit = "COMMIT AND CHAIN"
	}
	return rl, nil
}

// claimLeases locks the rows to claim in a sub-select that skips locked
// rows and updates exactly those, found by their ids through the primary
// key (an array, so the plan never hashes the whole table however large
// the backlog), then returns them in claim order. The where clause is over
// alias c; RETURNING u.* reads every column of the updated row.
//
//	%[1]s table  %[2]s alias c  %[3]s where  %[4]s order by (over c)
//	%[5]s limit  %[6]s id       %[7]s lease  %[8]s attempt  %[9]s order by
//	%[10]s the next attempt (Plan.NextAttempt over u)
const claimLeases = `WITH claimed AS (
  UPDATE %[1]s u SET %[7]s = ?, %[8]s = %[10]s
  WHERE u.%[6]s = ANY(ARRAY(SELECT %[2]s.%[6]s FROM %[1]s %[2]s WHERE %[3]s ORDER BY %[4]s LIMIT %[5]d FOR UPDATE SKIP LOCKED))
  RETURNING u.*
)
SELECT * FROM claimed ORDER BY %[9]s`

// claimLeasesByTID is claimLeases for a plain table with no child tables
// (byTID): the update finds the rows the sub-select locked by their
// physical address (ctid, a TID scan), not through the primary key a
// second time. A 500-row claim ran about a fifth faster in the server
// (1.3 against 1.6 ms) and draining with 1,000 handlers 8% faster, the
// median of ten pairs (docs/performance.md, "Claims that find their rows
// by address").
//
// An address is the version the sub-select locked, and no other
// transaction can move a row the claim holds locked, so the update
// changes exactly the rows locked. A row another transaction updated
// and committed after the statement's snapshot, which the sub-select
// locks at its newest version, is not visible to the update, so it is
// passed over and stays as that transaction left it
// (TestLeaseClaimByAddressPassesOverUpdated); it is never taken without
// its lock. The same address names a row in every partition or
// child of a table, so those keep claimLeases; both scans read the table
// ONLY, so a child table made while a subscription runs is not claimed
// from (its rows wait for the next start) rather than claimed wrongly.
const claimLeasesByTID = `WITH claimed AS (
  UPDATE ONLY %[1]s u SET %[7]s = ?, %[8]s = %[10]s
  WHERE u.ctid = ANY(ARRAY(SELECT %[2]s.ctid FROM ONLY %[1]s %[2]s WHERE %[3]s ORDER BY %[4]s LIMIT %[5]d FOR UPDATE SKIP LOCKED))
  RETURNING u.*
)
SELECT * FROM claimed ORDER BY %[9]s`

// byTID holds the plans of the lease subscriptions whose table is a plain
// table with no child tables (Start looked), with a count of the
// subscriptions started on each: their claims use claimLeasesByTID. A
// claim on a plan it does not hold (a table partitioned or inherited
// from, a view, a caller that did not start a subscription) uses
// claimLeases.
var byTID = struct {
	sync.Mutex
	plans map[*core.Plan]int
}{plans: map[*core.Plan]int{}}

// tidPlan reports whether claims on p find their rows by address.
func tidPlan(p *core.Plan) bool {
	byTID.Lock()
	defer byTID.Unlock()
	return byTID.plans[p] > 0
}

// holdTID counts one more subscription on p's plain table; the function
// it returns counts it out.
func holdTID(p *core.Plan) func() error {
	byTID.Lock()
	byTID.plans[p]++
	byTID.Unlock()
	var once sync.Once
	return func() error {
		once.Do(func() {
			byTID.Lock()
			defer byTID.Unlock()
			if byTID.plans[p]--; byTID.plans[p] <= 0 {
				delete(byTID.plans, p)
			}
		})
		return nil
	}
}

// plainTable reports whether the table of p is a plain table that no
// table inherits from (and no partition of it): where a row's address
// (ctid) names one row. False for a table that does not exist (the
// broker's column check names it), a partitioned table, a view.
func plainTable(ctx context.Context, db *sqlx.DB, p *core.Plan) (bool, error) {
	var plain sql.NullBool
	err := db.QueryRowContext(ctx, `SELECT c.relkind = 'r' AND NOT c.relhassubclass FROM pg_class c WHERE c.oid = to_regclass($1)`, p.QTable).Scan(&plain)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("sqlxbroker: postgres: read the kind of table %s: %w", p.Table, err)
	}
	return plain.Valid && plain.Bool, nil
}

// untouched holds for a row version no transaction has updated, deleted
// or locked: one the statement's snapshot shows unchanged. A row that
// another claim took after the snapshot was taken shows its old, ready
// version; FOR UPDATE would find the newest, lock it, see it leased and
// pass over it, but keep the lock until the claim commits, and the
// completion that deletes the row waits for it (with four processes on
// one table, a lock wait in about one running statement in five). The
// same filter passes over the rows of claims still running, which SKIP
// LOCKED would skip after trying their locks. A version a finished
// transaction locked (a rolled-back claim, a foreign key's share lock)
// is passed over too: claims from the cursor are followed by claims from
// the first row, which take it (core.LeaseClaimParams.Cursor). xmax is
// read as a number with an inequality so the planner keeps its estimate
// of the rows, and its index scan: xmax = '0' is estimated at one row in
// two hundred, which turns a claim of 800 into a scan and sort of the
// table.
const untouched = `%s.xmax::text::int8 < 1`

// ClaimLeases claims up to p.Limit rows in one statement.
func (Dialect) ClaimLeases(ctx context.Context, on sqlx.ExtContext, p *core.LeaseClaimParams) (*sqlx.Rows, error) {
	pl := p.Plan
	where := p.Where
	if p.Cursor {
		where += " AND " + fmt.Sprintf(untouched, pl.Alias)
	}
	claim := claimLeases
	if tidPlan(pl) {
		claim = claimLeasesByTID
	}
	q := fmt.Sprintf(claim, pl.QTable, pl.Alias, where, pl.OrderBy(pl.Alias), p.Limit,
		pl.QID, pl.QLockedUntil, pl.QAttempt, pl.OrderBy(""), pl.NextAttempt("u"))
	// The deadline comes first in the text, the where args after it.
	return on.QueryxContext(ctx, pl.Rebind(q), append([]any{p.Deadline}, p.Args...)...)
}

// fenceLeases pairs ids and tokens by position: the first array is typed
// by its comparison with the ID column (so any key type works) and read
// again by array_position, the tokens are timestamptz. An index scan on
// the IDs finds the rows; planning does not grow with the batch.
//
//	%[1]s id column  %[2]s lease column
const fenceLeases = `%[1]s = ANY(?) AND %[2]s = (?::timestamptz[])[array_position(?, %[1]s)]`

// fenceLease is fenceLeases for a batch whose rows all hold one token
// (the rows of one claim, as a completion batch mostly is): the ids in one
// array and the token once, with no array_position per row, which reads
// the array from its start each time.
const fenceLease = `%[1]s = ANY(?) AND %[2]s = ?::timestamptz`

// FenceLeases matches a batch of leased rows with two array arguments, or
// with one and the token when every row holds the same.
func (Dialect) FenceLeases(p *core.Plan, ids, tokens []any) (string, []any) {
	idArr := arrayLiteral(ids)
	if core.SameTokens(tokens) {
		return fmt.Sprintf(fenceLease, p.QID, p.QLockedUntil), []any{idArr, elementText(tokens[0])}
	}
	return fmt.Sprintf(fenceLeases, p.QID, p.QLockedUntil), []any{idArr, arrayLiteral(tokens), idArr}
}

// MatchIDs matches a list of IDs as one array, typed by its comparison
// with the column (so any key type works).
func (Dialect) MatchIDs(p *core.Plan, col string, ids []any) (string, []any) {
	return col + " = ANY(?)", []any{arrayLiteral(ids)}
}

// elementText is the text of one value as arrayLiteral writes it (before
// quoting): timestamps in UTC to the microsecond.
func elementText(v any) string {
	switch x := v.(type) {
	case int64:
		return strconv.FormatInt(x, 10)
	case []byte:
		return string(x)
	case string:
		return x
	case time.Time:
		return x.UTC().Format("2006-01-02 15:04:05.999999Z07:00")
	default:
		return fmt.Sprint(x)
	}
}

// arrayLiteral writes values as a PostgreSQL array literal, each element
// double-quoted, so the server converts it to whatever array type the
// statement gives it.
func arrayLiteral(vals []any) string {
	var b strings.Builder
	b.Grow(2 + len(vals)*16)
	var last time.Time
	var lastText string
	b.WriteByte('{')
	var num [20]byte
	for i, v := range vals {
		if i > 0 {
			b.WriteByte(',')
		}
		if x, ok := v.(int64); ok { // an id: digits and a sign, nothing to escape
			b.WriteByte('"')
			b.Write(strconv.AppendInt(num[:0], x, 10))
			b.WriteByte('"')
			continue
		}
		var s string
		if x, ok := v.(time.Time); ok && lastText != "" && x.Equal(last) {
			s = lastText // a batch's tokens are mostly one claim's deadline
		} else {
			s = elementText(v)
			if ok {
				last, lastText = x, s
			}
		}
		b.WriteByte('"')
		for j := 0; j < len(s); j++ { // bytes: '"' and '\\' never occur inside a UTF-8 sequence
			if s[j] == '"' || s[j] == '\\' {
				b.WriteByte('\\')
			}
			b.WriteByte(s[j])
		}
		b.WriteByte('"')
	}
	b.WriteByte('}')
	return b.String()
}

const (
	tryAdvisoryLocks = `SELECT pg_try_advisory_lock(hashtextextended(k, 0)) FROM unnest($1::text[]) WITH ORDINALITY AS u(k, i) ORDER BY i`
	// The function scan yields the keys in order and the filter tries
	// each as it comes; the limit stops asking for keys after the $2-th
	// locked, so the keys after it are not tried. No ORDER BY: a sort
	// reads its whole input first, which would try every key; the
	// positions are sorted in Go instead.
	tryFirstAdvisoryLocks = `SELECT i FROM unnest($1::text[]) WITH ORDINALITY AS u(k, i) WHERE pg_try_advisory_lock(hashtextextended(k, 0)) LIMIT $2`
	advisoryUnlocks       = `SELECT count(pg_advisory_unlock(hashtextextended(k, 0))) FROM unnest($1::text[]) AS u(k)`
)

// TryFirstAdvisoryLocks tries keys in order, as TryAdvisoryLocks does,
// until want are locked (core.AdvisoryFirstLocker).
func (Dialect) TryFirstAdvisoryLocks(ctx context.Context, p *core.AdvisoryParams, want int) ([]int, error) {
	rows, err := p.Conn.QueryContext(ctx, tryFirstAdvisoryLocks, keysArray(p.Keys), want)
	if err != nil {
		return nil, err
	}
	return core.FirstPositions(rows)
}

// TryAdvisoryLocks takes, in one statement and without waiting, the
// session lock on a 64-bit hash of each key. Keys are the database's: equal
// keys from two tables (or from the application's own
// pg_advisory_lock(hashtextextended(key, 0))) exclude each other. Keys
// PostgreSQL text cannot hold (a NUL byte, invalid UTF-8) are hashed in a
// Go-quoted form; distinct keys that hash alike merely run one at a time.
func (Dialect) TryAdvisoryLocks(ctx context.Context, p *core.AdvisoryParams) ([]bool, error) {
	rows, err := p.Conn.QueryContext(ctx, tryAdvisoryLocks, keysArray(p.Keys))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := make([]bool, 0, len(p.Keys))
	for rows.Next() {
		var ok bool
		if err := rows.Scan(&ok); err != nil {
			return nil, err
		}
		out = append(out, ok)
	}
	return out, rows.Err()
}

// AdvisoryUnlocks releases keys in one statement; a key not held is no
// error (the server only warns).
func (Dialect) AdvisoryUnlocks(ctx context.Context, p *core.AdvisoryParams) error {
	_, err := p.Conn.ExecContext(ctx, advisoryUnlocks, keysArray(p.Keys))
	return err
}

// keysArray is the text array literal of keys as textKey sends them.
func keysArray(keys []string) string {
	vals := make([]any, len(keys))
	for i, k := range keys {
		vals[i] = textKey(k)
	}
	return arrayLiteral(vals)
}

// textKey returns key if PostgreSQL text can hold it, else its Go-quoted form.
func textKey(key string) string {
	if utf8.ValidString(key) && !strings.ContainsRune(key, 0) {
		return key
	}
	return strconv.QuoteToASCII(key)
}

// guardGroup locks (table, group) for the rest of the transaction. The
// table is resolved to its oid, so "jobs" and "public.jobs" guard alike;
// the two-key form lives apart from the one-key locks of the advisory form.
const guardGroup = `SELECT pg_try_advisory_xact_lock($1::regclass::oid::int, hashtext($2::text))`

// GuardGroup tries the transaction-scoped lock of the group without
// waiting. Two groups whose hashtext collides (about 1 in 4 billion pairs)
// guard each other: they keep their order but may wait for each other.
func (Dialect) GuardGroup(ctx context.Context, tx *sqlx.Tx, p *core.GroupGuardParams) (bool, error) {
	g := p.Group
	if b, ok := g.([]byte); ok {
		g = string(b)
	}
	var ok bool
	err := tx.QueryRowContext(ctx, guardGroup, p.Plan.QTable, g).Scan(&ok)
	return ok, err
}

// SkipDuplicates appends ON CONFLICT (col) DO NOTHING: a row whose col is
// in the table, or in an earlier row of the statement, is skipped and not
// counted in RowsAffected. The server checks that col has a unique index
// or constraint of its own (else: "there is no unique or exclusion
// constraint matching the ON CONFLICT specification").
func (Dialect) SkipDuplicates(_ context.Context, p *core.SkipDuplicatesParams) (*core.InsertSQL, error) {
	return &core.InsertSQL{Suffix: "ON CONFLICT (" + pq.QuoteIdentifier(p.Column) + ") DO NOTHING"}, nil
}

// Server versions (server_version_num) the forms need.
const (
	minSkipLocked = 90500  // FOR UPDATE SKIP LOCKED
	minAdvisory   = 110000 // hashtextextended
)

// Start reads server_version_num and fails with a *sqlxbroker.VersionError
// when the server is too old for p's form, and refuses the advisory form
// with a *sqlxbroker.FormError behind a transaction-mode pooler
// (TransactionPooling, or found by the pool's probe). The version is one
// round trip per subscription start, so it is not kept. For the lease
// form it reads the table's kind too: the claims of a plain table with no
// child tables find their rows by address (claimLeasesByTID) until stop.
func (d Dialect) Start(ctx context.Context, pool *core.Pool, p *core.Plan) (func() error, error) {
	n, err := serverVersion(ctx, pool.DB)
	if err != nil {
		return nil, err
	}
	if err := checkVersion(n, p.Form); err != nil {
		return nil, err
	}
	switch p.Form {
	case core.Advisory:
		if pooled, how := d.txPooling(ctx, pool); pooled {
			return nil, d.refuseAdvisory(how)
		}
	case core.Lease:
		plain, err := plainTable(ctx, pool.DB, p)
		if err != nil || !plain {
			return nil, err
		}
		return holdTID(p), nil
	}
	return nil, nil
}

// serverVersion reads server_version_num.
func serverVersion(ctx context.Context, db *sqlx.DB) (int, error) {
	var s string
	if err := db.QueryRowContext(ctx, "SHOW server_version_num").Scan(&s); err != nil {
		return 0, fmt.Errorf("sqlxbroker: postgres: read server_version_num: %w", err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil {
		return 0, fmt.Errorf("sqlxbroker: postgres: server_version_num %q: %w", s, err)
	}
	return n, nil
}

// checkVersion decides whether server version num (server_version_num)
// serves form.
func checkVersion(num int, form core.Form) error {
	tooOld := func(need, reason string) error {
		return &sqlxbroker.VersionError{Server: "PostgreSQL", Found: versionString(num), Need: need, Form: form, Reason: reason}
	}
	switch {
	case num < minSkipLocked:
		return tooOld("9.5", "FOR UPDATE SKIP LOCKED")
	case form == core.Advisory && num < minAdvisory:
		return tooOld("11", "hashtextextended, the 64-bit hash of advisory keys")
	}
	return nil
}

// versionString renders server_version_num: 90600 is "9.6.0", 150020 "15.20".
func versionString(num int) string {
	if num >= 100000 {
		return fmt.Sprintf("%d.%d", num/10000, num%10000)
	}
	return fmt.Sprintf("%d.%d.%d", num/10000, num/100%100, num%100)
}

// pastLease is the lease column's default: a time long past, which every
// claim reads as no lease held, as it reads NULL. A row published with a
// lease already written is as long as after its claims, so a claim's
// update of its lease and attempt fits beside it on the page (the table's
// fillfactor) and stays heap-only: published NULL, about one claim in
// eight grew the row beyond the page's room and wrote new index entries,
// and draining with 1,000 handlers was 14-17% slower (docs/performance.md,
// "A lease column published with a time").
const pastLease = "'1970-01-01 00:00:00+00'"

// ddlTypes maps the portable payload types.
var ddlTypes = map[string]string{
	"text": "text", "bigint": "bigint", "int": "integer", "bool": "boolean",
	"timestamp": "timestamptz", "bytes": "bytea",
}

// CreateTable returns the recommended table and its indexes: a bigserial id,
// attempt starting at 1, timestamptz for the lease and state columns (the
// lease column with a default of long ago: pastLease), the
// group, order and key columns (text, bigint for an order column, unless
// the payload types them), the payload columns; a partial index on the
// claim order over unfinished rows, for a FIFO table one on (group,
// order) that the group-head check reads, and for the operations' counts
// partial indexes on ReadyAt over unfinished rows, on DeadAt over dead
// rows and on DoneAt over done rows (each where the column is described).
func (d Dialect) CreateTable(p *core.DDLParams) ([]string, error) {
	pl := p.Plan
	typed := map[string]string{}
	for _, c := range p.Payload {
		typ, ok := ddlTypes[c[1]]
		if !ok {
			return nil, fmt.Errorf("sqlxbroker: postgres: payload column %s: unknown type %q (use text, bigint, int, bool, timestamp or bytes)", c[0], c[1])
		}
		typed[strings.ToLower(c[0])] = typ
	}
	var cols []string
	seen := map[string]bool{}
	add := func(name, def string, fixed bool) error {
		k := strings.ToLower(name)
		if seen[k] {
			return nil
		}
		seen[k] = true
		if typ, ok := typed[k]; ok {
			if fixed {
				return fmt.Errorf("sqlxbroker: postgres: payload column %s is a column the broker types itself", name)
			}
			def = typ
		}
		cols = append(cols, d.QuoteIdent(name)+" "+def)
		return nil
	}
	fixed := [][2]string{
		{pl.ID, "bigserial PRIMARY KEY"}, {pl.Attempt, "integer NOT NULL DEFAULT 1"},
		{pl.LockedUntil, "timestamptz DEFAULT " + pastLease}, {pl.ReadyAt, "timestamptz"}, {pl.DeadAt, "timestamptz"}, {pl.DoneAt, "timestamptz"},
		{pl.LastError, "text"}, {pl.Metadata, "text"},
	}
	for _, c := range fixed {
		if c[0] != "" {
			if err := add(c[0], c[1], true); err != nil {
				return nil, err
			}
		}
	}
	var free [][2]string
	for _, c := range pl.OrderColumns() {
		free = append(free, [2]string{c, "bigint NOT NULL"})
	}
	free = append(free, [2]string{pl.Group, "text"})
	if pl.Key != nil {
		for _, c := range pl.Key.Columns() {
			free = append(free, [2]string{c, "text"})
		}
	}
	for _, c := range p.Payload {
		free = append(free, [2]string{c[0], ""})
	}
	for _, c := range free {
		if c[0] != "" {
			_ = add(c[0], c[1], false)
		}
	}
	with := ""
	if pl.Form != core.RowLock {
		// Claims update every row they take (lease, attempt): room on the
		// page keeps those updates heap-only, with no new index entries.
		with = " WITH (fillfactor = 50)"
	}
	stmts := []string{"CREATE TABLE IF NOT EXISTS " + pl.QTable + " (\n  " + strings.Join(cols, ",\n  ") + "\n)" + with}
	where := ""
	if u := pl.Unfinished(""); u != "1=1" {
		where = " WHERE " + u
	}
	if where != "" || !pl.OrderIsID() {
		stmts = append(stmts, "CREATE INDEX IF NOT EXISTS "+d.QuoteIdent(indexName(pl.Table, "claim"))+" ON "+pl.QTable+" ("+pl.OrderBy("")+")"+where)
	}
	if pl.Group != "" {
		stmts = append(stmts, "CREATE INDEX IF NOT EXISTS "+d.QuoteIdent(indexName(pl.Table, "fifo"))+" ON "+pl.QTable+" ("+pl.QGroup+", "+pl.OrderBy("")+")"+where)
	}
	// Broker.Counts, List and Prune: a partial index per state whose
	// predicate is the state's condition, so each count reads its own rows
	// only (ready and scheduled rows are the unfinished ones by ReadyAt).
	// The lease column is left out of every index: claims and renewals,
	// which write nothing else, stay heap-only updates.
	if pl.ReadyAt != "" {
		stmts = append(stmts, "CREATE INDEX IF NOT EXISTS "+d.QuoteIdent(indexName(pl.Table, "ready"))+" ON "+pl.QTable+" ("+pl.QReadyAt+")"+where)
	}
	if pl.DeadAt != "" {
		stmts = append(stmts, "CREATE INDEX IF NOT EXISTS "+d.QuoteIdent(indexName(pl.Table, "dead"))+" ON "+pl.QTable+" ("+pl.QDeadAt+") WHERE "+pl.QDeadAt+" IS NOT NULL")
	}
	if pl.DoneAt != "" {
		done := pl.QDoneAt + " IS NOT NULL"
		if pl.DeadAt != "" {
			done += " AND " + pl.QDeadAt + " IS NULL"
		}
		stmts = append(stmts, "CREATE INDEX IF NOT EXISTS "+d.QuoteIdent(indexName(pl.Table, "done"))+" ON "+pl.QTable+" ("+pl.QDoneAt+") WHERE "+done)
	}
	return stmts, nil
}

// indexName names an index of table (created in the table's schema), at
// most 63 bytes: a long name is cut and made unique with a hash.
func indexName(table, suffix string) string {
	name := table[strings.LastIndexByte(table, '.')+1:] + "_" + suffix
	if len(name) <= core.MaxIdentLength {
		return name
	}
	sum := sha256.Sum256([]byte(table + "_" + suffix))
	return name[:core.MaxIdentLength-17] + "_" + hex.EncodeToString(sum[:8])
}
