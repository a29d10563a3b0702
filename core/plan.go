package core

import (
	"bytes"
	"database/sql"
	"reflect"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"
)

// Plan is a validated table description compiled for one dialect: its
// names with defaults applied, quoted, and the SQL fragments every form
// shares. The broker makes plans; a Plan is immutable.
type Plan struct {
	Dialect Dialect
	Caps    Capabilities
	Form    Form
	Key     *KeyTemplate // the advisory key template; nil in other forms

	// Table is the table's name as given ("jobs", "app.jobs"). The column
	// names follow, defaults applied: ID, Attempt and Order are never
	// empty; the others are "" when the description names none.
	Table                                            string
	ID, Attempt, Order                               string // Order: the first order key's column
	LockedUntil, Group, ReadyAt, DeadAt, DoneAt      string
	Lease                                            time.Duration      // the lease form's lease
	Isolation                                        sql.IsolationLevel // of claim transactions; LevelDefault: the dialect's
	QTable, QID, QAttempt, QOrder                    string             // quoted
	QLockedUntil, QGroup, QReadyAt, QDeadAt, QDoneAt string             // quoted; "" for none
	QKeyCols                                         []string           // the key template's columns, quoted

	// OrderKeys is the claim order (ParseOrder), at least one key; a
	// plan made with none orders by Order alone, ascending.
	OrderKeys []OrderKey

	// LastError names the column that keeps a failed delivery's error
	// (OutcomeKind); "" for none. QLastError is it quoted.
	LastError, QLastError string

	// Metadata names the column that carries a message's metadata from
	// its publisher to its handlers (a text column); "" for none.
	// QMetadata is it quoted.
	Metadata, QMetadata string

	// Alias is the alias claim statements give the table ("c").
	Alias string
}

// NewPlan completes p (checked names) for d: quoted names, alias, caps.
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
	if len(p.OrderKeys) == 0 {
		p.OrderKeys = []OrderKey{{Column: p.Order}}
	}
	p.OrderKeys = append([]OrderKey(nil), p.OrderKeys...)
	for i := range p.OrderKeys {
		p.OrderKeys[i].Q = q(p.OrderKeys[i].Column)
	}
	p.Order = p.OrderKeys[0].Column
	p.QID, p.QAttempt, p.QOrder = q(p.ID), q(p.Attempt), q(p.Order)
	p.QLockedUntil, p.QGroup, p.QReadyAt, p.QDeadAt, p.QDoneAt = q(p.LockedUntil), q(p.Group), q(p.ReadyAt), q(p.DeadAt), q(p.DoneAt)
	p.QLastError, p.QMetadata = q(p.LastError), q(p.Metadata)
	p.QKeyCols = nil
	if p.Key != nil {
		for _, c := range p.Key.Columns() {
			p.QKeyCols = append(p.QKeyCols, q(c))
		}
	}
	return &p
}

// TimeColumns lists the lease, ready, dead and done columns named.
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

// Now is the host clock as the library uses it: UTC, microseconds.
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

// Ready is the condition over alias that a row may be claimed at now,
// apart from what holds it (unfinished, ready, not leased, a FIFO head),
// and its args. A lease more than two leases ahead of now, which no live
// subscription within a lease of this clock wrote, counts as expired.
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

// LeaseHeld is the condition over alias that a row holds a live lease at
// now (not dangling, see Ready), and its args.
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

// NextAttempt is the attempt over alias after one more count (a NULL or
// an attempt below 1 counts as 1, so it becomes 2).
func (p *Plan) NextAttempt(alias string) string {
	a := col(alias, p.QAttempt)
	return "CASE WHEN " + a + " IS NULL OR " + a + " < 1 THEN 2 ELSE " + a + " + 1 END"
}

// AttemptFence is the condition that holds for exactly the rows of ids
// whose attempt column still holds the value at the same index of
// attempts: what the advisory form fences a batch of successes with (an
// attempt is counted again by every take). The rows are grouped by
// attempt, each group matched with the dialect's MatchIDs; most batches
// are one group, rows taken for the first time. Its args bind its '?'s.
func (p *Plan) AttemptFence(ids, attempts []any) (string, []any) {
	byAttempt := map[any][]any{}
	var order []any
	for i, id := range ids {
		a := attempts[i]
		if _, ok := byAttempt[a]; !ok {
			order = append(order, a)
		}
		byAttempt[a] = append(byAttempt[a], id)
	}
	conds := make([]string, len(order))
	var args []any
	for i, a := range order {
		in, inArgs := p.Caps.MatchIDs(p, p.QID, byAttempt[a])
		conds[i] = "(" + p.QAttempt + " = ? AND " + in + ")"
		args = append(append(args, a), inArgs...)
	}
	return strings.Join(conds, " OR "), args
}

// Uncounted is the condition over alias that no claim has counted an
// attempt of the row yet (NextAttempt): its attempt is NULL or below 2, as
// a new row's is (a row released or snoozed has its count taken back).
func (p *Plan) Uncounted(alias string) string {
	a := col(alias, p.QAttempt)
	return "(" + a + " IS NULL OR " + a + " < 2)"
}

// PrevAttempt is the attempt over alias with the claim's count taken back
// (never below 1): a snoozed delivery of the forms that count at claim.
func (p *Plan) PrevAttempt(alias string) string {
	a := col(alias, p.QAttempt)
	return "CASE WHEN " + a + " > 1 THEN " + a + " - 1 ELSE 1 END"
}

// Head is the condition over alias that no unfinished row of the row's
// FIFO group comes before it.
func (p *Plan) Head(alias string) string {
	return "NOT EXISTS (SELECT 1 FROM " + p.QTable + " h WHERE h." + p.QGroup + " = " + col(alias, p.QGroup) +
		" AND " + p.before("h", alias) + " AND " + p.Unfinished("h") + ")"
}

// FencePairs is the portable Leaser.FenceLeases: the ids first, so the
// server finds the rows by key (pairs alone made MariaDB scan and lock the
// table), then the (id, token) pairs OR'ed. The pairs stay even when every
// row holds one token: MariaDB ran "id IN (..) AND token = ?" as one range
// over the primary key that locked rows past the list, and a claim's
// UPDATE then deadlocked with it.
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

// SameTokens reports whether every token equals the first: encoded times
// (time.Time compared with Equal), text, bytes or numbers. A completion
// batch mostly holds the rows of one claim, which share its deadline.
func SameTokens(tokens []any) bool {
	if len(tokens) == 0 {
		return false
	}
	for _, t := range tokens[1:] {
		if !sameValue(tokens[0], t) {
			return false
		}
	}
	return true
}

func sameValue(a, b any) bool {
	switch x := a.(type) {
	case time.Time:
		y, ok := b.(time.Time)
		return ok && x.Equal(y)
	case []byte:
		y, ok := b.([]byte)
		return ok && bytes.Equal(x, y)
	}
	if a == nil || b == nil || !reflect.TypeOf(a).Comparable() || reflect.TypeOf(a) != reflect.TypeOf(b) {
		return false
	}
	return a == b
}
