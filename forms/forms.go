// Package forms implements the three claim forms of sqlxbroker, each written
// once against the core.Dialect contract: row lock (rowlock.go), lease
// (lease.go) and advisory lock (advisory.go, its key session in
// keyholder.go). New picks the form a table description selects.
//
// Attempts are counted where each form holds the row: the row-lock
// form counts in the completion statement that returns a row for another
// try, the lease form at claim, the advisory form when it takes the row. A
// delivery reports the attempt as it stood before the claim, so the first
// delivery reads 1 in every form.
package forms

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/sqlxbroker/sqlxbroker/core"
)

// New returns the claim form p's table selects, bound to pool. The broker
// made p, so the dialect offers the form.
func New(pool *core.Pool, p *core.Plan) core.ClaimForm {
	b := base{pool: pool, db: pool.DB, plan: p, scan: &cursor{}}
	var f core.ClaimForm
	switch p.Form {
	case core.RowLock:
		f = newRowLock(b)
	case core.Lease:
		f = newLease(b)
	default:
		f = newAdvisory(b)
	}
	if p.OrderIsID() {
		return f
	}
	return &rescanning{ClaimForm: f, scan: b.scan}
}

// rescanning is a form whose table is ordered by more than its ID: a row
// published with a higher place in the order (a priority) sorts before
// the claim cursor, so each wake-up starts the next claim from the first
// row (core.Rescanner) rather than leaving the row to the next full scan.
type rescanning struct {
	core.ClaimForm
	scan *cursor
}

func (f *rescanning) Rescan()                { f.scan.rescanNext() }
func (f *rescanning) Unwrap() core.ClaimForm { return f.ClaimForm }

// base holds what every form shares.
type base struct {
	pool *core.Pool
	db   *sqlx.DB
	plan *core.Plan
	scan *cursor
}

// fullScanEvery is how often a busy form's claims scan the table from its
// first row rather than from the cursor (see cursor).
var fullScanEvery = 100 * time.Millisecond

// cursor keeps where the last claims found rows in the order column, so
// the next claims start there. A busy queue leaves the rows it just
// finished at the head of the order index (deleted or marked done, but not
// yet purged or vacuumed while newer transactions run) and the rows in
// work there too (locked or leased): a claim that started from the first
// row would step over all of them, every time, and a drain would spend most
// of the server's time doing so. A row that becomes claimable behind the
// cursor (a retry at once, a released claim, an expired lease, a row
// committed late with a lower order value) is found by the next full scan:
// one every fullScanEvery, and whenever a scan from the cursor finds
// nothing. At a low claim rate every claim is a full scan. In a table that
// keeps its finished rows, full scans start from a floor (readFloor).
type cursor struct {
	mu     sync.Mutex
	at     []any     // the order values of the last row claimed; nil: none
	full   time.Time // when the last full scan started
	rescan bool      // the next claim scans from the first row (rescanNext)
	wakes  rescanOf  // wake-ups told (rescanNext); never zero once one was

	floor   []any     // where full scans start (see readFloor); nil: the first row
	floorAt time.Time // when floor was read; zero: never
}

// floorEvery is how long a floor (see readFloor) serves full scans
// before it is read again.
var floorEvery = time.Second

// rescanOf tells a claim the rescan it makes (see from): zero for none,
// else the wake-ups told when it began, which it gives back to rescanned.
type rescanOf uint64

// from returns the condition and args that start a claim at the cursor
// (over alias), or "" for a full scan, which it then counts as started.
// retry asks for a full scan: the claim from the cursor found nothing.
// keep is not zero for a full scan made for a rescan (a wake-up of a table
// whose new rows may sort before the cursor): the rows it finds are mostly
// those just published, ahead of the rest in the order, so the claim
// reports its last row with rescanned instead of advance, which leaves
// the cursor where it is rather than moving it back before every row the
// cursor has passed.
//
// full reports a full scan: from the first row, or from the floor (see
// readFloor), with cond then its condition. A full scan may not pass over a
// claimable row it can lock (core.LeaseClaimParams.Cursor is false).
func (c *cursor) from(p *core.Plan, alias string, retry bool) (cond string, args []any, keep rescanOf, full bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	if retry {
		c.at = nil
	}
	if c.rescan && c.at != nil {
		// Every claim rescans until one finds nothing more before the
		// cursor (rescanned): claims run at once, and a burst of
		// publishes can stand behind one wake-up.
		return "", nil, c.wakes, true
	}
	if c.at == nil || now.Sub(c.full) >= fullScanEvery {
		c.full, c.rescan = now, false
		if c.floor != nil && now.Sub(c.floorAt) < floorEvery {
			cond, args = p.From(alias, c.floor, false)
			return " AND " + cond, args, 0, true
		}
		return "", nil, 0, true
	}
	cond, args = p.From(alias, c.at, false)
	return " AND " + cond, args, 0, false
}

// floors reports whether p's full scans may start from a floor: its rows
// are in ID order (a new row comes after the others, but for one
// committed late) and finished rows stay in the table (DoneAt or DeadAt),
// where an index over every row, as MariaDB's, holds them ahead of the
// unfinished ones.
func floors(p *core.Plan) bool {
	return p.OrderIsID() && p.QGroup == "" && (p.QDoneAt != "" || p.QDeadAt != "")
}

// refreshFloor reads the floor on q (readFloor) when p's table has one and
// the last read is floorEvery old; concurrent claims read it once (the
// first counts it as read before it reads).
func (c *cursor) refreshFloor(ctx context.Context, q sqlx.QueryerContext, p *core.Plan) {
	if !floors(p) {
		return
	}
	c.mu.Lock()
	now := time.Now()
	due := now.Sub(c.floorAt) >= floorEvery
	if due {
		c.floorAt, c.floor = now, nil
	}
	c.mu.Unlock()
	if due {
		c.readFloor(ctx, q, p)
	}
}

// readFloor reads where full scans start for the next floorEvery: the
// first unfinished row, or when there is none the last row. Rows before
// it are done or dead and stay so, but for a dead row requeued, a row
// committed late with a lower ID, and a new row in a table whose IDs do
// not grow (random keys): the next read of the floor, which looks from
// the first row, finds those, so they wait at most floorEvery more.
// Without it a table that keeps its finished rows has every full scan step
// over all of them first (every claim, when the cursor runs dry at a low
// rate). Once a second, not every full scan: the read itself steps over
// them. On error, full scans start from the first row.
func (c *cursor) readFloor(ctx context.Context, q sqlx.QueryerContext, p *core.Plan) {
	// One round trip: the first unfinished row, else the last row (NULL
	// for an empty table: no floor).
	id := p.Alias + "." + p.QID
	var at any
	if err := sqlx.GetContext(ctx, q, &at, "SELECT COALESCE("+
		"(SELECT "+id+" FROM "+p.QTable+" "+p.Alias+" WHERE "+p.Unfinished(p.Alias)+" ORDER BY "+p.OrderBy(p.Alias)+" LIMIT 1), "+
		"(SELECT "+id+" FROM "+p.QTable+" "+p.Alias+" ORDER BY "+id+" DESC LIMIT 1))"); err != nil {
		return
	}
	v := orderPosition([]any{at})
	c.mu.Lock()
	c.floor = v
	c.mu.Unlock()
}

// advance moves the cursor to the order values v (Plan.OrderValues) of a
// row just claimed.
func (c *cursor) advance(v []any) {
	v = orderPosition(v)
	if v == nil {
		return
	}
	c.mu.Lock()
	c.at = v
	c.mu.Unlock()
}

// orderPosition returns v with byte slices copied (the driver may reuse
// their buffers), or nil when a value is NULL: no position.
func orderPosition(v []any) []any {
	out := make([]any, len(v))
	for i, x := range v {
		switch b := x.(type) {
		case nil:
			return nil
		case []byte:
			out[i] = string(b)
		default:
			out[i] = x
		}
	}
	return out
}

// rescanned is told by a rescan's claim (keep, as from gave it) the
// position v (Plan.OrderValues) of the last row it took (nil: it took
// none), and whether it took as many rows as it asked for. A full claim
// whose last row comes before the cursor may have left more rows
// published before it (a wake-up can stand for several publishes), so
// claims go on rescanning. So do they after a wake-up told while the
// claim ran: its rows may have been committed after the claim's
// snapshot. Otherwise the rescan ends. A row at or after the cursor moves
// the cursor there, as any claim does.
func (c *cursor) rescanned(p *core.Plan, keep rescanOf, v []any, full bool) {
	if v != nil {
		v = orderPosition(v)
	}
	if rescannedHook != nil {
		rescannedHook()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	woken := c.wakes != keep
	if v != nil && c.at != nil && before(p, v, c.at) {
		c.rescan = c.rescan && (full || woken)
		return
	}
	if v != nil {
		c.at = v
	}
	c.rescan = c.rescan && woken
}

// rescannedHook, when set (by tests), runs as a rescan's claim reports
// to rescanned, after its statement and before the cursor learns of it.
var rescannedHook func()

// before reports whether position v comes strictly before w in p's claim
// order; false when a pair of values cannot be compared (the next
// periodic full scan then finds what a rescan did not).
func before(p *core.Plan, v, w []any) bool {
	for i, k := range p.OrderKeys {
		c, ok := compareValues(v[i], w[i])
		if !ok {
			return false
		}
		if k.Desc {
			c = -c
		}
		if c != 0 {
			return c < 0
		}
	}
	return false
}

// compareValues orders two values of one order column as a driver returns
// them: integers, floats, times, strings (bytes as strings; digits as
// numbers, as MySQL's text protocol sends them).
func compareValues(a, b any) (int, bool) {
	num := func(x any) (float64, bool) {
		switch n := x.(type) {
		case int64:
			return float64(n), true
		case int32:
			return float64(n), true
		case int:
			return float64(n), true
		case float64:
			return n, true
		case string:
			f, err := strconv.ParseFloat(n, 64)
			return f, err == nil
		}
		return 0, false
	}
	if x, ok := num(a); ok {
		if y, ok := num(b); ok {
			return cmp.Compare(x, y), true
		}
	}
	switch x := a.(type) {
	case time.Time:
		if y, ok := b.(time.Time); ok {
			return x.Compare(y), true
		}
	case string:
		if y, ok := b.(string); ok {
			return strings.Compare(x, y), true
		}
	}
	return 0, false
}

// rescanNext makes the next claim that starts a full scan, whatever
// claims in flight then advance the cursor to.
func (c *cursor) rescanNext() {
	c.mu.Lock()
	c.rescan = true
	if c.wakes++; c.wakes == 0 {
		c.wakes = 1 // zero says "no rescan" (rescanOf)
	}
	c.mu.Unlock()
}

// reset makes the next claim a full scan.
func (c *cursor) reset() {
	c.mu.Lock()
	c.at = nil
	c.mu.Unlock()
}

// isolation is the isolation of claim transactions: the table's, else the
// dialect's.
func (b *base) isolation() sql.IsolationLevel {
	if iso := b.plan.Isolation; iso != sql.LevelDefault {
		return iso
	}
	return b.plan.Dialect.Features().ClaimIsolation
}

// begin opens a claim transaction whose life is bound to ctx.
func (b *base) begin(ctx context.Context) (*sqlx.Tx, error) {
	return b.pool.BeginClaim(ctx, b.isolation())
}

// row is one row read with every column.
type row struct {
	cols []string
	vals []any
}

func (r *row) get(col string) any { return r.at(colAt(r.cols, col)) }

// at is the value of the column at index i (colAt), nil when i < 0.
func (r *row) at(i int) any {
	if i < 0 {
		return nil
	}
	return r.vals[i]
}

// colAt is the index of col in cols, compared as the database does
// (case aside), or -1.
func colAt(cols []string, col string) int {
	for i, c := range cols {
		if strings.EqualFold(c, col) {
			return i
		}
	}
	return -1
}

// readRows reads every row of rows (closing them) as sqlx's SliceScan
// would, each value as the driver returned it (bytes copied), with the
// values of many rows in one allocation: a claim reads hundreds.
func readRows(rows *sqlx.Rows) ([]row, error) { return readRowsN(rows, 0) }

// readRowsN is readRows for about n rows (the most a claim asks for):
// the list of rows is allocated once.
func readRowsN(rows *sqlx.Rows, n int) ([]row, error) {
	return readRowsInto(rows, make([]row, 0, n))
}

// readRowsInto is readRows appending to out.
func readRowsInto(rows *sqlx.Rows, out []row) ([]row, error) {
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		return nil, err
	}
	var store []any // the values of the rows still to read
	dest := make([]any, len(cols))
	for rows.Next() {
		if len(store) < len(cols) {
			store = make([]any, len(cols)*rowsPerAlloc)
		}
		vals := store[:len(cols):len(cols)]
		store = store[len(cols):]
		for i := range vals {
			dest[i] = &vals[i]
		}
		if err := rows.Scan(dest...); err != nil {
			return nil, err
		}
		out = append(out, row{cols: cols, vals: vals})
	}
	return out, rows.Err()
}

// readColumn reads the one column of rows (closing them), each value as
// the driver returned it (bytes copied), for about n rows.
func readColumn(rows *sqlx.Rows, n int) ([]any, error) {
	defer rows.Close()
	out := make([]any, 0, n)
	for rows.Next() {
		var v any
		if err := rows.Scan(&v); err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

// rowsPerAlloc is how many rows' values readRows allocates at once.
const rowsPerAlloc = 64

// attemptOf reads the attempt column as an int. NULL and values below 1
// (rows that break the contract) read as 1, a new row's attempt; the next
// count repairs the column (Plan.NextAttempt).
func (b *base) attemptOf(r *row) (int, error) {
	return b.attemptAt(r, colAt(r.cols, b.plan.Attempt))
}

// attemptAt is attemptOf with the attempt column's index (colAt).
func (b *base) attemptAt(r *row, at int) (int, error) {
	v := r.at(at)
	if n, ok := v.(int64); ok { // as drivers mostly return it
		return int(max(n, 1)), nil
	}
	var n sql.NullInt64
	if err := n.Scan(v); err != nil {
		return 0, fmt.Errorf("sqlxbroker: table %s: attempt column %q holds %v in row %v: %w", b.plan.Table, b.plan.Attempt, v, r.get(b.plan.ID), err)
	}
	if !n.Valid || n.Int64 < 1 {
		return 1, nil
	}
	return int(n.Int64), nil
}

// counted is the attempt a delivery reports after a claim that counted it:
// one less than the column, never below 1.
func counted(attempt int) int { return max(1, attempt-1) }

// delivery is the claimed row r, reporting attempt, with the attempt
// column of the copy the handler sees set to it.
func (b *base) delivery(r *row, attempt int, key string) core.Row {
	return b.deliveryAt(r, colAt(r.cols, b.plan.ID), colAt(r.cols, b.plan.Attempt), attempt, key)
}

// deliveryAt is delivery with the indexes of the ID and attempt columns
// (colAt).
func (b *base) deliveryAt(r *row, idAt, attemptAt, attempt int, key string) core.Row {
	if attemptAt >= 0 {
		r.vals[attemptAt] = int64(attempt)
	}
	return core.Row{ID: r.at(idAt), Attempt: attempt, Key: key, Columns: r.cols, Values: r.vals}
}

// noTx is the Tx of claims of forms that hold no transaction.
type noTx struct{}

func (noTx) Tx() (*sqlx.Tx, error) { return nil, core.ErrNoTx }

// completion builds the statement that records o for one row, matched by
// "<id> = ?" plus fence (a further condition whose args the caller adds
// after the id, e.g. the lease token). countAttempt is true in the form that counts attempts at
// completion (row lock): Retry and Dead add 1 to the attempt; false in the
// forms that counted at claim: Snoozed takes that count back (see
// core.OutcomeKind). clearLease sets the lease column to NULL. It returns
// "" when o needs no statement.
func (b *base) completion(o core.Outcome, countAttempt, clearLease bool, fence string) (string, []any) {
	p := b.plan
	var set []string
	var args []any
	failed := func() {
		if countAttempt {
			set = append(set, p.QAttempt+" = "+p.NextAttempt(""))
		}
		if p.QLastError != "" {
			set = append(set, p.QLastError+" = ?")
			args = append(args, core.ErrorText(o.Err))
		}
	}
	switch o.Kind {
	case core.Succeeded:
		if p.QDoneAt == "" {
			q := "DELETE FROM " + p.QTable + " WHERE " + p.QID + " = ?" + fence
			return p.Rebind(q), nil
		}
		set = append(set, p.QDoneAt+" = ?")
		args = append(args, p.Time(core.Now()))
	case core.Retry:
		failed()
		if p.QReadyAt != "" && !o.RetryAt.IsZero() {
			set = append(set, p.QReadyAt+" = ?")
			args = append(args, p.Time(o.RetryAt))
		}
	case core.Dead:
		failed()
		set = append(set, p.QDeadAt+" = ?")
		args = append(args, p.Time(core.Now()))
	case core.Snoozed:
		if !countAttempt {
			set = append(set, p.QAttempt+" = "+p.PrevAttempt(""))
		}
		if p.QReadyAt != "" && !o.RetryAt.IsZero() {
			set = append(set, p.QReadyAt+" = ?")
			args = append(args, p.Time(o.RetryAt))
		}
	case core.Released:
	}
	if clearLease {
		set = append(set, p.QLockedUntil+" = NULL")
	}
	if len(set) == 0 {
		return "", nil
	}
	return p.Rebind("UPDATE " + p.QTable + " SET " + strings.Join(set, ", ") + " WHERE " + p.QID + " = ?" + fence), args
}

// idKey makes ids returned by different statements comparable.
func idKey(v any) string {
	switch x := v.(type) {
	case int64:
		return strconv.FormatInt(x, 10)
	case []byte:
		return string(x)
	case string:
		return x
	}
	return fmt.Sprint(v)
}

// mapKey is v as a map key: ids as one statement's rows return them, the
// bytes a driver returns as a string (a slice cannot be a key).
func mapKey(v any) any {
	if b, ok := v.([]byte); ok {
		return string(b)
	}
	return v
}

// life is a context for resources that must outlive one call (claim
// transactions): cancelled only by Close.
func newLife() (context.Context, context.CancelFunc) {
	return context.WithCancel(context.Background())
}

// guardedHeads reads up to limit candidate group heads without locks and
// guards each group with the dialect's GroupGuard, returning the ids of the
// heads whose group this transaction now holds (rows with a NULL group need
// no guard). The caller locks and checks each head again.
func guardedHeads(ctx context.Context, tx *sqlx.Tx, p *core.Plan, where string, args []any, limit int) ([]any, error) {
	r, err := tx.QueryxContext(ctx, p.Rebind(fmt.Sprintf("SELECT %s.%s, %s.%s FROM %s %s WHERE %s ORDER BY %s LIMIT %d",
		p.Alias, p.QID, p.Alias, p.QGroup, p.QTable, p.Alias, where, p.OrderBy(p.Alias), limit)), args...)
	if err != nil {
		return nil, err
	}
	cands, err := readRows(r)
	if err != nil {
		return nil, err
	}
	var ids []any
	seen := map[string]bool{}
	for _, c := range cands {
		if g := c.vals[1]; g != nil {
			if seen[idKey(g)] {
				continue
			}
			seen[idKey(g)] = true
			ok, err := p.Caps.GroupGuard.GuardGroup(ctx, tx, &core.GroupGuardParams{Plan: p, Group: g})
			if err != nil {
				return nil, fmt.Errorf("guard FIFO group %v: %w", g, err)
			}
			if !ok {
				continue
			}
		}
		ids = append(ids, c.vals[0])
	}
	return ids, nil
}

// updateRows runs "UPDATE <table> SET set WHERE where" on q and returns
// the rows it changed as they now are: with RETURNING * where the dialect
// has it (Features.UpdateReturning), else the UPDATE and then a read of the
// rows that meet where with the same args. The caller makes sure the two
// agree: nothing else changes those rows in between, and where does not
// depend on what set changes. Statements are given with '?'.
func (b *base) updateRows(ctx context.Context, q sqlx.ExtContext, set, where string, args []any, n int) ([]row, error) {
	p := b.plan
	upd := "UPDATE " + p.QTable + " SET " + set + " WHERE " + where
	if p.Dialect.Features().UpdateReturning {
		rs, err := q.QueryxContext(ctx, p.Rebind(upd+" RETURNING *"), args...)
		if err != nil {
			return nil, err
		}
		return readRowsN(rs, n)
	}
	res, err := q.ExecContext(ctx, p.Rebind(upd), args...)
	if err != nil {
		return nil, err
	}
	if n, err := res.RowsAffected(); err != nil || n == 0 {
		return nil, err
	}
	rs, err := q.QueryxContext(ctx, p.Rebind("SELECT * FROM "+p.QTable+" WHERE "+where), args...)
	if err != nil {
		return nil, err
	}
	return readRowsN(rs, n)
}

// allOrEach changes n rows in a new transaction. It first runs all, one
// statement for them all, and keeps it when it changed every row (the
// usual case); otherwise it rolls that back and runs each(i) for every row
// in a new transaction, which tells which rows changed. It returns which
// did and the open transaction, for the caller to read in and commit.
// Statements are given rebound.
func (b *base) allOrEach(ctx context.Context, n int, all string, allArgs []any, each string, eachArgs func(i int) []any) ([]bool, *sqlx.Tx, error) {
	hit := make([]bool, n)
	tx, err := b.db.BeginTxx(ctx, nil)
	if err != nil {
		return nil, nil, err
	}
	res, err := tx.ExecContext(ctx, all, allArgs...)
	if err != nil {
		_ = tx.Rollback()
		return nil, nil, err
	}
	if got, err := res.RowsAffected(); err == nil && got == int64(n) {
		for i := range hit {
			hit[i] = true
		}
		return hit, tx, nil
	}
	_ = tx.Rollback()
	if tx, err = b.db.BeginTxx(ctx, nil); err != nil {
		return nil, nil, err
	}
	for i := range hit {
		res, err := tx.ExecContext(ctx, each, eachArgs(i)...)
		if err == nil {
			var got int64
			got, err = res.RowsAffected()
			hit[i] = got > 0
		}
		if err != nil {
			_ = tx.Rollback()
			return nil, nil, err
		}
	}
	return hit, tx, nil
}

// conflict marks err with core.ErrConflict when the dialect says the
// database rolled its transaction back for a concurrent one
// (core.ConflictDetector).
func (b *base) conflict(err error) error {
	if err == nil || errors.Is(err, core.ErrConflict) {
		return err
	}
	if d := b.plan.Caps.ConflictDetector; d != nil && d.Conflict(err) {
		return fmt.Errorf("%w: %w", core.ErrConflict, err)
	}
	return err
}

// conflictRetries is how many times retryConflicts runs a statement again.
const conflictRetries = 6

// retryConflicts runs do, and again while it fails with a conflict
// (core.ConflictDetector), up to conflictRetries more times, waiting 5 ms,
// then twice as long each time, for the winner's writes to reach this
// session's server; ctx ends the waits. do must be safe to run again after
// a conflict rolled it back: a fenced completion is (its fence holds for
// one outcome only). The last error is returned marked ErrConflict when it
// is a conflict.
func (b *base) retryConflicts(ctx context.Context, do func() error) error {
	err := do()
	for i := 0; i < conflictRetries && err != nil; i++ {
		if b.conflict(err) == err {
			return err // not a conflict
		}
		t := time.NewTimer(5 * time.Millisecond << i)
		select {
		case <-ctx.Done():
			t.Stop()
			return b.conflict(err)
		case <-t.C:
		}
		err = do()
	}
	return b.conflict(err)
}
