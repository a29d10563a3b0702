package sqlxbroker

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/sqlxbroker/sqlxbroker/core"
)

// State is the state of a row as the operations (Counts, List, Requeue,
// Delete, Prune) see it. The states do not overlap:
//
//   - dead: DeadAt is set (MaxAttempts, Permanent);
//   - done: DoneAt is set (success, in a table with a DoneAt column);
//   - in-work: unfinished and holding a live lease (lease form only; the
//     database cannot tell which rows a row-lock transaction or an
//     advisory key holds, so in those forms a row in work counts as ready);
//   - scheduled: unfinished, not in work, ReadyAt after the host's clock;
//   - ready: every other unfinished row (in a FIFO table, rows behind their
//     group's head included).
type State string

// The states.
const (
	StateReady     State = "ready"
	StateScheduled State = "scheduled"
	StateInWork    State = "in-work"
	StateDead      State = "dead"
	StateDone      State = "done"
)

// States lists the states in the order Counts reports them.
var States = []State{StateReady, StateScheduled, StateInWork, StateDead, StateDone}

// ParseState reads a state name; an unknown one is an error naming it and
// the known ones.
func ParseState(s string) (State, error) {
	if i := slices.Index(States, State(strings.TrimSpace(s))); i >= 0 {
		return States[i], nil
	}
	names := make([]string, len(States))
	for i, st := range States {
		names[i] = string(st)
	}
	return "", fmt.Errorf("sqlxbroker: unknown state %q (%s)", s, strings.Join(names, ", "))
}

// stateCond is the condition over alias c that a row is in st at now, and
// its args ('?'), or an error when the table has no column for st.
func stateCond(p *core.Plan, t *Table, st State, now time.Time) (string, []any, error) {
	return stateCondAs(p, t, st, now, p.Alias)
}

// stateCondAs is stateCond over alias ("" for none).
func stateCondAs(p *core.Plan, t *Table, st State, now time.Time, alias string) (string, []any, error) {
	return stateCondMarked(p, t, st, now, alias, nil)
}

// stateCondMarked is stateCondAs with the classes (unfinished, dead, done)
// told by m's conditions (over p.Alias) instead of the state columns; m nil:
// by the columns.
func stateCondMarked(p *core.Plan, t *Table, st State, now time.Time, alias string, m *core.StateMarks) (string, []any, error) {
	need := func(field, col string) error {
		if col == "" {
			return &TableError{Table: t.Name, Field: field, Reason: fmt.Sprintf("the state %s needs a %s column", st, field)}
		}
		return nil
	}
	c := func(q string) string {
		if alias == "" {
			return q
		}
		return alias + "." + q
	}
	unf := p.Unfinished(alias)
	if m != nil && m.Unfinished != "" {
		unf = m.Unfinished
	}
	var args []any
	notLeased := ""
	if p.QLockedUntil != "" {
		lu := c(p.QLockedUntil)
		notLeased = " AND (" + lu + " IS NULL OR " + lu + " <= ? OR " + lu + " > ?)"
		_, args = p.LeaseHeld(alias, now) // its bounds: now and the dangling limit
	}
	switch st {
	case StateDead:
		if err := need("DeadAt", p.DeadAt); err != nil {
			return "", nil, err
		}
		if m != nil && m.Dead != "" {
			return m.Dead, nil, nil
		}
		return c(p.QDeadAt) + " IS NOT NULL", nil, nil
	case StateDone:
		if err := need("DoneAt", p.DoneAt); err != nil {
			return "", nil, err
		}
		if m != nil && m.Done != "" {
			return m.Done, nil, nil
		}
		cond := c(p.QDoneAt) + " IS NOT NULL"
		if p.QDeadAt != "" {
			cond += " AND " + c(p.QDeadAt) + " IS NULL"
		}
		return cond, nil, nil
	case StateInWork:
		if p.QLockedUntil == "" {
			return "", nil, fmt.Errorf("sqlxbroker: table %q: the %s form cannot tell rows in work (only the lease form writes them)", t.Name, t.Form())
		}
		held, hargs := p.LeaseHeld(alias, now)
		return unf + " AND " + held, hargs, nil
	case StateScheduled:
		if err := need("ReadyAt", p.ReadyAt); err != nil {
			return "", nil, err
		}
		return unf + " AND " + c(p.QReadyAt) + " > ?" + notLeased, append([]any{p.Time(now)}, args...), nil
	case StateReady:
		if p.QReadyAt == "" {
			return unf + notLeased, args, nil
		}
		return unf + " AND (" + c(p.QReadyAt) + " IS NULL OR " + c(p.QReadyAt) + " <= ?)" + notLeased,
			append([]any{p.Time(now)}, args...), nil
	}
	_, err := ParseState(string(st))
	return "", nil, err
}

// CheckTable checks t as every operation does before it acts: the
// description on its own (Validate, the dialect's forms), then the live
// table, read by a query that returns no row, so nothing changes. A
// missing table, or a column of the description the table lacks, is a
// *TableError naming it (and the field it comes from).
func (b *Broker) CheckTable(ctx context.Context, t Table) error {
	_, err := b.opsPlan(ctx, t)
	return err
}

// opsPlan checks t and the live table as Subscribe does.
func (b *Broker) opsPlan(ctx context.Context, t Table) (*core.Plan, error) {
	p, err := b.Plan(t)
	if err != nil {
		return nil, err
	}
	if err := checkLive(ctx, b.db, t, p); err != nil {
		return nil, err
	}
	return p, nil
}

// Counts is how many rows of a table are in each state (see State), at
// the host time At.
type Counts struct {
	At                                   time.Time
	Ready, Scheduled, InWork, Dead, Done int64
	// InWorkKnown: the form can tell rows in work (lease). In the row-lock
	// and advisory forms InWork is 0 and rows in work count as Ready.
	InWorkKnown bool
	// OldestReady is the ReadyAt of the oldest ready row that has one
	// (Publish writes the publish time there); zero without a ReadyAt
	// column or when no ready row has one.
	OldestReady time.Time
}

// Of returns the count of st.
func (c Counts) Of(st State) int64 {
	switch st {
	case StateReady:
		return c.Ready
	case StateScheduled:
		return c.Scheduled
	case StateInWork:
		return c.InWork
	case StateDead:
		return c.Dead
	case StateDone:
		return c.Done
	}
	return 0
}

// Counts counts t's rows in each state the description can tell, one
// COUNT per state (an index on the state's column serves it: see
// TableDDL; on a dialect with core.StateMarker, an index on the column the
// recommended table derives from the state columns, when the table has
// it), and reads the oldest ready row's ReadyAt. The counts are
// read one after the other, not in one snapshot: under a running
// subscription a row moving between states may be counted in neither or
// in both. With core.StateMarker's column they are read in one
// REPEATABLE READ snapshot, and InWork is the unfinished rows less the
// ready and scheduled ones (the index leaves the lease column out).
func (b *Broker) Counts(ctx context.Context, t Table) (Counts, error) {
	p, err := b.opsPlan(ctx, t)
	if err != nil {
		return Counts{}, err
	}
	var marks *core.StateMarks
	if sm := p.Caps.StateMarker; sm != nil {
		if marks, err = sm.StateMarks(ctx, b.pool, p); err != nil {
			return Counts{}, fmt.Errorf("sqlxbroker: counts of %s: %w", t.Name, err)
		}
	}
	var q interface {
		QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
	} = b.db
	if marks != nil {
		// One snapshot: the in-work count is derived from the others.
		tx, err := b.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true})
		if err != nil {
			return Counts{}, fmt.Errorf("sqlxbroker: counts of %s: %w", t.Name, err)
		}
		defer tx.Rollback()
		q = tx
	}
	now := core.Now()
	out := Counts{At: now, InWorkKnown: p.QLockedUntil != ""}
	for _, cq := range countQueries(p, &t, now, marks) {
		if cq.state == "" { // the oldest ready row, when there is one
			if out.Ready == 0 {
				continue
			}
			var v any
			err := q.QueryRowContext(ctx, cq.query, cq.args...).Scan(&v)
			if errors.Is(err, sql.ErrNoRows) {
				continue // no ready row has a ReadyAt
			}
			if err != nil {
				return Counts{}, fmt.Errorf("sqlxbroker: oldest ready row of %s: %w", t.Name, err)
			}
			if v != nil {
				var at time.Time
				if err := assignTime(&at, v); err != nil {
					return Counts{}, fmt.Errorf("sqlxbroker: oldest ready row of %s: %w", t.Name, err)
				}
				out.OldestReady = at
			}
			continue
		}
		var n int64
		if err := q.QueryRowContext(ctx, cq.query, cq.args...).Scan(&n); err != nil {
			return Counts{}, fmt.Errorf("sqlxbroker: count %s rows of %s: %w", cq.state, t.Name, err)
		}
		switch cq.state {
		case StateReady:
			out.Ready = n
		case StateScheduled:
			out.Scheduled = n
		case StateInWork:
			out.InWork = n
			if cq.unfinished { // ready, scheduled and in work split them
				out.InWork = n - out.Ready - out.Scheduled
			}
		case StateDead:
			out.Dead = n
		case StateDone:
			out.Done = n
		}
	}
	return out, nil
}

// countQuery is one statement of Counts, rebound for the dialect: a COUNT
// of state's rows, or (state "") the oldest ready row's ReadyAt.
type countQuery struct {
	state State
	query string
	args  []any
	// unfinished: the in-work query counts the unfinished rows instead
	// (ready and scheduled, counted before it, are the rest of them).
	unfinished bool
}

// countQueries are the statements Counts runs for t at now, in order,
// with the classes told by m (nil: by the state columns).
func countQueries(p *core.Plan, t *Table, now time.Time, m *core.StateMarks) []countQuery {
	var out []countQuery
	for _, st := range States {
		cond, args, err := stateCondMarked(p, t, st, now, p.Alias, m)
		if err != nil {
			continue // a state the table cannot have
		}
		cq := countQuery{state: st, args: args}
		if st == StateInWork && m != nil && m.Unfinished != "" {
			// The lease column is outside the marks' index, so the rows in
			// work are the unfinished rows (the index alone) less the
			// ready and scheduled ones, in the same snapshot (Counts).
			cond, cq.args, cq.unfinished = m.Unfinished, nil, true
		}
		cq.query = p.Rebind("SELECT COUNT(*) FROM " + p.QTable + " " + p.Alias + " WHERE " + cond)
		out = append(out, cq)
	}
	if p.QReadyAt != "" {
		// The first in ReadyAt order rather than MIN: MariaDB computes a MIN
		// with a condition outside the index (the lease) over the whole
		// range, and an ordered read stops at the first row.
		cond, args, _ := stateCondMarked(p, t, StateReady, now, p.Alias, m)
		ra := p.Alias + "." + p.QReadyAt
		q := "SELECT " + ra + " FROM " + p.QTable + " " + p.Alias + " WHERE " + cond + " AND " + ra + " IS NOT NULL ORDER BY " + ra + " LIMIT 1"
		out = append(out, countQuery{query: p.Rebind(q), args: args})
	}
	return out
}

// assignTime reads a timestamp as the driver returned it.
func assignTime(dst *time.Time, v any) error {
	var nt sql.NullTime
	if err := nt.Scan(v); err == nil {
		*dst = nt.Time.UTC()
		return nil
	}
	var at time.Time
	if err := assign(reflect.ValueOf(&at).Elem(), v); err != nil {
		return err
	}
	*dst = at.UTC()
	return nil
}

// ListParams selects a page of rows of one state.
type ListParams struct {
	State State
	// After is the ID the page starts after (ListPage.Next of the page
	// before); nil: the first page.
	After any
	// Limit is the most rows; default 50, at most 1,000.
	Limit int
}

// ListedRow is one row as List reads it: every column as the driver
// returned it (text as string), and the ones the operations show.
type ListedRow struct {
	ID        any
	Attempt   int
	LastError string // "" without a LastError column
	Columns   []string
	Values    []any
}

// Value returns a column's value.
func (r *ListedRow) Value(col string) (any, bool) {
	for i, c := range r.Columns {
		if strings.EqualFold(c, col) {
			return r.Values[i], true
		}
	}
	return nil, false
}

// ListPage is a page of rows; Next is the After of the next page, nil
// after the last.
type ListPage struct {
	Rows []ListedRow
	Next any
}

// List reads a page of t's rows in p.State, by ID, starting after p.After
// (keyset paging: each page is an indexed range, however deep).
func (b *Broker) List(ctx context.Context, t Table, lp ListParams) (ListPage, error) {
	p, err := b.opsPlan(ctx, t)
	if err != nil {
		return ListPage{}, err
	}
	if lp.Limit < 0 {
		return ListPage{}, fmt.Errorf("sqlxbroker: List: negative Limit %d", lp.Limit)
	}
	limit := lp.Limit
	if limit == 0 {
		limit = 50
	}
	limit = min(limit, 1000)
	cond, args, err := stateCond(p, &t, lp.State, core.Now())
	if err != nil {
		return ListPage{}, err
	}
	if lp.After != nil {
		cond += " AND " + p.Alias + "." + p.QID + " > ?"
		args = append(args, lp.After)
	}
	q := fmt.Sprintf("SELECT * FROM %s %s WHERE %s ORDER BY %s.%s LIMIT %d", p.QTable, p.Alias, cond, p.Alias, p.QID, limit+1)
	rows, err := b.db.QueryxContext(ctx, p.Rebind(q), args...)
	if err != nil {
		return ListPage{}, fmt.Errorf("sqlxbroker: list %s rows of %s: %w", lp.State, t.Name, err)
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		return ListPage{}, err
	}
	var page ListPage
	for rows.Next() {
		vals, err := rows.SliceScan()
		if err != nil {
			return ListPage{}, fmt.Errorf("sqlxbroker: list %s rows of %s: %w", lp.State, t.Name, err)
		}
		if len(page.Rows) == limit {
			page.Next = page.Rows[limit-1].ID
			break
		}
		for i, v := range vals {
			if bs, ok := v.([]byte); ok {
				vals[i] = string(bs)
			}
		}
		r := ListedRow{Columns: cols, Values: vals}
		r.ID, _ = r.Value(p.ID)
		if v, _ := r.Value(p.Attempt); v != nil {
			var n sql.NullInt64
			if n.Scan(v) == nil {
				r.Attempt = int(n.Int64)
			}
		}
		if p.LastError != "" {
			if v, _ := r.Value(p.LastError); v != nil {
				r.LastError = fmt.Sprint(v)
			}
		}
		page.Rows = append(page.Rows, r)
	}
	return page, rows.Err()
}

// Select says which rows of a state an operation changes: the rows with
// IDs, or, with All, every row in the state. One of them is required.
type Select struct {
	IDs []any
	All bool
	// BatchSize is the most rows one statement changes; default 1,000. Each
	// batch commits on its own, so a million rows never make one long
	// transaction, and an operation cut short (ctx) keeps the batches done.
	BatchSize int
}

func (s *Select) check(op string) error {
	switch {
	case s.All && len(s.IDs) > 0:
		return fmt.Errorf("sqlxbroker: %s: give IDs or All, not both", op)
	case !s.All && len(s.IDs) == 0:
		return fmt.Errorf("sqlxbroker: %s: no rows selected (give IDs, or All)", op)
	case s.BatchSize < 0:
		return fmt.Errorf("sqlxbroker: %s: negative BatchSize %d", op, s.BatchSize)
	}
	if s.BatchSize == 0 {
		s.BatchSize = 1000
	}
	return nil
}

// batches runs change over the selected rows in st, a batch at a time,
// with the ids of the batch; change keeps itself to rows still in st
// (stateCondAs). It returns how many rows the batches changed.
func (b *Broker) batches(ctx context.Context, p *core.Plan, t *Table, st State, sel Select,
	change func(ctx context.Context, ids []any) (int64, error)) (int64, error) {
	var total int64
	run := func(ids []any) error {
		n, err := change(ctx, ids)
		total += n
		return err
	}
	if !sel.All {
		for from := 0; from < len(sel.IDs); from += sel.BatchSize {
			if err := ctx.Err(); err != nil {
				return total, err
			}
			if err := run(sel.IDs[from:min(from+sel.BatchSize, len(sel.IDs))]); err != nil {
				return total, err
			}
		}
		return total, nil
	}
	var after any
	for {
		if err := ctx.Err(); err != nil {
			return total, err
		}
		cond, args, err := stateCond(p, t, st, core.Now())
		if err != nil {
			return total, err
		}
		if after != nil {
			cond += " AND " + p.Alias + "." + p.QID + " > ?"
			args = append(args, after)
		}
		var ids []any
		q := fmt.Sprintf("SELECT %s.%s FROM %s %s WHERE %s ORDER BY %s.%s LIMIT %d", p.Alias, p.QID, p.QTable, p.Alias, cond, p.Alias, p.QID, sel.BatchSize)
		rows, err := b.db.QueryContext(ctx, p.Rebind(q), args...)
		if err != nil {
			return total, err
		}
		for rows.Next() {
			var id any
			if err := rows.Scan(&id); err != nil {
				rows.Close()
				return total, err
			}
			if bs, ok := id.([]byte); ok {
				id = string(bs)
			}
			ids = append(ids, id)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return total, err
		}
		if len(ids) == 0 {
			return total, nil
		}
		if err := run(ids); err != nil {
			return total, err
		}
		if len(ids) < sel.BatchSize {
			return total, nil
		}
		after = ids[len(ids)-1]
	}
}

// inIDs is "<id> IN (?, ..)" for n ids, unqualified.
func inIDs(p *core.Plan, n int) string {
	return p.QID + " IN (?" + strings.Repeat(", ?", n-1) + ")"
}

// Requeue makes dead rows of t ready again, as new: DeadAt, the lease and
// LastError cleared, the attempt back to 1, ReadyAt the host's now. Only
// rows that are dead when their batch runs change (a dead row is never in
// work, in any form); it returns how many did.
func (b *Broker) Requeue(ctx context.Context, t Table, sel Select) (int64, error) {
	if err := sel.check("Requeue"); err != nil {
		return 0, err
	}
	p, err := b.opsPlan(ctx, t)
	if err != nil {
		return 0, err
	}
	if _, _, err := stateCond(p, &t, StateDead, core.Now()); err != nil {
		return 0, err
	}
	set := []string{p.QDeadAt + " = NULL", p.QAttempt + " = 1"}
	for _, c := range []string{p.QLockedUntil, p.QLastError} {
		if c != "" {
			set = append(set, c+" = NULL")
		}
	}
	if p.QReadyAt != "" {
		set = append(set, p.QReadyAt+" = ?")
	}
	return b.batches(ctx, p, &t, StateDead, sel, func(ctx context.Context, ids []any) (int64, error) {
		cond, args, _ := stateCondAs(p, &t, StateDead, core.Now(), "")
		var head []any
		if p.QReadyAt != "" {
			head = append(head, p.Time(core.Now()))
		}
		return b.byIDs(ctx, p, "UPDATE "+p.QTable+" SET "+strings.Join(set, ", "), head, ids, cond, args)
	})
}

// ErrRowsInWork: Delete was asked for ready rows in a form whose rows in
// work look ready to the database (advisory).
var ErrRowsInWork = errors.New("sqlxbroker: the form cannot tell ready rows from rows in work")

// DeleteParams selects the rows Delete removes: rows in State, by IDs or
// All (Select).
type DeleteParams struct {
	State State
	Select
}

// Delete removes rows of t in dp.State and returns how many it removed.
// Only rows still in the state when their batch runs go, and never a row in
// work: dead, done and scheduled rows are never in work; in-work rows
// cannot be deleted; ready rows are taken in the lease form only without a
// live lease, in the row-lock form only when not locked (the batch skips
// locked rows, as claims do), and in the advisory form not at all
// (ErrRowsInWork: its keys are not in the table). In the row-lock form on
// a database whose statements over a list of ids may wait for rows out of
// the list (core.Features.ListScanWaits: MySQL, MariaDB), Delete, Requeue
// and Prune change a batch's rows one statement each, in one transaction,
// so that none waits on a row in work (oneByOne).
func (b *Broker) Delete(ctx context.Context, t Table, dp DeleteParams) (int64, error) {
	if err := dp.Select.check("Delete"); err != nil {
		return 0, err
	}
	p, err := b.opsPlan(ctx, t)
	if err != nil {
		return 0, err
	}
	if _, _, err := stateCond(p, &t, dp.State, core.Now()); err != nil {
		return 0, err
	}
	var skip string
	switch {
	case dp.State == StateInWork:
		return 0, fmt.Errorf("sqlxbroker: Delete: rows in work cannot be deleted (their handlers run)")
	case dp.State == StateReady && p.Form == core.Advisory:
		return 0, fmt.Errorf("%w: table %q: the advisory form's keys are held outside the table, so Delete takes dead, done or scheduled rows only", ErrRowsInWork, t.Name)
	case dp.State == StateReady && p.Form == core.RowLock:
		rl, err := p.Caps.RowLocker.RowLock(ctx, b.pool)
		if err != nil {
			return 0, err
		}
		skip = rl.SkipLocked
	}
	return b.batches(ctx, p, &t, dp.State, dp.Select, func(ctx context.Context, ids []any) (int64, error) {
		cond, args, _ := stateCondAs(p, &t, dp.State, core.Now(), "")
		if skip == "" {
			return b.byIDs(ctx, p, "DELETE FROM "+p.QTable, nil, ids, cond, args)
		}
		where := inIDs(p, len(ids)) + " AND " + cond
		all := append(append([]any{}, ids...), args...)
		// Lock what is not locked (rows in work are), delete those.
		tx, err := b.pool.BeginClaim(ctx, p.Dialect.Features().ClaimIsolation)
		if err != nil {
			return 0, err
		}
		defer tx.Rollback()
		rows, err := tx.QueryContext(ctx, p.Rebind("SELECT "+p.QID+" FROM "+p.QTable+" WHERE "+where+" "+skip), all...)
		if err != nil {
			return 0, err
		}
		var free []any
		for rows.Next() {
			var id any
			if err := rows.Scan(&id); err != nil {
				rows.Close()
				return 0, err
			}
			free = append(free, id)
		}
		rows.Close()
		if err := rows.Err(); err != nil || len(free) == 0 {
			return 0, err
		}
		n, err := changeIDs(ctx, tx, p, "DELETE FROM "+p.QTable, nil, free, "", nil)
		if err != nil {
			return 0, err // rolled back
		}
		return n, tx.Commit()
	})
}

// byIDs runs head (an UPDATE's SET or a DELETE, headArgs its arguments)
// on the rows of ids that still meet cond (condArgs its arguments) and
// returns how many it changed (changeIDs); rows changed one statement
// each are changed in one transaction.
func (b *Broker) byIDs(ctx context.Context, p *core.Plan, head string, headArgs, ids []any, cond string, condArgs []any) (int64, error) {
	if !oneByOne(p) {
		return changeIDs(ctx, b.db, p, head, headArgs, ids, cond, condArgs)
	}
	tx, err := b.db.BeginTxx(ctx, nil)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback()
	n, err := changeIDs(ctx, tx, p, head, headArgs, ids, cond, condArgs)
	if err != nil {
		return 0, err
	}
	return n, tx.Commit()
}

// oneByOne reports whether the operations change p's rows one statement
// each. In the row-lock form a row in work is locked by its delivery's
// transaction for as long as its handler runs, and where a statement over
// a list of ids may scan the table (core.Features.ListScanWaits: MariaDB
// plans one on a small table, index hint or not) it waits for each such
// row it passes, though the row is not one of the list: until the lock
// wait timeout, then error 1205.
func oneByOne(p *core.Plan) bool {
	return p.Form == core.RowLock && p.Dialect.Features().ListScanWaits
}

// changeIDs runs head on q for the rows of ids that meet cond ("": every
// one) and returns how many it changed: one statement over the list, or,
// where oneByOne, one statement per row by its key, prepared once (one
// round trip a row, where a driver that prepares each statement with
// arguments takes three).
func changeIDs(ctx context.Context, q interface {
	ExecContext(context.Context, string, ...any) (sql.Result, error)
	PrepareContext(context.Context, string) (*sql.Stmt, error)
}, p *core.Plan, head string, headArgs, ids []any, cond string, condArgs []any) (int64, error) {
	and := ""
	if cond != "" {
		and = " AND " + cond
	}
	if !oneByOne(p) {
		all := append(append(append([]any{}, headArgs...), ids...), condArgs...)
		res, err := q.ExecContext(ctx, p.Rebind(head+" WHERE "+inIDs(p, len(ids))+and), all...)
		if err != nil {
			return 0, err
		}
		return res.RowsAffected()
	}
	stmt, err := q.PrepareContext(ctx, p.Rebind(head+" WHERE "+inIDs(p, 1)+and))
	if err != nil {
		return 0, err
	}
	defer stmt.Close()
	var n int64
	for _, id := range ids {
		res, err := stmt.ExecContext(ctx, append(append(append([]any{}, headArgs...), id), condArgs...)...)
		if err != nil {
			return 0, err
		}
		k, err := res.RowsAffected()
		if err != nil {
			return 0, err
		}
		n += k
	}
	return n, nil
}

// PruneParams says which done rows Prune removes.
type PruneParams struct {
	// OlderThan: rows done longer ago than this (by the host's clock).
	OlderThan time.Duration
	// BatchSize as in Select; default 1,000.
	BatchSize int
}

// Prune deletes t's done rows whose DoneAt is older than pp.OlderThan, in
// batches, and returns how many it deleted. A done row is never in work.
func (b *Broker) Prune(ctx context.Context, t Table, pp PruneParams) (int64, error) {
	if pp.OlderThan < 0 {
		return 0, fmt.Errorf("sqlxbroker: Prune: negative OlderThan %v", pp.OlderThan)
	}
	sel := Select{All: true, BatchSize: pp.BatchSize}
	if err := sel.check("Prune"); err != nil {
		return 0, err
	}
	p, err := b.opsPlan(ctx, t)
	if err != nil {
		return 0, err
	}
	if _, _, err := stateCond(p, &t, StateDone, core.Now()); err != nil {
		return 0, err
	}
	before := p.Time(core.Now().Add(-pp.OlderThan))
	pt := t
	return b.prune(ctx, p, &pt, sel, before)
}

func (b *Broker) prune(ctx context.Context, p *core.Plan, t *Table, sel Select, before any) (int64, error) {
	var total int64
	for {
		if err := ctx.Err(); err != nil {
			return total, err
		}
		cond, args, _ := stateCondAs(p, t, StateDone, core.Now(), "")
		cond += " AND " + p.QDoneAt + " < ?"
		args = append(args, before)
		var ids []any
		q := fmt.Sprintf("SELECT %s FROM %s WHERE %s ORDER BY %s LIMIT %d", p.QID, p.QTable, cond, p.QID, sel.BatchSize)
		if err := b.db.SelectContext(ctx, &ids, p.Rebind(q), args...); err != nil {
			return total, err
		}
		for i, id := range ids {
			if bs, ok := id.([]byte); ok {
				ids[i] = string(bs)
			}
		}
		if len(ids) == 0 {
			return total, nil
		}
		n, err := b.byIDs(ctx, p, "DELETE FROM "+p.QTable, nil, ids, cond, args)
		total += n
		if err != nil || len(ids) < sel.BatchSize {
			return total, err
		}
	}
}
