package core

import (
	"database/sql"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"
)

// Plan is a table description compiled for one dialect: the names the
// description gives, with defaults applied, their quoted forms, and the SQL
// fragments every form shares. The broker makes plans (the description is
// validated first, so every name is a plain identifier); a Plan is
// immutable.
type Plan struct {
	Dialect Dialect
	Caps    Capabilities
	Form    Form
	Key     *KeyTemplate // the advisory key template; nil in other forms

	// Table is the table's name as given ("jobs", "app.jobs"). The column
	// names follow, defaults applied: ID, Attempt and Order are never
	// empty; the others are "" when the description names none.
	Table                                            string
	ID, Attempt, Order                               string
	LockedUntil, Group, ReadyAt, DeadAt, DoneAt      string
	Lease                                            time.Duration      // the lease form's lease
	Isolation                                        sql.IsolationLevel // of claim transactions; LevelDefault: the dialect's
	QTable, QID, QAttempt, QOrder                    string             // quoted
	QLockedUntil, QGroup, QReadyAt, QDeadAt, QDoneAt string             // quoted; "" for none
	QKeyCols                                         []string           // the key template's columns, quoted

	// Alias is the alias claim statements give the table ("c").
	Alias string
}

// NewPlan completes p, whose names are checked identifiers, for d: its
// quoted names, the alias and d's capabilities.
func NewPlan(d Dialect, p Plan) *Plan {
	p.Dialect, p.Caps, p.Alias = d, CapabilitiesOf(d), "c"
	parts := strings.Split(p.Table, ".")
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
	p.QID, p.QAttempt, p.QOrder = q(p.ID), q(p.Attempt), q(p.Order)
	p.QLockedUntil, p.QGroup, p.QReadyAt, p.QDeadAt, p.QDoneAt = q(p.LockedUntil), q(p.Group), q(p.ReadyAt), q(p.DeadAt), q(p.DoneAt)
	p.QKeyCols = nil
	if p.Key != nil {
		for _, c := range p.Key.Columns() {
			p.QKeyCols = append(p.QKeyCols, q(c))
		}
	}
	return &p
}

// TimeColumns lists the timestamp columns the description names (lease,
// ready, dead, done), for dialects' DDL and column checks.
func (p *Plan) TimeColumns() []string {
	var out []string
	for _, c := range []string{p.LockedUntil, p.ReadyAt, p.DeadAt, p.DoneAt} {
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
	return now.Add(2 * p.Lease)
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

// FencePairs is the portable condition of Leaser.FenceLeases: the ids
// first, so the server reads (and locks) the batch's rows alone, by primary
// key, then the (id, token) pairs OR'ed. Pairs alone may make a server scan
// the table (MariaDB did, locking every row it passed).
func FencePairs(p *Plan, ids, tokens []any) (string, []any) {
	var b strings.Builder
	b.WriteString(p.QID + " IN (?" + strings.Repeat(", ?", len(ids)-1) + ") AND (")
	args := append(make([]any, 0, 3*len(ids)), ids...)
	for i := range ids {
		if i > 0 {
			b.WriteString(" OR ")
		}
		b.WriteString("(" + p.QID + " = ? AND " + p.QLockedUntil + " = ?)")
		args = append(args, ids[i], tokens[i])
	}
	b.WriteString(")")
	return b.String(), args
}
