package core

import (
	"database/sql"
	"fmt"
	"regexp"
	"strings"
	"time"
)

// Form names a claim form: what holds a row while its handler runs.
type Form int

const (
	// RowLock: SELECT .. FOR UPDATE SKIP LOCKED in a transaction that stays
	// open while the handler runs; completion and COMMIT change the row and
	// its outcome at once. The form of a table that names no other.
	RowLock Form = iota + 1
	// Lease: a deadline written into the row's lease column and committed at
	// once; completion takes effect only while the row still holds it.
	Lease
	// Advisory: a database advisory lock on a key built from the row,
	// held on the delivery's own connection until completion.
	Advisory
)

// Forms lists every claim form in a stable order.
var Forms = []Form{RowLock, Lease, Advisory}

func (f Form) String() string {
	switch f {
	case RowLock:
		return "row-lock"
	case Lease:
		return "lease"
	case Advisory:
		return "advisory"
	}
	return fmt.Sprintf("Form(%d)", int(f))
}

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

	// Order is the column claims order by (and FIFO groups keep); default ID.
	Order string

	// LockedUntil names the lease column (a timestamp written with the
	// host's clock) and selects the Lease form.
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

// OrderColumn returns the claim order column.
func (t *Table) OrderColumn() string { return t.col(t.Order, t.IDColumn()) }

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// MaxIdentLength is the longest identifier accepted (PostgreSQL's limit).
const MaxIdentLength = 63

// CheckIdent reports whether s is a plain identifier.
func CheckIdent(s string) error {
	switch {
	case s == "":
		return fmt.Errorf("empty identifier")
	case len(s) > MaxIdentLength:
		return fmt.Errorf("identifier %q is longer than %d characters", s, MaxIdentLength)
	case !identRE.MatchString(s):
		return fmt.Errorf("identifier %q must match [A-Za-z_][A-Za-z0-9_]*", s)
	}
	return nil
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
		if err := CheckIdent(p); err != nil {
			return bad("Name", "%v", err)
		}
	}
	for _, c := range []struct{ field, name string }{
		{"ID", t.ID}, {"Attempt", t.Attempt}, {"Order", t.Order}, {"LockedUntil", t.LockedUntil},
		{"Group", t.Group}, {"ReadyAt", t.ReadyAt}, {"DeadAt", t.DeadAt}, {"DoneAt", t.DoneAt},
	} {
		if c.name == "" {
			continue
		}
		if err := CheckIdent(c.name); err != nil {
			return bad(c.field, "%v", err)
		}
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
		if _, err := ParseKeyTemplate(t.AdvisoryLock); err != nil {
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
	out := [][2]string{{"ID", t.IDColumn()}, {"Attempt", t.AttemptColumn()}, {"Order", t.OrderColumn()}}
	for _, c := range []struct{ field, name string }{
		{"LockedUntil", t.LockedUntil}, {"Group", t.Group}, {"ReadyAt", t.ReadyAt},
		{"DeadAt", t.DeadAt}, {"DoneAt", t.DoneAt},
	} {
		if c.name != "" {
			out = append(out, [2]string{c.field, c.name})
		}
	}
	if k, err := ParseKeyTemplate(t.AdvisoryLock); err == nil {
		for _, c := range k.Columns() {
			out = append(out, [2]string{"AdvisoryLock", c})
		}
	}
	return out
}

// KeyTemplate is a parsed advisory key template.
type KeyTemplate struct {
	parts []keyPart
}

type keyPart struct {
	lit string
	col string // non-empty: a column reference
}

// ParseKeyTemplate parses "text{col}text". "{{" and "}}" are literal braces;
// a template must reference at least one column.
func ParseKeyTemplate(s string) (*KeyTemplate, error) {
	if s == "" {
		return nil, fmt.Errorf("empty key template")
	}
	k := &KeyTemplate{}
	var lit strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '{' && i+1 < len(s) && s[i+1] == '{':
			lit.WriteByte('{')
			i++
		case c == '}' && i+1 < len(s) && s[i+1] == '}':
			lit.WriteByte('}')
			i++
		case c == '{':
			end := strings.IndexByte(s[i+1:], '}')
			if end < 0 {
				return nil, fmt.Errorf("key template %q: unclosed '{' at offset %d", s, i)
			}
			col := s[i+1 : i+1+end]
			if err := CheckIdent(col); err != nil {
				return nil, fmt.Errorf("key template %q: column at offset %d: %v", s, i, err)
			}
			if lit.Len() > 0 {
				k.parts = append(k.parts, keyPart{lit: lit.String()})
				lit.Reset()
			}
			k.parts = append(k.parts, keyPart{col: col})
			i += end + 1
		case c == '}':
			return nil, fmt.Errorf("key template %q: unmatched '}' at offset %d", s, i)
		default:
			lit.WriteByte(c)
		}
	}
	if lit.Len() > 0 {
		k.parts = append(k.parts, keyPart{lit: lit.String()})
	}
	if len(k.Columns()) == 0 {
		return nil, fmt.Errorf("key template %q references no column: every row would share one key", s)
	}
	return k, nil
}

// Columns returns the referenced columns in order of first use.
func (k *KeyTemplate) Columns() []string {
	var out []string
	seen := map[string]bool{}
	for _, p := range k.parts {
		if p.col != "" && !seen[p.col] {
			seen[p.col] = true
			out = append(out, p.col)
		}
	}
	return out
}

// Render builds a row's key from its column values. A NULL value renders
// as the empty string (documented: rows whose key columns are NULL share
// that part of the key); []byte renders as text.
func (k *KeyTemplate) Render(value func(col string) any) string {
	var b strings.Builder
	for _, p := range k.parts {
		if p.col == "" {
			b.WriteString(p.lit)
			continue
		}
		switch v := value(p.col).(type) {
		case nil:
		case []byte:
			b.Write(v)
		case string:
			b.WriteString(v)
		case time.Time:
			b.WriteString(v.UTC().Format(time.RFC3339Nano))
		default:
			fmt.Fprint(&b, v)
		}
	}
	return b.String()
}
