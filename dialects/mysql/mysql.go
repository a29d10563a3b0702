// Package mysql is the MySQL and MariaDB dialect of sqlxbroker, on
// github.com/go-sql-driver/mysql (driver name "mysql"), for MySQL 8.0.1+ and
// MariaDB 10.6+, the first releases that skip locked rows. Import it for its
// side effect:
//
//	import _ "github.com/sqlxbroker/sqlxbroker/dialects/mysql"
//
// What the dialect does:
//
//   - row lock: SELECT .. FOR UPDATE SKIP LOCKED in a READ COMMITTED
//     transaction, so a claim locks the rows it takes and not the gaps;
//   - lease: in the claim transaction, a locking select of the rows, one
//     UPDATE of the found ids (deadline, attempt + 1), a re-read of them;
//   - advisory lock: GET_LOCK(name, 0) and RELEASE_LOCK(name) on the
//     session holding the subscription's keys, a claim's keys in one SELECT
//     (one session holds many locks: MySQL 5.7+, MariaDB 10.0.2+), tried
//     in order until as many as wanted are taken (the names as a JSON
//     array read by JSON_TABLE, its scan ended by a LIMIT: MySQL 8.0.4+,
//     MariaDB 10.6+),
//     name = DATABASE() (read once per pool) ':' key (as bytes), replaced
//     by its hex SHA-256 when over 64 bytes (GET_LOCK's limit) or when the
//     key has a byte outside printable ASCII (GET_LOCK would turn it into
//     '?' or end the name at a NUL, and distinct keys would share a lock). A server
//     may fold the case of lock names (MariaDB's manual says it does, 10.11
//     compares bytes), so short keys that differ only in case may exclude
//     each other, never the reverse;
//   - FIFO guard: a locking read of the group's unfinished rows that skips
//     rows others hold; the group is the claim's when no row was skipped;
//   - duplicate skipping (PublishParams.SkipDuplicates): INSERT ..
//     ON DUPLICATE KEY UPDATE col = col, which leaves the row there
//     unchanged and, unlike INSERT IGNORE, keeps NOT NULL, truncation and
//     other errors errors. Any unique key of the table (the primary key
//     included) makes a row a duplicate, so col should be the only unique
//     key besides a server-assigned id. The count of inserted rows is the
//     statement's affected rows: 1 per inserted row, 0 per unchanged
//     duplicate, the driver's default (clientFoundRows=false). With
//     clientFoundRows=true a duplicate would count 1: the dialect tries
//     the broker's pool once (a temporary table) and refuses such a pool;
//   - counts (Broker.Counts): MariaDB has no partial indexes, and an index
//     on DeadAt or DoneAt becomes the claims' plan, where a row-lock claim
//     that skips a held row keeps a lock on its secondary entry and the
//     holder's completion waits for it. CreateTable adds instead an
//     INVISIBLE STORED column sqlxbroker_state (0 unfinished, 1 done, 2
//     dead) and the index sqlxbroker_counts on it and ReadyAt; no claim
//     statement names the column, so none can use
//     the index, and StateMarks has the counts read it (a table without
//     it is counted by table scans).
//
// On a Galera cluster (MariaDB Galera, Percona XtraDB Cluster: wsrep_on),
// whose nodes all take writes, Start refuses the row-lock and advisory
// forms with a *sqlxbroker.FormError: row locks and GET_LOCK are each
// node's own, and a conflict between nodes shows only at COMMIT. The lease
// form works across nodes, on a pool with interpolateParams=true (Start
// refuses one that prepares statements, see checkCluster): a claim
// commits before its rows are handed out,
// and one that loses certification (error 1213 at COMMIT) delivers nothing
// and is made again (Conflict); a completion that loses is run again, its
// fence on the lease token keeping it from taking effect twice. See
// docs/compatibility.md.
//
// Times are sent as fixed-format UTC text ("2006-01-02 15:04:05.000000"),
// never as time.Time, so the DSN's parseTime and loc change nothing the
// library compares; the server converts the text when it meets a DATETIME
// column. A lease column must be DATETIME(6): a column without microseconds
// would not hold the deadline token exactly, and TIMESTAMP converts through
// the session time zone. Start refuses other types; CreateTable makes
// every timestamp column DATETIME(6). With parseTime=true the driver reads
// DATETIME values as wall clock in loc, so leave loc at its default (UTC)
// when handlers read the table's timestamps.
//
// The registered dialect speaks what MySQL and MariaDB share, and so uses no
// RETURNING. On MariaDB, Dialect{MariaDB: true} adds DELETE .. RETURNING
// (batched lease completions); pass it to sqlxbroker.OpenDialect.
//
// Every statement with arguments costs three round trips (prepare, execute,
// close) unless the DSN says interpolateParams=true, which makes it one; the
// dialect works either way. A claim transaction names READ COMMITTED, one
// more round trip, unless the DSN starts sessions there
// (tx_isolation='READ-COMMITTED' on MariaDB, transaction_isolation on
// MySQL; Start notices).
//
// Limits: a FIFO table in the advisory form needs MariaDB (the form's take
// is an UPDATE with a subquery on its own table, which MySQL 8 rejects with
// error 1093). A FIFO table refuses Table.Isolation SERIALIZABLE: InnoDB
// turns the claim's plain reads of the group into locking reads that wait
// for rows in work, so claims would no longer skip them.
package mysql

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	driver "github.com/go-sql-driver/mysql" // the "mysql" database/sql driver
	"github.com/jmoiron/sqlx"
	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/core"
)

func init() { sqlxbroker.Register("mysql", Dialect{}) }

// Dialect is the MySQL/MariaDB dialect. The zero value serves both servers.
type Dialect struct {
	// MariaDB declares the server MariaDB: lease completions are batched
	// with DELETE .. RETURNING, and Start refuses a MySQL server.
	MariaDB bool
}

var _ interface {
	core.Dialect
	core.RowLocker
	core.Leaser
	core.AdvisoryLocker
	core.GroupGuard
	core.Starter
	core.TableCreator
	core.DuplicateSkipper
	core.StateMarker
	core.ConflictDetector
} = Dialect{}

// LockWaitLimit sets and resets the session's innodb_lock_wait_timeout
// (whole seconds).
func (Dialect) LockWaitLimit(d time.Duration) (set, reset string) {
	secs := int64((max(d, time.Second) + time.Second - 1) / time.Second)
	return fmt.Sprintf("SET SESSION innodb_lock_wait_timeout = %d", secs), "SET SESSION innodb_lock_wait_timeout = DEFAULT"
}

func (d Dialect) Name() string {
	if d.MariaDB {
		return "MariaDB"
	}
	return "MySQL/MariaDB"
}

func (Dialect) QuoteIdent(s string) string { return "`" + strings.ReplaceAll(s, "`", "``") + "`" }

func (Dialect) BindType() int { return sqlx.QUESTION }

// timeLayout is what DATETIME(6) reads from text, exactly.
const timeLayout = "2006-01-02 15:04:05.000000"

// EncodeTime sends times as fixed-format UTC text.
func (Dialect) EncodeTime(t time.Time) any { return t.UTC().Format(timeLayout) }

// Features: MariaDB has DELETE .. RETURNING (10.0.5+) but no UPDATE ..
// RETURNING; MySQL has neither. Claims run at READ COMMITTED: locking reads
// lock the rows they return, not the gaps between them, and each statement
// reads the latest commits. A DELETE of 10 ids of a 30-row table is
// planned as a scan (EXPLAIN: ALL, with FORCE INDEX too), which waits for
// every locked row it reads (ListScanWaits).
func (d Dialect) Features() core.Features {
	return core.Features{DeleteReturning: d.MariaDB, ClaimIsolation: sql.LevelReadCommitted, ListScanWaits: true}
}

// RowLock locks with FOR UPDATE SKIP LOCKED, chains commits with COMMIT AND
// CHAIN (every MySQL and MariaDB server has it; the next transaction keeps
// the claim's isolation), and prepares statements (the server prepares one
// again by itself when its table changes).
func (Dialect) RowLock(context.Context, *core.Pool) (*core.RowLockSQL, error) {
	return &core.RowLockSQL{SkipLocked: "FOR UPDATE SKIP LOCKED", ChainCommit: "COMMIT AND CHAIN", Prepare: true, ByID: true}, nil
}

// FenceLeases is the portable fence (core.FencePairs).
func (Dialect) FenceLeases(p *core.Plan, ids, tokens []any) (string, []any) {
	return core.FencePairs(p, ids, tokens)
}

// ---- server ----

// Start checks the server and the table (checkTable) when a subscription
// starts.
func (d Dialect) Start(ctx context.Context, pool *core.Pool, p *core.Plan) (func() error, error) {
	if err := d.checkServer(ctx, pool, p.Form); err != nil {
		return nil, err
	}
	if err := d.checkCluster(ctx, pool.DB, p.Form); err != nil {
		return nil, err
	}
	return nil, checkTable(ctx, pool.DB, p)
}

// MySQL error numbers.
const (
	errDeadlock        = 1213 // ER_LOCK_DEADLOCK: the transaction was rolled back (a Galera certification failure too)
	errUnknownVariable = 1193 // ER_UNKNOWN_SYSTEM_VARIABLE
	errParse           = 1064 // ER_PARSE_ERROR: a server without JSON_TABLE (MySQL before 8.0.4)
)

// Conflict reports error 1213 (ER_LOCK_DEADLOCK): InnoDB rolled back the
// whole transaction as a deadlock victim, or a Galera node rolled it back
// because its write set lost certification to another node's (at COMMIT),
// or aborted it for a replicated write set that needed its locks (at any
// statement). A lock wait timeout (1205) is not one: it rolls back only the
// statement, unless innodb_rollback_on_timeout says otherwise.
func (Dialect) Conflict(err error) bool {
	var me *driver.MySQLError
	return errors.As(err, &me) && me.Number == errDeadlock
}

// checkCluster refuses the row-lock and advisory forms on a node of a
// Galera cluster (MariaDB Galera, Percona XtraDB Cluster: wsrep_on with a
// provider), whose nodes all take writes. There, locks are the node's own:
// GET_LOCK excludes sessions of one node only, and a row lock does not
// stop another node's transaction from changing the row; the write sets
// are certified at COMMIT, and the one that loses is rolled back with a
// deadlock error. A row-lock delivery would learn that only at its
// completion, after its handler ran while another node's handler ran for
// the same row. The lease form commits its claim before any handler runs,
// so a claim that loses delivers nothing. MySQL has no wsrep_on (error
// 1193), MariaDB without Galera answers OFF.
//
// The lease form works there on a pool that sends statements as text
// (interpolateParams=true): with server-side prepared statements, a
// transaction the node aborts between a statement's execution and its
// close (which has no reply) is rolled back unreported, and the next
// statements run outside it, so COMMIT reports nothing either; a lease
// completion would then report success for a row it left leased, whose
// handler runs again when the lease ends.
func (d Dialect) checkCluster(ctx context.Context, db *sqlx.DB, form core.Form) error {
	var on sql.NullInt64
	var provider sql.NullString
	err := db.QueryRowxContext(ctx, "SELECT @@GLOBAL.wsrep_on, @@GLOBAL.wsrep_provider").Scan(&on, &provider)
	var me *driver.MySQLError
	switch {
	case errors.As(err, &me) && me.Number == errUnknownVariable:
		return nil
	case err != nil:
		return fmt.Errorf("sqlxbroker: mysql: read wsrep_on: %w", err)
	case on.Int64 != 1 || strings.EqualFold(provider.String, "none") || provider.String == "":
		return nil
	}
	if form == core.Lease {
		prepares, err := preparesStatements(ctx, db)
		if err != nil {
			return fmt.Errorf("sqlxbroker: mysql: check interpolateParams: %w", err)
		}
		if prepares {
			return fmt.Errorf("sqlxbroker: mysql: the server is a node of a Galera cluster (wsrep_on=ON) and the pool prepares statements on the server: " +
				"a transaction the node aborts for another node's write set between a prepared statement's execution and its close is rolled back without an error, " +
				"so a lease completion could report success for a row it left leased: add interpolateParams=true to the DSN")
		}
		return nil
	}
	reason := "the server is a node of a Galera cluster (wsrep_on=ON), where row locks are the node's own: " +
		"a claim on another node takes the same row, and the conflict shows only as a deadlock error at COMMIT, after both handlers ran"
	if form == core.Advisory {
		reason = "the server is a node of a Galera cluster (wsrep_on=ON), where GET_LOCK is the node's own: " +
			"brokers on two nodes would hold the same key, and run two handlers for one row, at once"
	}
	return &sqlxbroker.FormError{Dialect: d.Name(), Form: form,
		Reason: reason + "; use the lease form (Table.LockedUntil), whose claim commits before any handler runs and is made again when it loses to another node's"}
}

// checkServer checks the version and the session settings a pool gives:
// autocommit must be on (the advisory form writes outside transactions) and
// columnsWithAlias off (the forms find columns by their plain names). A pool
// whose sessions start at READ COMMITTED is told so
// (core.Pool.SetSessionIsolation): its claims then begin without naming the
// level, which saves a statement each.
func (d Dialect) checkServer(ctx context.Context, pool *core.Pool, form core.Form) error {
	db := pool.DB
	var version string
	var autocommit int
	if err := db.QueryRowxContext(ctx, "SELECT VERSION(), @@autocommit").Scan(&version, &autocommit); err != nil {
		return fmt.Errorf("sqlxbroker: mysql: read server version: %w", err)
	}
	if err := checkVersion(version, form); err != nil {
		return err
	}
	if d.MariaDB && !isMariaDB(version) {
		return fmt.Errorf("sqlxbroker: mysql: Dialect{MariaDB: true} on MySQL %s, which has no DELETE .. RETURNING: use the registered dialect (Dialect{})", version)
	}
	if autocommit != 1 {
		return fmt.Errorf("sqlxbroker: mysql: the sessions run with autocommit=0, so statements outside a transaction never commit: remove autocommit=0 from the DSN")
	}
	if sessionIsolation(ctx, db) == "READ-COMMITTED" {
		pool.SetSessionIsolation(sql.LevelReadCommitted)
	}
	rows, err := db.QueryxContext(ctx, "SELECT x FROM (SELECT 1 AS x) AS t")
	if err != nil {
		return fmt.Errorf("sqlxbroker: mysql: check column names: %w", err)
	}
	cols, err := rows.Columns()
	rows.Close()
	if err != nil {
		return fmt.Errorf("sqlxbroker: mysql: check column names: %w", err)
	}
	if len(cols) != 1 || cols[0] != "x" {
		return fmt.Errorf("sqlxbroker: mysql: the driver names columns %q instead of \"x\": remove columnsWithAlias=true from the DSN", cols)
	}
	return nil
}

// sessionIsolation reads the session's isolation level, "" when neither
// variable answers.
func sessionIsolation(ctx context.Context, db *sqlx.DB) string {
	for _, q := range []string{"SELECT @@SESSION.transaction_isolation", "SELECT @@SESSION.tx_isolation"} {
		var level string
		if err := db.QueryRowxContext(ctx, q).Scan(&level); err == nil {
			return strings.ToUpper(level)
		}
	}
	return ""
}

// Lowest versions: the first releases with SELECT .. FOR UPDATE SKIP LOCKED.
var (
	minMySQL   = [3]int{8, 0, 1}
	minMariaDB = [3]int{10, 6, 0}
)

var versionRE = regexp.MustCompile(`^(\d+)\.(\d+)\.(\d+)`)

func isMariaDB(version string) bool { return strings.Contains(strings.ToLower(version), "mariadb") }

// checkVersion decides whether a server reporting version (SELECT VERSION())
// is new enough: nil, a *sqlxbroker.VersionError, or an error for a version it
// cannot read.
func checkVersion(version string, form core.Form) error {
	server, need := "MySQL", minMySQL
	v := version
	if isMariaDB(version) {
		server, need = "MariaDB", minMariaDB
		v = strings.TrimPrefix(v, "5.5.5-") // the replication-compatible prefix
	}
	m := versionRE.FindStringSubmatch(v)
	if m == nil {
		return fmt.Errorf("sqlxbroker: mysql: cannot read the server version %q", version)
	}
	var got [3]int
	for i := range got {
		got[i], _ = strconv.Atoi(m[i+1])
	}
	for i := range got {
		if got[i] != need[i] {
			if got[i] > need[i] {
				return nil
			}
			return &sqlxbroker.VersionError{Server: server, Found: m[0], Form: form,
				Need:   fmt.Sprintf("%d.%d.%d", need[0], need[1], need[2]),
				Reason: "the first release with SELECT .. FOR UPDATE SKIP LOCKED"}
		}
	}
	return nil
}

// columnType reads a column's DATA_TYPE and DATETIME_PRECISION.
const columnType = `SELECT DATA_TYPE, COALESCE(DATETIME_PRECISION, -1) FROM information_schema.COLUMNS
WHERE TABLE_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME = ? AND COLUMN_NAME = ?`

// checkTable fails with a *sqlxbroker.TableError for a FIFO table with SERIALIZABLE
// claims (their plain reads wait for held rows), and when the lease column
// is not DATETIME(6): the deadline it stores is the delivery token, compared
// for equality, so it must keep microseconds and undergo no time zone
// conversion. A column the lookup does not find is left to Plan.CheckLive.
func checkTable(ctx context.Context, db *sqlx.DB, p *core.Plan) error {
	if p.Group != "" && p.Isolation == sql.LevelSerializable {
		return &sqlxbroker.TableError{Table: p.Table, Field: "Isolation",
			Reason: "a FIFO table cannot claim at SERIALIZABLE on MySQL/MariaDB: InnoDB makes the plain reads of the group locking reads that wait for rows in work; use READ COMMITTED (the default) or REPEATABLE READ"}
	}
	if p.LockedUntil == "" {
		return nil
	}
	var schema any
	name := p.Table
	if s, n, ok := strings.Cut(name, "."); ok {
		schema, name = s, n
	}
	var typ string
	var prec int
	err := db.QueryRowxContext(ctx, columnType, schema, name, p.LockedUntil).Scan(&typ, &prec)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return nil
	case err != nil:
		return fmt.Errorf("sqlxbroker: mysql: read the type of %s.%s: %w", p.Table, p.LockedUntil, err)
	case strings.EqualFold(typ, "datetime") && prec == 6:
		return nil
	}
	return &sqlxbroker.TableError{Table: p.Table, Field: "LockedUntil",
		Reason: fmt.Sprintf("column %q is %s(%d): the lease deadline is compared exactly, so the column must be DATETIME(6)", p.LockedUntil, typ, max(prec, 0))}
}

// preparesStatements reports whether a statement with arguments on the
// pool is prepared on the server (the driver's default) rather than sent
// as text (interpolateParams=true): the session's Com_stmt_prepare counts
// it.
func preparesStatements(ctx context.Context, db *sqlx.DB) (bool, error) {
	conn, err := db.Connx(ctx)
	if err != nil {
		return false, err
	}
	defer conn.Close()
	const count = "SHOW SESSION STATUS LIKE 'Com_stmt_prepare'"
	var name string
	var before, after int64
	var one int
	if err := conn.QueryRowxContext(ctx, count).Scan(&name, &before); err != nil {
		return false, err
	}
	if err := conn.QueryRowxContext(ctx, "SELECT ?", 1).Scan(&one); err != nil {
		return false, err
	}
	if err := conn.QueryRowxContext(ctx, count).Scan(&name, &after); err != nil {
		return false, err
	}
	return after > before, nil
}

// ---- lease ----

const (
	// leaseLock picks and locks the rows to claim (%[4]s is p.Where).
	leaseLock = "SELECT %[1]s.%[2]s FROM %[3]s %[1]s WHERE %[4]s ORDER BY %[5]s LIMIT %[6]d FOR UPDATE SKIP LOCKED"
	// leaseSet writes the deadline and counts the attempt of the locked ids.
	leaseSet = "UPDATE %[1]s SET %[2]s = ?, %[3]s = %[6]s WHERE %[4]s IN (%[5]s)"
	// leaseRead returns the claimed rows as they now are: those holding
	// the claim's deadline.
	leaseRead = "SELECT * FROM %[1]s WHERE %[2]s IN (%[3]s) AND %[5]s = ? ORDER BY %[4]s"
)

// ClaimLeases locks up to p.Limit claimable rows, skipping held ones, sets
// their deadline and attempt in one UPDATE, and re-reads them, all in tx.
//
// The re-read returns only the rows holding p.Deadline: a claim whose
// transaction was rolled back between its statements without the next one
// saying so (see checkCluster) returns none. (The UPDATE does not repeat
// the claim's condition: it could then take another plan than the
// primary key and wait for rows other claims hold.)
func (Dialect) ClaimLeases(ctx context.Context, on sqlx.ExtContext, p *core.LeaseClaimParams) (*sqlx.Rows, error) {
	pl := p.Plan
	var ids []any
	err := sqlx.SelectContext(ctx, on, &ids, fmt.Sprintf(leaseLock, pl.Alias, pl.QID, pl.QTable, p.Where, pl.OrderBy(pl.Alias), p.Limit), p.Args...)
	if err != nil {
		return nil, err
	}
	in := "NULL" // no row: the read returns none, with the table's columns
	if len(ids) > 0 {
		in = "?" + strings.Repeat(", ?", len(ids)-1)
		set := fmt.Sprintf(leaseSet, pl.QTable, pl.QLockedUntil, pl.QAttempt, pl.QID, in, pl.NextAttempt(""))
		if _, err := on.ExecContext(ctx, set, append([]any{p.Deadline}, ids...)...); err != nil {
			return nil, err
		}
	}
	return on.QueryxContext(ctx, fmt.Sprintf(leaseRead, pl.QTable, pl.QID, in, pl.OrderBy(""), pl.QLockedUntil), append(ids, p.Deadline)...)
}

// ---- advisory ----

// lockNames returns the lock name of each key: DATABASE() ':' key as
// bytes, or its hex SHA-256 when over 64 bytes or when the key has a byte
// outside printable ASCII. Bytes, not text, so the name does not depend on
// the connection's character set.
//
// A key with a byte outside printable ASCII is always hashed: GET_LOCK
// converts a name to the server's character set (a byte invalid there, or
// a 4-byte UTF-8 character, becomes '?') and ends it at a NUL byte, so
// such keys would otherwise share locks.
//
// The names are made here, not in the statement: a name computed in SQL
// per key (a derived table each) made a statement of 800 keys take over a
// second to plan and run on MariaDB 10.11, against 5 ms for literal names.
func lockNames(ctx context.Context, p *core.AdvisoryParams) ([]any, error) {
	db, err := keyDatabase(ctx, p)
	if err != nil {
		return nil, fmt.Errorf("sqlxbroker: mysql: the database of the lock names: %w", err)
	}
	names := make([]any, len(p.Keys))
	for i, k := range p.Keys {
		n := db + ":" + k
		if len(n) > 64 || !printable(k) {
			sum := sha256.Sum256([]byte(n))
			names[i] = hex.EncodeToString(sum[:])
		} else {
			names[i] = []byte(n)
		}
	}
	return names, nil
}

// databaseKey keeps a pool's DATABASE() (core.Keep).
type databaseKey struct{}

// keyDatabase is DATABASE() of p's sessions ("" for none), read once per
// pool (on every call without one).
func keyDatabase(ctx context.Context, p *core.AdvisoryParams) (string, error) {
	read := func() (string, error) {
		var db sql.NullString
		err := p.Conn.QueryRowxContext(ctx, "SELECT DATABASE()").Scan(&db)
		return db.String, err
	}
	if p.Pool == nil {
		return read()
	}
	return core.Keep(p.Pool, databaseKey{}, read)
}

// TryAdvisoryLocks takes each key's GET_LOCK(name, 0) for the session, in
// one statement of one GET_LOCK per key: 1 taken, 0 held elsewhere, NULL
// an error. No keys: no statement.
func (Dialect) TryAdvisoryLocks(ctx context.Context, p *core.AdvisoryParams) ([]bool, error) {
	keys := p.Keys
	if len(keys) == 0 {
		return []bool{}, nil
	}
	names, err := lockNames(ctx, p)
	if err != nil {
		return nil, err
	}
	got := make([]sql.NullInt64, len(keys))
	dest := make([]any, len(keys))
	for i := range got {
		dest[i] = &got[i]
	}
	if err := p.Conn.QueryRowxContext(ctx, perKey("GET_LOCK(?, 0)", len(keys)), names...).Scan(dest...); err != nil {
		return nil, err
	}
	out := make([]bool, len(keys))
	for i, g := range got {
		if !g.Valid {
			return nil, fmt.Errorf("sqlxbroker: mysql: GET_LOCK for key %q returned NULL", keys[i])
		}
		out[i] = g.Int64 == 1
	}
	return out, nil
}

// tryFirstAdvisoryLocks tries the lock names of a JSON array in order
// until %d are taken, and returns the positions (from 1) of those it took:
// JSON_TABLE reads the array in order and the LIMIT ends the scan, so the
// names after the last one wanted are never tried. GET_LOCK's NULL (an
// error) takes nothing.
const tryFirstAdvisoryLocks = "SELECT j.i FROM JSON_TABLE(?, '$[*]' COLUMNS(i FOR ORDINALITY, n VARCHAR(64) PATH '$')) AS j WHERE GET_LOCK(j.n, 0) = 1 LIMIT %d"

// TryFirstAdvisoryLocks tries p.Keys in order until want are locked, in
// one statement. Names outside printable ASCII (a database name that is),
// which a JSON array would carry as text in the column's character set,
// and servers without JSON_TABLE (known per pool after the first statement
// it refuses), are tried as many at a time as are still wanted
// (TryAdvisoryLocks), so no key after the want-th locked is tried either.
func (d Dialect) TryFirstAdvisoryLocks(ctx context.Context, p *core.AdvisoryParams, want int) ([]int, error) {
	var noTable *atomic.Bool // the server has no JSON_TABLE (kept per pool)
	if p.Pool != nil {
		noTable, _ = core.Keep(p.Pool, noJSONTableKey{}, func() (*atomic.Bool, error) { return new(atomic.Bool), nil })
	}
	if noTable != nil && noTable.Load() {
		return d.tryInWaves(ctx, p, want)
	}
	names, err := lockNames(ctx, p)
	if err != nil {
		return nil, err
	}
	text := make([]string, len(names))
	for i, n := range names {
		switch v := n.(type) {
		case []byte:
			text[i] = string(v)
		case string:
			text[i] = v
		}
		if !printable(text[i]) {
			return d.tryInWaves(ctx, p, want)
		}
	}
	js, err := json.Marshal(text)
	if err != nil {
		return nil, err
	}
	rows, err := p.Conn.QueryContext(ctx, fmt.Sprintf(tryFirstAdvisoryLocks, want), string(js))
	var me *driver.MySQLError
	if errors.As(err, &me) && me.Number == errParse {
		if noTable != nil {
			noTable.Store(true)
		}
		return d.tryInWaves(ctx, p, want)
	}
	if err != nil {
		return nil, err
	}
	return core.FirstPositions(rows)
}

// noJSONTableKey keeps whether a pool's server lacks JSON_TABLE (core.Keep).
type noJSONTableKey struct{}

// tryInWaves is TryFirstAdvisoryLocks in statements of as many keys as
// are still wanted: a wave never takes more than that, so no key after the
// want-th locked is tried.
func (d Dialect) tryInWaves(ctx context.Context, p *core.AdvisoryParams, want int) ([]int, error) {
	var out []int
	for i := 0; i < len(p.Keys) && len(out) < want; {
		n := min(want-len(out), len(p.Keys)-i)
		ok, err := d.TryAdvisoryLocks(ctx, &core.AdvisoryParams{Pool: p.Pool, Conn: p.Conn, Keys: p.Keys[i : i+n]})
		if err != nil {
			return nil, err
		}
		for j, b := range ok {
			if b {
				out = append(out, i+j)
			}
		}
		i += n
	}
	return out, nil
}

// AdvisoryUnlocks releases keys in one statement; RELEASE_LOCK answers 0
// or NULL for a key not held, which is no error. No keys: no statement.
func (Dialect) AdvisoryUnlocks(ctx context.Context, p *core.AdvisoryParams) error {
	if len(p.Keys) == 0 {
		return nil
	}
	names, err := lockNames(ctx, p)
	if err != nil {
		return err
	}
	released := make([]any, len(names))
	for i := range released {
		released[i] = new(sql.NullInt64)
	}
	return p.Conn.QueryRowxContext(ctx, perKey("RELEASE_LOCK(?)", len(names)), names...).Scan(released...)
}

// perKey selects expr n (at least 1) times.
func perKey(expr string, n int) string {
	return "SELECT " + expr + strings.Repeat(", "+expr, n-1)
}

// printable reports whether s is printable ASCII, which GET_LOCK keeps as is.
func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// ---- FIFO guard ----

const (
	// guardRead lists the group's unfinished rows, and whether each holds
	// a live lease (%[5]s), as committed.
	guardRead = "SELECT %[1]s, %[5]s FROM %[2]s WHERE %[3]s = ? AND %[4]s"
	// guardLock locks the group's unfinished rows that no one else holds.
	guardLock = "SELECT %[1]s FROM %[2]s WHERE %[3]s = ? AND %[4]s FOR UPDATE SKIP LOCKED"
)

// GuardGroup locks every unfinished row of the group for the rest of tx and
// reports whether it got them all: false when another transaction holds one
// (a row-lock delivery, a claim in progress) or a row holds a live lease.
// Rows committed between the two reads make it false too, to be tried again
// at the next claim. SKIP LOCKED rather than NOWAIT: it never fails, so the
// transaction and the guards it took before stay intact whatever
// innodb_rollback_on_timeout says.
func (Dialect) GuardGroup(ctx context.Context, tx *sqlx.Tx, p *core.GroupGuardParams) (bool, error) {
	pl := p.Plan
	unfinished := pl.Unfinished("")
	leased, args := "0", []any{p.Group}
	if pl.QLockedUntil != "" {
		held, hargs := pl.LeaseHeld("", core.Now())
		leased = "COALESCE(" + held + ", 0)"
		args = append(hargs, p.Group)
	}
	rows, err := tx.QueryxContext(ctx, fmt.Sprintf(guardRead, pl.QID, pl.QTable, pl.QGroup, unfinished, leased), args...)
	if err != nil {
		return false, err
	}
	var seen []string
	ok := true
	for rows.Next() {
		var id any
		var live bool
		if err := rows.Scan(&id, &live); err != nil {
			rows.Close()
			return false, err
		}
		ok = ok && !live
		seen = append(seen, keyOf(id))
	}
	if err := rows.Err(); err != nil || !ok {
		return false, err
	}
	var locked []any
	if err := tx.SelectContext(ctx, &locked, fmt.Sprintf(guardLock, pl.QID, pl.QTable, pl.QGroup, unfinished), p.Group); err != nil {
		return false, err
	}
	mine := make(map[string]bool, len(locked))
	for _, id := range locked {
		mine[keyOf(id)] = true
	}
	for _, id := range seen {
		if !mine[id] {
			return false, nil
		}
	}
	return true, nil
}

// keyOf makes ids read as []byte (text protocol) and as int64 comparable.
func keyOf(v any) string {
	if b, ok := v.([]byte); ok {
		return string(b)
	}
	return fmt.Sprint(v)
}

// ---- duplicate skipping ----

// uniqueIndex counts the unique indexes of the table that are col alone.
const uniqueIndex = `SELECT COUNT(*) FROM (SELECT INDEX_NAME FROM information_schema.STATISTICS
WHERE TABLE_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME = ? AND NON_UNIQUE = 0
GROUP BY INDEX_NAME HAVING COUNT(*) = 1 AND MAX(COLUMN_NAME) = ?) AS u`

// SkipDuplicates appends ON DUPLICATE KEY UPDATE col = col: a duplicate
// row (on any unique key) leaves the row there as it is and counts 0 in
// the affected rows, an inserted row 1. Unlike INSERT IGNORE it keeps
// every other error an error. ON DUPLICATE KEY would insert duplicates of
// a column without a unique key, so it fails unless col has a unique index
// of its own (information_schema.STATISTICS, on the broker's pool), and it
// fails when the pool's sessions count found rows (clientFoundRows=true),
// which would count each duplicate as inserted.
func (d Dialect) SkipDuplicates(ctx context.Context, p *core.SkipDuplicatesParams) (*core.InsertSQL, error) {
	pl := p.Plan
	var schema any
	name := pl.Table
	if s, n, ok := strings.Cut(name, "."); ok {
		schema, name = s, n
	}
	var n int
	if err := p.Pool.DB.QueryRowxContext(ctx, uniqueIndex, schema, name, p.Column).Scan(&n); err != nil {
		return nil, fmt.Errorf("sqlxbroker: mysql: read the unique indexes of %s: %w", pl.Table, err)
	}
	if n == 0 {
		return nil, &sqlxbroker.TableError{Table: pl.Table, Field: "SkipDuplicates",
			Reason: fmt.Sprintf("column %q has no unique index of its own, so ON DUPLICATE KEY cannot find its duplicates (CREATE UNIQUE INDEX .. ON %s (%s))", p.Column, pl.Table, p.Column)}
	}
	found, err := foundRowsOf(ctx, p.Pool)
	if err != nil {
		return nil, err
	}
	if found {
		return nil, fmt.Errorf("sqlxbroker: mysql: the pool's sessions report found rows (clientFoundRows=true in the DSN), so a skipped duplicate would count as inserted: remove clientFoundRows=true to skip duplicates")
	}
	q := d.QuoteIdent(p.Column)
	return &core.InsertSQL{Suffix: "ON DUPLICATE KEY UPDATE " + q + " = " + q}, nil
}

// foundRowsKey keeps a pool's foundRows (core.Keep).
type foundRowsKey struct{}

// foundRows is whether a pool's sessions count found rather than changed
// rows, once learnt.
type foundRows struct {
	mu        sync.Mutex
	known, on bool
}

// foundRowsOf tells whether pool's sessions count found rows: on one
// session, a temporary table gets a row and its duplicate in one INSERT ..
// ON DUPLICATE KEY UPDATE, which affects 1 row by default and 2 with
// CLIENT_FOUND_ROWS. A session that cannot make temporary tables (no
// CREATE TEMPORARY TABLES privilege) is taken to count changed rows, the
// driver's default. The answer is kept for the pool.
func foundRowsOf(ctx context.Context, pool *core.Pool) (bool, error) {
	fr, err := core.Keep(pool, foundRowsKey{}, func() (*foundRows, error) { return &foundRows{}, nil })
	if err != nil {
		return false, err
	}
	fr.mu.Lock()
	defer fr.mu.Unlock()
	if fr.known {
		return fr.on, nil
	}
	conn, err := pool.DB.Connx(ctx)
	if err != nil {
		return false, fmt.Errorf("sqlxbroker: mysql: check clientFoundRows: %w", err)
	}
	defer conn.Close()
	fr.known = true
	if _, err := conn.ExecContext(ctx, "CREATE TEMPORARY TABLE sqlxbroker_found_rows (k INT PRIMARY KEY)"); err != nil {
		return false, nil
	}
	defer conn.ExecContext(context.WithoutCancel(ctx), "DROP TEMPORARY TABLE sqlxbroker_found_rows")
	res, err := conn.ExecContext(ctx, "INSERT INTO sqlxbroker_found_rows (k) VALUES (1), (1) ON DUPLICATE KEY UPDATE k = k")
	if err != nil {
		return false, nil
	}
	if n, err := res.RowsAffected(); err == nil {
		fr.on = n != 1
	}
	return fr.on, nil
}

// ---- DDL ----

var (
	types = map[string]string{"text": "TEXT", "bigint": "BIGINT", "int": "INT", "bool": "BOOLEAN", "timestamp": "DATETIME(6)", "bytes": "BLOB"}
	// indexed are the types of columns used in an index or as a key.
	indexed = map[string]string{"text": "VARCHAR(255)", "bytes": "VARBINARY(255)"}
)

// pastLease is the lease column's default: a time long past, which every
// claim reads as no lease held, as it reads NULL. InnoDB updates a record
// in place only when no field changes its length: a row published NULL
// grows at its first claim (the record is deleted and inserted again on
// its page, a longer hold of the page that the claims of other processes
// wait for), where one published with a time keeps its length. Draining
// with 1,000 handlers, MariaDB 10.11 was 27-35% faster, four processes of
// 250 on one table 31-55% (docs/performance.md, "A lease column published
// with a time").
const pastLease = "'1970-01-01 00:00:00'"

// CreateTable returns one CREATE TABLE with the recommended columns and
// indexes: BIGINT AUTO_INCREMENT id, attempt INT NOT NULL DEFAULT 1,
// DATETIME(6) timestamps (the lease column with a default of long ago:
// pastLease), VARCHAR(255) group and key columns, an index on
// a custom order column, (group, order) for FIFO, and, for the
// operations' counts when the description has DeadAt or DoneAt, the
// column sqlxbroker_state (StateMarks) with the index sqlxbroker_counts
// on (sqlxbroker_state, ReadyAt), ReadyAt where named.
// The column is INVISIBLE (MariaDB 10.3+, MySQL 8.0.23+): SELECT * and
// an INSERT without a column list leave it out. Text compares byte-wise
// (utf8mb4_bin), as groups and keys do in Go.
func (d Dialect) CreateTable(p *core.DDLParams) ([]string, error) {
	pl := p.Plan
	special := map[string]string{} // lower-cased name: why it is indexed
	for _, c := range pl.OrderColumns() {
		special[strings.ToLower(c)] = "order"
	}
	if pl.Group != "" {
		special[strings.ToLower(pl.Group)] = "group"
	}
	if pl.Key != nil {
		for _, c := range pl.Key.Columns() {
			special[strings.ToLower(c)] = "key"
		}
	}
	cols := []string{pl.QID + " BIGINT AUTO_INCREMENT PRIMARY KEY", pl.QAttempt + " INT NOT NULL DEFAULT 1"}
	seen := map[string]bool{strings.ToLower(pl.ID): true, strings.ToLower(pl.Attempt): true}
	add := func(name, typ string) {
		if l := strings.ToLower(name); !seen[l] {
			seen[l] = true
			if special[l] == "order" {
				typ += " NOT NULL"
			}
			cols = append(cols, d.QuoteIdent(name)+" "+typ)
		}
	}
	for _, c := range p.Payload {
		typ, ok := types[c[1]]
		if !ok {
			return nil, fmt.Errorf("sqlxbroker: mysql: payload column %s: unknown type %q", c[0], c[1])
		}
		if ix, ok := indexed[c[1]]; ok && special[strings.ToLower(c[0])] != "" {
			typ = ix
		}
		add(c[0], typ)
	}
	for _, c := range pl.TimeColumns() {
		if c == pl.LockedUntil {
			add(c, "DATETIME(6) NULL DEFAULT "+pastLease)
			continue
		}
		add(c, "DATETIME(6) NULL")
	}
	if pl.LastError != "" {
		add(pl.LastError, "TEXT NULL")
	}
	if pl.Metadata != "" {
		add(pl.Metadata, "TEXT NULL")
	}
	for _, c := range pl.OrderColumns() {
		add(c, "BIGINT")
	}
	if pl.Group != "" {
		add(pl.Group, "VARCHAR(255) NULL")
	}
	if pl.Key != nil {
		for _, c := range pl.Key.Columns() {
			add(c, "VARCHAR(255) NULL")
		}
	}
	if !pl.OrderIsID() {
		cols = append(cols, "INDEX `sqlxbroker_order` ("+pl.OrderBy("")+")")
	}
	if pl.Group != "" {
		cols = append(cols, "INDEX `sqlxbroker_fifo` ("+pl.QGroup+", "+pl.OrderBy("")+")")
	}
	// No index on the state columns themselves. MariaDB has no partial
	// indexes, and an index on (DeadAt, DoneAt) becomes the claims' plan
	// for unfinished rows: a row-lock claim that reads a held row through
	// it and skips it keeps its lock on the secondary entry, so the
	// holder's completion (which deletes or changes that entry) waits on
	// another open claim until innodb_lock_wait_timeout (the conformance
	// suite's HostileKeys shows it). The counts' index is on a column of
	// its own, derived from them, that no claim statement names.
	if expr := stateExpr(d, pl); expr != "" {
		if seen[stateColumn] {
			return nil, fmt.Errorf("sqlxbroker: mysql: column %s: the name is the counts' own column (sqlxbroker_state)", stateColumn)
		}
		cols = append(cols, d.QuoteIdent(stateColumn)+" TINYINT AS ("+expr+") STORED INVISIBLE")
		// The lease column stays out: claims, renewals and releases would
		// each move an entry (a lease drain ran at half the rate).
		parts := []string{d.QuoteIdent(stateColumn)}
		if pl.QReadyAt != "" {
			parts = append(parts, pl.QReadyAt)
		}
		cols = append(cols, "INDEX "+d.QuoteIdent(countsIndex)+" ("+strings.Join(parts, ", ")+")")
	}
	return []string{"CREATE TABLE IF NOT EXISTS " + pl.QTable + " (\n  " + strings.Join(cols, ",\n  ") +
		"\n) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin"}, nil
}

// ---- counts ----

const (
	// stateColumn is the generated column that says a row's class for
	// the counts: 0 unfinished, 1 done, 2 dead.
	stateColumn = "sqlxbroker_state"
	// countsIndex is the index on (stateColumn, ReadyAt).
	countsIndex = "sqlxbroker_counts"
)

// stateExpr is stateColumn's expression for p's table; "" without DeadAt
// and DoneAt (every row is then unfinished).
func stateExpr(d Dialect, p *core.Plan) string {
	if p.QDeadAt == "" && p.QDoneAt == "" {
		return ""
	}
	e := "CASE"
	if p.QDeadAt != "" {
		e += " WHEN " + p.QDeadAt + " IS NOT NULL THEN 2"
	}
	if p.QDoneAt != "" {
		e += " WHEN " + p.QDoneAt + " IS NOT NULL THEN 1"
	}
	return e + " ELSE 0 END"
}

// normalExpr is a generation expression as compared: lower case, without
// quotes, parentheses and spaces (MariaDB and MySQL print one each their
// own way).
func normalExpr(e string) string {
	return strings.Map(func(r rune) rune {
		switch r {
		case '`', '(', ')', ' ', '\t', '\n', '\r':
			return -1
		}
		return r
	}, strings.ToLower(e))
}

// StateMarks returns the conditions on the table's sqlxbroker_state column
// when it has one whose expression is CreateTable's for p (read from
// information_schema.COLUMNS on each call, so a column added or dropped
// later is seen); nil otherwise, and the counts use the state columns.
func (d Dialect) StateMarks(ctx context.Context, pool *core.Pool, p *core.Plan) (*core.StateMarks, error) {
	want := stateExpr(d, p)
	if want == "" {
		return nil, nil
	}
	schema, table, found := strings.Cut(p.Table, ".")
	if !found {
		schema, table = "", schema
	}
	var expr sql.NullString
	err := pool.DB.QueryRowContext(ctx, "SELECT GENERATION_EXPRESSION FROM information_schema.COLUMNS"+
		" WHERE TABLE_SCHEMA = COALESCE(NULLIF(?, ''), DATABASE()) AND TABLE_NAME = ? AND COLUMN_NAME = ?",
		schema, table, stateColumn).Scan(&expr)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("sqlxbroker: mysql: read the %s column of %s: %w", stateColumn, p.Table, err)
	case normalExpr(expr.String) != normalExpr(want):
		return nil, nil // not the library's column, or for other columns
	}
	c := p.Alias + "." + d.QuoteIdent(stateColumn)
	m := &core.StateMarks{Unfinished: c + " = 0"}
	if p.QDeadAt != "" {
		m.Dead = c + " = 2"
	}
	if p.QDoneAt != "" {
		m.Done = c + " = 1"
	}
	return m, nil
}
