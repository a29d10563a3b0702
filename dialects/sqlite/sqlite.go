// Package sqlite is the SQLite dialect of sqlxbroker, on
// github.com/glebarez/go-sqlite (driver name "sqlite", pure Go). Import it
// for its side effect:
//
//	import _ "github.com/sqlxbroker/sqlxbroker/dialects/sqlite"
//
// What SQLite offers:
//
//   - row lock: unavailable (SQLite has no row locks); a row-lock table fails
//     with core.ErrFormUnavailable;
//   - lease: one UPDATE .. RETURNING claims a batch (no order among the
//     returned rows);
//   - advisory lock: keys are held in the process, shared by every broker of
//     the process on the same database file. A second process cannot see
//     them, so an advisory subscription takes an exclusive OS file lock
//     beside the database ("<file>-sqlxbroker.lock") and a second process
//     is refused with core.ErrAdvisoryConflict;
//   - FIFO: no guard is needed, SQLite runs one writer at a time;
//   - duplicate skipping (PublishParams.SkipDuplicates): INSERT ..
//     ON CONFLICT (col) DO NOTHING; SQLite refuses a column without a
//     unique index or constraint of its own.
//
// Open the database with DSN, which sets a busy timeout (required: claims
// from several connections wait for the one writer), WAL journaling and
// immediate transactions.
package sqlite

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"time"

	_ "github.com/glebarez/go-sqlite" // the "sqlite" database/sql driver
	"github.com/jmoiron/sqlx"
	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/core"
)

func init() { sqlxbroker.Register("sqlite", Dialect{}) }

// DSN returns the recommended DSN for a database file: a 10 s busy timeout,
// WAL journaling, synchronous=NORMAL and immediate transactions.
func DSN(path string) string {
	return "file:" + path + "?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)&_txlock=immediate"
}

// Dialect is the SQLite dialect.
type Dialect struct{}

var _ interface {
	core.Dialect
	core.Leaser
	core.AdvisoryLocker
	core.GroupGuard
	core.Starter
	core.TableCreator
	core.DuplicateSkipper
} = Dialect{}

func (Dialect) Name() string { return "SQLite" }

func (Dialect) QuoteIdent(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

func (Dialect) BindType() int { return sqlx.QUESTION }

// timeLayout is fixed-width, so text comparison is time order.
const timeLayout = "2006-01-02 15:04:05.000000"

// EncodeTime stores times as fixed-width UTC text.
func (Dialect) EncodeTime(t time.Time) any { return t.UTC().Format(timeLayout) }

// Features: RETURNING, and at most 1,000 arguments a statement (the
// driver matches each argument to its place by a scan of them all).
func (Dialect) Features() core.Features {
	return core.Features{DeleteReturning: true, UpdateReturning: true, MaxParams: 1000}
}

// Start requires a busy timeout: without one, claims from several
// connections fail at once with SQLITE_BUSY instead of waiting their turn.
// An advisory subscription takes the file lock that keeps a second process
// off the database's in-process keys (core.ErrAdvisoryConflict), given back
// when it stops.
func (Dialect) Start(ctx context.Context, pool *core.Pool, p *core.Plan) (func() error, error) {
	var ms int
	if err := pool.DB.QueryRowContext(ctx, "PRAGMA busy_timeout").Scan(&ms); err != nil {
		return nil, fmt.Errorf("sqlxbroker: sqlite: read busy_timeout: %w", err)
	}
	if ms <= 0 {
		return nil, fmt.Errorf("sqlxbroker: sqlite: busy_timeout is 0, so concurrent claims fail with SQLITE_BUSY: open the database with sqlite.DSN(path) or add _pragma=busy_timeout(10000) to the DSN")
	}
	if p.Form != core.Advisory {
		return nil, nil
	}
	fk, err := keysOf(ctx, pool)
	if err != nil {
		return nil, err
	}
	return fk.attach()
}

// GuardGroup: SQLite runs one writer at a time, so the claim that sees a
// group's head is the only one that can take it.
func (Dialect) GuardGroup(context.Context, *sqlx.Tx, *core.GroupGuardParams) (bool, error) {
	return true, nil
}

// LockWaitLimit: SQLite has no row locks to wait for.
func (Dialect) LockWaitLimit(time.Duration) (string, string) { return "", "" }

const claimLeases = `UPDATE %[1]s SET %[2]s = ?, %[3]s = %[9]s
WHERE %[4]s IN (SELECT %[5]s.%[4]s FROM %[1]s %[5]s WHERE %[6]s ORDER BY %[7]s LIMIT %[8]d)
RETURNING *`

// ClaimLeases claims with one UPDATE .. RETURNING.
func (Dialect) ClaimLeases(ctx context.Context, on sqlx.ExtContext, p *core.LeaseClaimParams) (*sqlx.Rows, error) {
	pl := p.Plan
	q := fmt.Sprintf(claimLeases, pl.QTable, pl.QLockedUntil, pl.QAttempt, pl.QID, pl.Alias, p.Where, pl.OrderBy(pl.Alias), p.Limit, pl.NextAttempt(""))
	return on.QueryxContext(ctx, q, append([]any{p.Deadline}, p.Args...)...)
}

// FenceLeases matches a batch of leased rows with one JSON argument of
// [id, token] pairs: the statement stays small, however large the batch,
// so parsing it costs nothing next to the rows (a list of OR'ed pairs
// costs more to parse than to run), and the primary key finds each row.
func (Dialect) FenceLeases(p *core.Plan, ids, tokens []any) (string, []any) {
	pairs := make([][2]any, len(ids))
	for i, id := range ids {
		if b, ok := id.([]byte); ok {
			id = string(b)
		}
		pairs[i] = [2]any{id, tokens[i]}
	}
	js, _ := json.Marshal(pairs) // ids and tokens are numbers and strings
	return "(" + p.QID + ", " + p.QLockedUntil + ") IN (SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]') FROM json_each(?))", []any{string(js)}
}

// files are the advisory keys of each database file in this process,
// shared by every pool on the file (two brokers of one process see each
// other's keys) and dropped when the last pool that kept them closes.
var files = struct {
	sync.Mutex
	m map[string]*fileKeys
}{m: map[string]*fileKeys{}}

// fileKeys are one file's keys. files' mutex guards them.
type fileKeys struct {
	file     string
	held     map[string]bool
	pools    int       // pools that keep these keys (poolKeys)
	lock     *fileLock // the OS lock, while advisory subscriptions run
	attached int       // advisory subscriptions holding lock
}

// forget drops fk from files when nothing uses it; files is locked.
func (fk *fileKeys) forget() {
	if fk.pools == 0 && fk.attached == 0 {
		delete(files.m, fk.file)
	}
}

// attach takes the OS lock that keeps a second process off the file's
// keys; advisory subscriptions of one process share it.
func (fk *fileKeys) attach() (func() error, error) {
	if fk.file == "" {
		return nil, nil // in memory: no other process sees it
	}
	files.Lock()
	defer files.Unlock()
	if fk.lock == nil {
		fl, err := lockFile(fk.file + "-sqlxbroker.lock")
		if err != nil {
			return nil, fmt.Errorf("%w: sqlite database %s: advisory keys live in one process per file, and another process holds %s-sqlxbroker.lock (%v); run advisory subscriptions of this file in one process", core.ErrAdvisoryConflict, fk.file, fk.file, err)
		}
		fk.lock = fl
	}
	fk.attached++
	var once sync.Once
	return func() error {
		var err error
		once.Do(func() {
			files.Lock()
			defer files.Unlock()
			if fk.attached--; fk.attached == 0 {
				err = fk.lock.unlock()
				fk.lock = nil
				fk.forget()
			}
		})
		return err
	}, nil
}

// keysKey keeps a pool's poolKeys (core.Keep).
type keysKey struct{}

// poolKeys is a pool's hold on its file's keys, released when the pool
// closes.
type poolKeys struct {
	fk   *fileKeys
	once sync.Once
}

func (pk *poolKeys) Close() error {
	pk.once.Do(func() {
		files.Lock()
		defer files.Unlock()
		pk.fk.pools--
		pk.fk.forget()
	})
	return nil
}

// keysOf returns the keys of pool's database file.
func keysOf(ctx context.Context, pool *core.Pool) (*fileKeys, error) {
	pk, err := core.Keep(pool, keysKey{}, func() (*poolKeys, error) {
		file, err := fileOf(ctx, pool.DB)
		if err != nil {
			return nil, err
		}
		files.Lock()
		defer files.Unlock()
		fk := files.m[file]
		if fk == nil {
			fk = &fileKeys{file: file, held: map[string]bool{}}
			files.m[file] = fk
		}
		fk.pools++
		return &poolKeys{fk: fk}, nil
	})
	if err != nil {
		return nil, err
	}
	return pk.fk, nil
}

// fileOf names the database file of the main schema ("" in memory).
func fileOf(ctx context.Context, q sqlx.QueryerContext) (string, error) {
	var file string
	if err := q.QueryRowxContext(ctx, "SELECT file FROM pragma_database_list WHERE name = 'main'").Scan(&file); err != nil {
		return "", fmt.Errorf("sqlxbroker: sqlite: read database file: %w", err)
	}
	if file != "" {
		if abs, err := filepath.Abs(file); err == nil {
			file = abs
		}
	}
	return file, nil
}

// TryAdvisoryLocks takes keys in the process-wide table of the database
// file.
func (Dialect) TryAdvisoryLocks(ctx context.Context, p *core.AdvisoryParams) ([]bool, error) {
	fk, err := keysOf(ctx, p.Pool)
	if err != nil {
		return nil, err
	}
	files.Lock()
	defer files.Unlock()
	out := make([]bool, len(p.Keys))
	for i, k := range p.Keys {
		if !fk.held[k] {
			fk.held[k], out[i] = true, true
		}
	}
	return out, nil
}

// AdvisoryUnlocks releases keys. It does so even when ctx has ended (a
// completion out of time): the keys live in this process, not in the
// connection's session, and would otherwise stay held for good.
func (Dialect) AdvisoryUnlocks(ctx context.Context, p *core.AdvisoryParams) error {
	fk, err := keysOf(context.WithoutCancel(ctx), p.Pool)
	if err != nil {
		return err
	}
	files.Lock()
	defer files.Unlock()
	for _, k := range p.Keys {
		delete(fk.held, k)
	}
	return nil
}

// SkipDuplicates appends ON CONFLICT (col) DO NOTHING (SQLite 3.24+): a
// row whose col is in the table, or in an earlier row of the statement, is
// skipped and not counted in RowsAffected. SQLite checks that col has a
// unique index or constraint of its own ("ON CONFLICT clause does not
// match any PRIMARY KEY or UNIQUE constraint").
func (d Dialect) SkipDuplicates(_ context.Context, p *core.SkipDuplicatesParams) (*core.InsertSQL, error) {
	return &core.InsertSQL{Suffix: "ON CONFLICT (" + d.QuoteIdent(p.Column) + ") DO NOTHING"}, nil
}

// CreateTable returns the recommended table and indexes: partial indexes
// on the claim order and FIFO groups over unfinished rows, and for the
// operations' counts on ReadyAt over unfinished rows, DeadAt over dead rows
// and DoneAt over done rows (each where the column is described).
func (d Dialect) CreateTable(p *core.DDLParams) ([]string, error) {
	pl := p.Plan
	types := map[string]string{"text": "TEXT", "bigint": "INTEGER", "int": "INTEGER", "bool": "INTEGER", "timestamp": "TEXT", "bytes": "BLOB"}
	cols := []string{pl.QID + " INTEGER PRIMARY KEY", pl.QAttempt + " INTEGER NOT NULL DEFAULT 1"}
	seen := map[string]bool{strings.ToLower(pl.ID): true, strings.ToLower(pl.Attempt): true}
	add := func(name, typ string) {
		if !seen[strings.ToLower(name)] {
			seen[strings.ToLower(name)] = true
			cols = append(cols, d.QuoteIdent(name)+" "+typ)
		}
	}
	for _, c := range p.Payload {
		typ, ok := types[c[1]]
		if !ok {
			return nil, fmt.Errorf("sqlxbroker: sqlite: payload column %s: unknown type %q", c[0], c[1])
		}
		add(c[0], typ)
	}
	for _, c := range pl.TimeColumns() {
		add(c, "TEXT")
	}
	if pl.LastError != "" {
		add(pl.LastError, "TEXT")
	}
	if pl.Metadata != "" {
		add(pl.Metadata, "TEXT")
	}
	for _, c := range pl.OrderColumns() {
		add(c, "INTEGER NOT NULL")
	}
	if pl.Group != "" {
		add(pl.Group, "TEXT")
	}
	if pl.Key != nil {
		for _, c := range pl.Key.Columns() {
			add(c, "TEXT")
		}
	}
	name := strings.ReplaceAll(pl.Table, ".", "_")
	stmts := []string{"CREATE TABLE IF NOT EXISTS " + pl.QTable + " (\n  " + strings.Join(cols, ",\n  ") + "\n)"}
	where := pl.Unfinished("")
	if pl.Group != "" {
		stmts = append(stmts, "CREATE INDEX IF NOT EXISTS "+d.QuoteIdent(name+"_fifo")+" ON "+pl.QTable+" ("+pl.QGroup+", "+pl.OrderBy("")+") WHERE "+where)
	}
	if !pl.OrderIsID() {
		stmts = append(stmts, "CREATE INDEX IF NOT EXISTS "+d.QuoteIdent(name+"_order")+" ON "+pl.QTable+" ("+pl.OrderBy("")+") WHERE "+where)
	}
	// Broker.Counts, List and Prune: a partial index per state whose WHERE
	// is the state's condition's own terms (SQLite uses a partial index only
	// for a query whose WHERE holds them).
	if pl.ReadyAt != "" {
		unf := ""
		if where != "1=1" {
			unf = " WHERE " + where
		}
		stmts = append(stmts, "CREATE INDEX IF NOT EXISTS "+d.QuoteIdent(name+"_ready")+" ON "+pl.QTable+" ("+pl.QReadyAt+")"+unf)
	}
	if pl.DeadAt != "" {
		stmts = append(stmts, "CREATE INDEX IF NOT EXISTS "+d.QuoteIdent(name+"_dead")+" ON "+pl.QTable+" ("+pl.QDeadAt+") WHERE "+pl.QDeadAt+" IS NOT NULL")
	}
	if pl.DoneAt != "" {
		done := pl.QDoneAt + " IS NOT NULL"
		if pl.DeadAt != "" {
			done += " AND " + pl.QDeadAt + " IS NULL"
		}
		stmts = append(stmts, "CREATE INDEX IF NOT EXISTS "+d.QuoteIdent(name+"_done")+" ON "+pl.QTable+" ("+pl.QDoneAt+") WHERE "+done)
	}
	return stmts, nil
}

// Open opens path with DSN, keeping up to 64 idle connections (advisory
// deliveries each hold one).
func Open(path string) (*sqlx.DB, error) {
	db, err := sqlx.Open("sqlite", DSN(path))
	if err != nil {
		return nil, err
	}
	db.SetMaxIdleConns(64)
	return db, db.Ping()
}
