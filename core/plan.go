package core

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"
)

// Plan is a validated table description compiled for one dialect: quoted
// identifiers and the SQL fragments every form shares. A Plan is immutable.
type Plan struct {
	Table   Table
	Dialect Dialect
	Caps    Capabilities
	Key     *KeyTemplate // nil unless the Advisory form

	// Alias is the alias claim statements give the table ("c").
	Alias string

	QTable, QID, QAttempt, QOrder string
	// Optional columns, quoted; "" when the description names none.
	QLockedUntil, QGroup, QReadyAt, QDeadAt, QDoneAt string
	// QKeyCols are the key template's columns, quoted.
	QKeyCols []string
}

// NewPlan validates t and compiles it for d. It does not touch a database;
// CheckLive compares the plan with the live table.
func NewPlan(d Dialect, t Table) (*Plan, error) {
	if err := t.Validate(); err != nil {
		return nil, err
	}
	p := &Plan{Table: t, Dialect: d, Caps: CapabilitiesOf(d), Alias: "c"}
	parts := strings.Split(t.Name, ".")
	for i, s := range parts {
		parts[i] = d.QuoteIdent(s)
	}
	p.QTable = strings.Join(parts, ".")
	q := func(s string) string {
		if s == "" {
			return ""
		}
		return d.QuoteIdent(s)
	}
	p.QID, p.QAttempt, p.QOrder = q(t.IDColumn()), q(t.AttemptColumn()), q(t.OrderColumn())
	p.QLockedUntil, p.QGroup, p.QReadyAt, p.QDeadAt, p.QDoneAt =
		q(t.LockedUntil), q(t.Group), q(t.ReadyAt), q(t.DeadAt), q(t.DoneAt)
	if t.AdvisoryLock != "" {
		p.Key, _ = ParseKeyTemplate(t.AdvisoryLock) // Validate parsed it
		for _, c := range p.Key.Columns() {
			p.QKeyCols = append(p.QKeyCols, q(c))
		}
	}
	if f := t.Form(); !p.Caps.Offers(f) {
		return nil, &FormError{Dialect: d.Name(), Form: f, Reason: "the dialect does not implement it"}
	}
	if t.Group != "" && p.Caps.GroupGuard == nil && !d.Features().SingleWriter {
		return nil, &TableError{Table: t.Name, Field: "Group",
			Reason: fmt.Sprintf("dialect %s has no FIFO group guard and is not single-writer", d.Name())}
	}
	return p, nil
}

// CheckLive reads the live table's columns (a query that returns no row,
// so nothing changes) and fails with a *TableError for a missing table or
// for each column the description names that the table lacks.
func (p *Plan) CheckLive(ctx context.Context, db sqlx.QueryerContext) error {
	rows, err := db.QueryxContext(ctx, "SELECT * FROM "+p.QTable+" WHERE 1=0")
	if err != nil {
		return &TableError{Table: p.Table.Name, Field: "Name", Reason: "cannot read the table", Err: err}
	}
	cols, err := rows.Columns()
	rows.Close()
	if err != nil {
		return &TableError{Table: p.Table.Name, Field: "Name", Reason: "cannot read the table's columns", Err: err}
	}
	have := map[string]bool{}
	for _, c := range cols {
		have[strings.ToLower(c)] = true
	}
	for _, c := range p.Table.Columns() {
		if !have[strings.ToLower(c[1])] {
			return &TableError{Table: p.Table.Name, Field: c[0],
				Reason: fmt.Sprintf("column %q does not exist (the table has %s)", c[1], strings.Join(cols, ", "))}
		}
	}
	return nil
}

// TimeColumns lists the timestamp columns the description names (lease,
// ready, dead, done), for dialects' DDL and column checks.
func (p *Plan) TimeColumns() []string {
	var out []string
	for _, c := range []string{p.Table.LockedUntil, p.Table.ReadyAt, p.Table.DeadAt, p.Table.DoneAt} {
		if c != "" {
			out = append(out, c)
		}
	}
	return out
}

// Rebind turns '?' placeholders into the dialect's.
func (p *Plan) Rebind(q string) string { return sqlx.Rebind(p.Dialect.BindType(), q) }

// Now returns the host clock as the library uses it: UTC, microseconds.
func Now() time.Time { return time.Now().UTC().Truncate(time.Microsecond) }

// Time encodes a host time for the dialect.
func (p *Plan) Time(t time.Time) any { return p.Dialect.EncodeTime(t.UTC().Truncate(time.Microsecond)) }

// col qualifies a quoted column with an alias ("" for none).
func col(alias, qcol string) string {
	if alias == "" {
		return qcol
	}
	return alias + "." + qcol
}

// Unfinished is the condition over alias that a row is neither dead nor done.
func (p *Plan) Unfinished(alias string) string {
	var c []string
	if p.QDeadAt != "" {
		c = append(c, col(alias, p.QDeadAt)+" IS NULL")
	}
	if p.QDoneAt != "" {
		c = append(c, col(alias, p.QDoneAt)+" IS NULL")
	}
	if len(c) == 0 {
		return "1=1"
	}
	return strings.Join(c, " AND ")
}

// Ready returns the condition over alias that a row may be claimed at now,
// apart from what holds it: unfinished, ready, and for a lease table not
// leased; for a FIFO table also the head of its group. Args bind the '?'s.
//
// A lease deadline more than two leases ahead of now cannot have been
// written by a live subscription whose clock is within a lease of this
// host's, so it counts as expired: the row is claimed, and the completion
// of whoever wrote it finds ErrLeaseLost.
func (p *Plan) Ready(alias string, now time.Time) (string, []any) {
	cond := []string{p.Unfinished(alias)}
	var args []any
	if p.QReadyAt != "" {
		cond = append(cond, "("+col(alias, p.QReadyAt)+" IS NULL OR "+col(alias, p.QReadyAt)+" <= ?)")
		args = append(args, p.Time(now))
	}
	if p.QLockedUntil != "" {
		lu := col(alias, p.QLockedUntil)
		cond = append(cond, "("+lu+" IS NULL OR "+lu+" <= ? OR "+lu+" > ?)")
		args = append(args, p.Time(now), p.Time(p.danglingAfter(now)))
	}
	if p.QGroup != "" {
		cond = append(cond, p.Head(alias))
	}
	return strings.Join(cond, " AND "), args
}

// LeaseHeld returns the condition over alias that a lease table's row is
// held by a live lease at now: its deadline is after now and not dangling
// (see Ready). Args bind the '?'s.
func (p *Plan) LeaseHeld(alias string, now time.Time) (string, []any) {
	lu := col(alias, p.QLockedUntil)
	return "(" + lu + " > ? AND " + lu + " <= ?)", []any{p.Time(now), p.Time(p.danglingAfter(now))}
}

// danglingAfter is the latest deadline a live subscription of the table can
// have written by now, with a lease of clock skew to spare: a deadline
// further ahead (a clock that jumped forward, a hand-edited row) counts as
// expired, so the row is not stranded until then.
func (p *Plan) danglingAfter(now time.Time) time.Time {
	return now.Add(2 * p.Table.LeaseDuration())
}

// NextAttempt is the attempt column over alias after one more count. A
// NULL or an attempt below 1 (a row that breaks the contract) counts as a
// new row's 1, so it becomes 2.
func (p *Plan) NextAttempt(alias string) string {
	a := col(alias, p.QAttempt)
	return "CASE WHEN " + a + " IS NULL OR " + a + " < 1 THEN 2 ELSE " + a + " + 1 END"
}

// Head is the condition over alias that the row is the head of its FIFO
// group: no unfinished row of the group comes before it.
func (p *Plan) Head(alias string) string {
	return "NOT EXISTS (SELECT 1 FROM " + p.QTable + " h WHERE h." + p.QGroup + " = " + col(alias, p.QGroup) +
		" AND h." + p.QOrder + " < " + col(alias, p.QOrder) + " AND " + p.Unfinished("h") + ")"
}

// OrderBy is the ORDER BY list of claims over alias.
func (p *Plan) OrderBy(alias string) string { return col(alias, p.QOrder) }
