package sqlxbroker

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/sqlxbroker/sqlxbroker/core"
)

// DefaultLease is the lease of a lease table that gives none.
const DefaultLease = 30 * time.Second

// Table describes a message table. Only Name is required; every column name
// has a default. The claim form follows from the description:
//
//   - neither LockedUntil nor AdvisoryLock: RowLock;
//   - LockedUntil names a column: Lease;
//   - AdvisoryLock holds a key template such as "accounts-{account}": Advisory.
//
// Naming both LockedUntil and AdvisoryLock is an error. Every identifier must
// match [A-Za-z_][A-Za-z0-9_]* (Name may be "schema.table") and is quoted by
// the dialect before it reaches SQL.
type Table struct {
	Name string // the table, e.g. "jobs" or "app.jobs"

	ID      string // primary key column; default "id"
	Attempt string // attempt column (integer, new rows hold 1); default "attempt"

	// Order is the claim order (which FIFO groups keep too): a column, or
	// a comma-separated list of columns each optionally followed by ASC or
	// DESC, e.g. "priority DESC, id"; default ID. An order of more than
	// one plain column that does not name ID ends with it (ascending), so
	// no two rows tie. Order columns must be NOT NULL.
	Order string

	// LockedUntil names the lease column (a timestamp written with the
	// host's clock) and selects the Lease form. NULL or a time past is no
	// lease held. Broker.CreateTable gives it a default long past
	// (1970-01-01) rather than NULL: a claim then writes a value of the
	// same length, which PostgreSQL keeps on the row's page and InnoDB
	// writes in place (docs/operations.md, "The lease column's default").
	LockedUntil string
	// Lease is the lease duration in whole seconds; default DefaultLease.
	Lease time.Duration

	// AdvisoryLock is a key template and selects the Advisory form. Each
	// {col} is replaced by the row's value of col; "{{" and "}}" stand for
	// literal braces.
	AdvisoryLock string

	// Group names the FIFO group column. A claim takes only the head of a
	// group (the unfinished row with the lowest Order), and nothing of a
	// group while another of its rows is in work. A NULL group is no group.
	Group string

	// ReadyAt names an optional timestamp column: a row is claimable once
	// it is NULL or not after the host's clock. A failed delivery is
	// returned with ReadyAt set to its retry time.
	ReadyAt string

	// DeadAt names a timestamp column that marks dead rows (NULL: alive).
	// Required when MaxAttempts is set: a row that fails its last attempt
	// is kept with DeadAt set instead of being returned.
	DeadAt string
	// MaxAttempts is the number of deliveries a row gets; 0: unlimited.
	MaxAttempts int

	// DoneAt names an optional timestamp column: when set, success marks
	// the row done instead of deleting it.
	DoneAt string

	// LastError names an optional text column that keeps why the row's
	// last delivery failed: written when a delivery is retried or goes
	// dead (the error's text, cut to LastErrorLimit bytes), left as it is
	// by success and snoozes. Give it room for LastErrorLimit bytes (text,
	// or VARCHAR(2000) and more).
	LastError string

	// Metadata names an optional text column that carries a message's
	// metadata from its publisher to its handlers: Publish writes what the
	// broker's MetadataFunc returns there (see Broker.SetMetadataFunc) and
	// Delivery.Metadata reads it back. Its usual content is the
	// publisher's trace context (package otelbroker).
	Metadata string

	// Isolation is the isolation level of claim transactions; the zero
	// value lets the dialect choose (READ COMMITTED on MySQL and MariaDB).
	Isolation sql.IsolationLevel
}

// Form returns the claim form the description selects.
func (t *Table) Form() Form {
	switch {
	case t.AdvisoryLock != "":
		return Advisory
	case t.LockedUntil != "":
		return Lease
	}
	return RowLock
}

// LeaseDuration returns the lease, DefaultLease when none is given.
func (t *Table) LeaseDuration() time.Duration {
	if t.Lease == 0 {
		return DefaultLease
	}
	return t.Lease
}

// Col returns the name of a column of the description with defaults
// applied: ID, Attempt and Order are never empty.
func (t *Table) col(name, def string) string {
	if name == "" {
		return def
	}
	return name
}

// IDColumn returns the primary key column.
func (t *Table) IDColumn() string { return t.col(t.ID, "id") }

// AttemptColumn returns the attempt column.
func (t *Table) AttemptColumn() string { return t.col(t.Attempt, "attempt") }

// OrderColumn returns the claim order's first column.
func (t *Table) OrderColumn() string {
	if k, err := core.ParseOrder(t.Order, t.IDColumn()); err == nil {
		return k[0].Column
	}
	return t.col(t.Order, t.IDColumn())
}

// orderColumns returns the claim order's columns (the ID appended where
// the order ends with it).
func (t *Table) orderColumns() []string {
	k, err := core.ParseOrder(t.Order, t.IDColumn())
	if err != nil {
		return []string{t.col(t.Order, t.IDColumn())}
	}
	out := make([]string, len(k))
	for i := range k {
		out[i] = k[i].Column
	}
	return out
}

// Validate checks the description on its own, without a database. Every
// failure is a *TableError naming the field.
func (t *Table) Validate() error {
	bad := func(field, format string, args ...any) error {
		return &TableError{Table: t.Name, Field: field, Reason: fmt.Sprintf(format, args...)}
	}
	if t.Name == "" {
		return bad("Name", "the table name is empty")
	}
	parts := strings.Split(t.Name, ".")
	if len(parts) > 2 {
		return bad("Name", "at most one schema qualifier is allowed")
	}
	for _, p := range parts {
		if err := core.CheckIdent(p); err != nil {
			return bad("Name", "%v", err)
		}
	}
	for _, c := range []struct{ field, name string }{
		{"ID", t.ID}, {"Attempt", t.Attempt}, {"LockedUntil", t.LockedUntil},
		{"Group", t.Group}, {"ReadyAt", t.ReadyAt}, {"DeadAt", t.DeadAt}, {"DoneAt", t.DoneAt},
		{"LastError", t.LastError}, {"Metadata", t.Metadata},
	} {
		if c.name == "" {
			continue
		}
		if err := core.CheckIdent(c.name); err != nil {
			return bad(c.field, "%v", err)
		}
	}
	if _, err := core.ParseOrder(t.Order, t.IDColumn()); err != nil {
		return bad("Order", "%v", err)
	}
	if t.LockedUntil != "" && t.AdvisoryLock != "" {
		return bad("AdvisoryLock", "a table takes one claim form: LockedUntil (lease) and AdvisoryLock both given")
	}
	if t.Lease != 0 {
		if t.LockedUntil == "" {
			return bad("Lease", "a lease duration needs a LockedUntil column")
		}
		if t.Lease < time.Second || t.Lease%time.Second != 0 {
			return bad("Lease", "%v is not a whole number of seconds (at least 1s)", t.Lease)
		}
	}
	if t.AdvisoryLock != "" {
		if _, err := core.ParseKeyTemplate(t.AdvisoryLock); err != nil {
			return &TableError{Table: t.Name, Field: "AdvisoryLock", Reason: "bad key template", Err: err}
		}
	}
	if t.MaxAttempts < 0 {
		return bad("MaxAttempts", "%d is negative", t.MaxAttempts)
	}
	if t.MaxAttempts > 0 && t.DeadAt == "" {
		return bad("DeadAt", "MaxAttempts needs a DeadAt column to keep dead rows in")
	}
	switch t.Isolation {
	case sql.LevelDefault, sql.LevelReadCommitted, sql.LevelRepeatableRead, sql.LevelSerializable:
	default:
		return bad("Isolation", "%v is not supported (use read committed, repeatable read or serializable)", t.Isolation)
	}
	return nil
}

// Columns returns every column the description names, defaults applied, in
// a stable order, with the field each comes from.
func (t *Table) Columns() [][2]string {
	out := [][2]string{{"ID", t.IDColumn()}, {"Attempt", t.AttemptColumn()}}
	for _, c := range t.orderColumns() {
		out = append(out, [2]string{"Order", c})
	}
	for _, c := range []struct{ field, name string }{
		{"LockedUntil", t.LockedUntil}, {"Group", t.Group}, {"ReadyAt", t.ReadyAt},
		{"DeadAt", t.DeadAt}, {"DoneAt", t.DoneAt}, {"LastError", t.LastError}, {"Metadata", t.Metadata},
	} {
		if c.name != "" {
			out = append(out, [2]string{c.field, c.name})
		}
	}
	if k, err := core.ParseKeyTemplate(t.AdvisoryLock); err == nil {
		for _, c := range k.Columns() {
			out = append(out, [2]string{"AdvisoryLock", c})
		}
	}
	return out
}

// NewPlan validates t and compiles it for dialect d, as Broker.Plan does:
// for dialect authors and tools; an application needs none.
func NewPlan(d core.Dialect, t Table) (*core.Plan, error) {
	if err := t.Validate(); err != nil {
		return nil, err
	}
	var key *core.KeyTemplate
	if t.AdvisoryLock != "" {
		key, _ = core.ParseKeyTemplate(t.AdvisoryLock) // Validate parsed it
	}
	order, _ := core.ParseOrder(t.Order, t.IDColumn()) // Validate parsed it
	p := core.NewPlan(d, core.Plan{Form: t.Form(), Key: key, Table: t.Name,
		ID: t.IDColumn(), Attempt: t.AttemptColumn(), OrderKeys: order,
		LockedUntil: t.LockedUntil, Group: t.Group, ReadyAt: t.ReadyAt, DeadAt: t.DeadAt, DoneAt: t.DoneAt,
		LastError: t.LastError, Metadata: t.Metadata, Lease: t.LeaseDuration(), Isolation: t.Isolation})
	if f := t.Form(); !p.Caps.Offers(f) {
		return nil, &FormError{Dialect: d.Name(), Form: f, Reason: formMissing[f]}
	}
	if t.Group != "" && p.Caps.GroupGuard == nil {
		return nil, &TableError{Table: t.Name, Field: "Group",
			Reason: fmt.Sprintf("dialect %s has no FIFO group guard (core.GroupGuard), so it cannot keep a group's order across brokers", d.Name())}
	}
	return p, nil
}

// formMissing says what a dialect lacks that does not offer a form.
var formMissing = map[Form]string{
	RowLock:  "the database has no row locks that skip locked rows",
	Lease:    "the dialect has no lease claim",
	Advisory: "the database has no advisory locks",
}

// checkLive reads the live table's columns (a query that returns no row,
// so nothing changes) and fails with a *TableError for a missing table or
// for each column the description names that the table lacks.
func checkLive(ctx context.Context, db sqlx.QueryerContext, t Table, p *core.Plan) error {
	rows, err := db.QueryxContext(ctx, "SELECT * FROM "+p.QTable+" WHERE 1=0")
	if err != nil {
		return &TableError{Table: t.Name, Field: "Name", Reason: "cannot read the table", Err: err}
	}
	cols, err := rows.Columns()
	rows.Close()
	if err != nil {
		return &TableError{Table: t.Name, Field: "Name", Reason: "cannot read the table's columns", Err: err}
	}
	have := map[string]bool{}
	for _, c := range cols {
		have[strings.ToLower(c)] = true
	}
	for _, c := range t.Columns() {
		if !have[strings.ToLower(c[1])] {
			return &TableError{Table: t.Name, Field: c[0],
				Reason: fmt.Sprintf("column %q does not exist (the table has %s)", c[1], strings.Join(cols, ", "))}
		}
	}
	return nil
}
