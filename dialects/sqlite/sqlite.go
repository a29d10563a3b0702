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
//   - FIFO: no guard is needed, SQLite runs one writer at a time.
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
	core.LeaseFencer
	core.AdvisoryLocker
	core.AdvisoryAttacher
	core.ServerChecker
	core.TableCreator
} = Dialect{}

func (Dialect) Name() string { return "SQLite" }

func (Dialect) QuoteIdent(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

func (Dialect) BindType() int { return sqlx.QUESTION }

// timeLayout is fixed-width, so text comparison is time order.
const timeLayout = "2006-01-02 15:04:05.000000"

// EncodeTime stores times as fixed-width UTC text.
func (Dialect) EncodeTime(t time.Time) any { return t.UTC().Format(timeLayout) }

// Features: RETURNING, one writer, and at most 1,000 arguments a statement
// (the driver matches each argument to its place by a scan of them all).
func (Dialect) Features() core.Features {
	return core.Features{DeleteReturning: true, UpdateReturning: true, SingleWriter: true, MaxParams: 1000}
}

// CheckServer requires a busy timeout: without one, claims from several
// connections fail at once with SQLITE_BUSY instead of waiting their turn.
func (Dialect) CheckServer(ctx context.Context, db *sqlx.DB, form core.Form) error {
	var ms int
	if err := db.QueryRowContext(ctx, "PRAGMA busy_timeout").Scan(&ms); err != nil {
		return fmt.Errorf("sqlxbroker: sqlite: read busy_timeout: %w", err)
	}
	if ms <= 0 {
		return fmt.Errorf("sqlxbroker: sqlite: busy_timeout is 0, so concurrent claims fail with SQLITE_BUSY: open the database with sqlite.DSN(path) or add _pragma=busy_timeout(10000) to the DSN")
	}
	return nil
}

const claimLeases = `UPDATE %[1]s SET %[2]s = ?, %[3]s = %[9]s
WHERE %[4]s IN (SELECT %[5]s.%[4]s FROM %[1]s %[5]s WHERE %[6]s ORDER BY %[7]s LIMIT %[8]d)
RETURNING *`

// ClaimLeases claims with one UPDATE .. RETURNING.
func (Dialect) ClaimLeases(ctx context.Context, on core.Querier, p *core.LeaseClaimParams) (*sqlx.Rows, error) {
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

// keys are the advisory keys held in this process, per database file.
var keys = struct {
	sync.Mutex
	held     map[string]map[string]bool // file -> key
	attached map[string]*fileLock       // file -> lock and reference count
}{held: map[string]map[string]bool{}, attached: map[string]*fileLock{}}

// fileOf names the database file of conn's main schema ("" in memory).
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

// TryAdvisoryLock takes key in the process-wide table of the database file.
func (Dialect) TryAdvisoryLock(ctx context.Context, conn *sqlx.Conn, key string) (bool, error) {
	file, err := fileOf(ctx, conn)
	if err != nil {
		return false, err
	}
	keys.Lock()
	defer keys.Unlock()
	if keys.held[file] == nil {
		keys.held[file] = map[string]bool{}
	}
	if keys.held[file][key] {
		return false, nil
	}
	keys.held[file][key] = true
	return true, nil
}

// AdvisoryUnlock releases key. It does so even when ctx has ended (a
// completion out of time): the key lives in this process, not in the
// connection's session, and would otherwise stay held for good.
func (Dialect) AdvisoryUnlock(ctx context.Context, conn *sqlx.Conn, key string) error {
	file, err := fileOf(context.WithoutCancel(ctx), conn)
	if err != nil {
		return err
	}
	keys.Lock()
	delete(keys.held[file], key)
	keys.Unlock()
	return nil
}

// AttachAdvisory takes the OS lock that keeps a second process off the
// database file's keys; subscriptions of one process share it.
func (Dialect) AttachAdvisory(ctx context.Context, db *sqlx.DB) (func() error, error) {
	file, err := fileOf(ctx, db)
	if err != nil {
		return nil, err
	}
	if file == "" {
		return func() error { return nil }, nil // in memory: no other process sees it
	}
	keys.Lock()
	defer keys.Unlock()
	fl := keys.attached[file]
	if fl == nil {
		fl, err = lockFile(file + "-sqlxbroker.lock")
		if err != nil {
			return nil, fmt.Errorf("%w: sqlite database %s: advisory keys live in one process per file, and another process holds %s-sqlxbroker.lock (%v); run advisory subscriptions of this file in one process", core.ErrAdvisoryConflict, file, file, err)
		}
		keys.attached[file] = fl
	}
	fl.refs++
	var once sync.Once
	return func() error {
		var err error
		once.Do(func() {
			keys.Lock()
			defer keys.Unlock()
			if fl.refs--; fl.refs == 0 {
				delete(keys.attached, file)
				err = fl.unlock()
			}
		})
		return err
	}, nil
}

// CreateTable returns the recommended table and indexes.
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
	if !strings.EqualFold(pl.Order, pl.ID) {
		add(pl.Order, "INTEGER")
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
		stmts = append(stmts, "CREATE INDEX IF NOT EXISTS "+d.QuoteIdent(name+"_fifo")+" ON "+pl.QTable+" ("+pl.QGroup+", "+pl.QOrder+") WHERE "+where)
	}
	if !strings.EqualFold(pl.Order, pl.ID) {
		stmts = append(stmts, "CREATE INDEX IF NOT EXISTS "+d.QuoteIdent(name+"_order")+" ON "+pl.QTable+" ("+pl.QOrder+") WHERE "+where)
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
