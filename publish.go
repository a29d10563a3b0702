package sqlxbroker

import (
	"context"
	"database/sql/driver"
	"fmt"
	"reflect"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/jmoiron/sqlx/reflectx"
	"github.com/sqlxbroker/sqlxbroker/core"
)

// Execer is what Publish writes through: a *sqlx.DB, or the caller's own
// *sqlx.Tx for a transactional outbox.
type Execer interface {
	sqlx.ExecerContext
}

// Publish inserts msgs into t's table through q, in as few statements as
// the driver's parameter limit allows. Pass the caller's transaction as q
// and the messages commit or roll back with the caller's own writes.
//
// A message is a struct (or pointer to one) whose fields carry sqlx `db`
// tags, or a map[string]any. Fields bind as sqlx binds them: a field whose
// type (or pointer to it) implements driver.Valuer, such as sql.NullString
// or sql.Null[T], is one column, and so is a time.Time; the fields of an
// embedded struct are columns of their own; a field tagged `db:"-"` is left
// out; the fields of a nil embedded pointer are NULL. A field Publish cannot bind as one column (a nested struct that is
// not a driver.Valuer, a map, a slice other than []byte, a channel, a
// function) fails the call with an error naming it, and nothing is
// inserted: no field is ever dropped silently.
//
// The ID column is left out when its field is zero, so the database
// assigns it; the attempt column is set to 1 when the message does not
// give it. When t names a ReadyAt column, a message that gives it no value
// (no such field or key, nil, a zero time.Time, a NULL driver.Valuer such
// as an invalid sql.NullTime) gets the publish time, so the row is ready
// at once and Counts.OldestReady tells how long the oldest ready row has
// waited. When t names a Metadata column and the broker has a
// MetadataFunc (SetMetadataFunc), a message that gives the column no value
// gets what the function returns for ctx. All messages of one call must
// have the same columns.
//
// Publish is PublishWith with zero PublishParams.
func (b *Broker) Publish(ctx context.Context, q Execer, t Table, msgs ...any) error {
	_, err := b.PublishWith(ctx, q, t, PublishParams{}, msgs...)
	return err
}

// MetadataFunc returns the metadata a message published with ctx carries
// to its handlers, as text (for example the W3C trace context of ctx's
// span); "" stores NULL. It is called once per Publish or PublishWith call,
// from the publisher's goroutine, and must be safe for concurrent use.
type MetadataFunc func(ctx context.Context) string

// SetMetadataFunc makes Publish and PublishWith fill the Metadata column of
// the rows they insert with f(ctx), on tables whose description names one
// (Table.Metadata); a message that gives the column a value keeps its own.
// Delivery.Metadata reads it back. A nil f sets none; a later call
// replaces the function of an earlier one. Package otelbroker sets one
// that stores the publisher's trace context.
func (b *Broker) SetMetadataFunc(f MetadataFunc) {
	if f == nil {
		b.metadata.Store(nil)
		return
	}
	b.metadata.Store(&f)
}

// PublishParams says when published rows become ready and which rows to
// skip. The zero value is Publish.
type PublishParams struct {
	// Delay makes the rows ready Delay after the host's clock at the call:
	// ReadyAt = now + Delay, in the dialect's encoding, compared with the
	// host clock as every claim does. It needs Table.ReadyAt. Setting both
	// Delay and ReadyAt is an error; a negative Delay is an error.
	Delay time.Duration
	// ReadyAt makes the rows ready at this host time (a time in the past
	// is ready at once). It needs Table.ReadyAt.
	//
	// Delay and ReadyAt win over a message's own ReadyAt value: with
	// either set, every row of the call gets it, whatever its message
	// carries in the ReadyAt column.
	ReadyAt time.Time
	// SkipDuplicates names a column with a unique constraint (or a unique
	// index of its own) that the messages insert: a row whose value is
	// already in the table, or in an earlier row of the same call, is
	// skipped, not an error, and the row already there is left as it is.
	// The dialect does it (core.DuplicateSkipper); a dialect without the
	// capability refuses the call with ErrUnsupported. The count
	// PublishWith returns is then the rows inserted. On MySQL and MariaDB
	// any unique key of the table, the primary key included, makes a row
	// a duplicate (ON DUPLICATE KEY): give the column the only unique key
	// apart from a database-assigned ID.
	SkipDuplicates string
}

// PublishWith is Publish with params: it inserts msgs as Publish does,
// ready at p.ReadyAt or after p.Delay, skipping duplicates of the column
// p.SkipDuplicates, and returns how many rows it inserted (len(msgs)
// without SkipDuplicates; on an error, a count is of no use: in the
// caller's transaction roll back, else some statements may have
// committed). The wake-up of subscribers runs as Publish's does, after the
// rows, in q.
//
// Errors before any statement: Delay and ReadyAt both set, or a negative
// Delay; Delay or ReadyAt on a table without a ReadyAt column, or a
// SkipDuplicates column that is not a valid name or not a column the
// messages insert (a *TableError naming the field); SkipDuplicates on a
// dialect without core.DuplicateSkipper (ErrUnsupported).
func (b *Broker) PublishWith(ctx context.Context, q Execer, t Table, p PublishParams, msgs ...any) (int64, error) {
	if len(msgs) == 0 {
		return 0, nil
	}
	pl, err := b.Plan(t)
	if err != nil {
		return 0, err
	}
	now := core.Now()
	readyAt, override, err := p.readyAt(&t, now)
	if err != nil {
		return 0, err
	}
	cols, rows, err := columnsOf(&t, msgs)
	if err != nil {
		return 0, err
	}
	if t.ReadyAt != "" {
		if cols, err = setColumn(&t, t.ReadyAt, cols, rows, pl.Time(readyAt), override); err != nil {
			return 0, err
		}
	}
	if f := b.metadata.Load(); f != nil && t.Metadata != "" {
		var md any
		if s := (*f)(ctx); s != "" {
			md = s
		}
		if cols, err = setColumn(&t, t.Metadata, cols, rows, md, false); err != nil {
			return 0, err
		}
	}
	insert, suffix := "INSERT INTO", ""
	if p.SkipDuplicates != "" {
		if insert, suffix, err = b.skipDuplicates(ctx, &t, pl, cols, p.SkipDuplicates); err != nil {
			return 0, err
		}
	}
	qcols := make([]string, len(cols))
	for i, c := range cols {
		qcols[i] = b.dialect.QuoteIdent(c)
	}
	limit := pl.Dialect.Features().MaxParams
	if limit <= 0 {
		limit = maxParams
	}
	per := max(1, limit/len(cols))
	var inserted int64
	for start := 0; start < len(rows); start += per {
		chunk := rows[start:min(start+per, len(rows))]
		var sb strings.Builder
		sb.WriteString(insert + " " + pl.QTable + " (" + strings.Join(qcols, ", ") + ") VALUES ")
		tuple := "(?" + strings.Repeat(", ?", len(cols)-1) + ")"
		args := make([]any, 0, len(chunk)*len(cols))
		for i, r := range chunk {
			if i > 0 {
				sb.WriteString(", ")
			}
			sb.WriteString(tuple)
			args = append(args, r...)
		}
		if suffix != "" {
			sb.WriteString(" " + suffix)
		}
		res, err := q.ExecContext(ctx, pl.Rebind(sb.String()), args...)
		if err != nil {
			return inserted, fmt.Errorf("sqlxbroker: publish to %s: %w", t.Name, err)
		}
		if p.SkipDuplicates == "" {
			inserted += int64(len(chunk))
			continue
		}
		n, err := res.RowsAffected()
		if err != nil {
			return inserted, fmt.Errorf("sqlxbroker: publish to %s: count the rows inserted: %w", t.Name, err)
		}
		inserted += n
	}
	if inserted > 0 {
		if w := pl.Caps.Waker; w != nil {
			if s, args := w.WakeStatement(pl); s != "" {
				if _, err := q.ExecContext(ctx, pl.Rebind(s), args...); err != nil {
					return inserted, fmt.Errorf("sqlxbroker: publish to %s: wake-up: %w", t.Name, err)
				}
			}
		}
		b.local.Wake(t.Name)
	}
	return inserted, nil
}

// readyAt checks p's time fields against t and returns the ReadyAt of the
// call's rows: override when p sets one, else now for the rows that give
// none.
func (p *PublishParams) readyAt(t *Table, now time.Time) (time.Time, bool, error) {
	switch {
	case p.Delay != 0 && !p.ReadyAt.IsZero():
		return time.Time{}, false, fmt.Errorf("sqlxbroker: publish to %s: PublishParams.Delay and PublishParams.ReadyAt are both set; give one", t.Name)
	case p.Delay < 0:
		return time.Time{}, false, fmt.Errorf("sqlxbroker: publish to %s: PublishParams.Delay %v is negative", t.Name, p.Delay)
	case p.Delay == 0 && p.ReadyAt.IsZero():
		return now, false, nil
	case t.ReadyAt == "":
		which := "Delay"
		if p.Delay == 0 {
			which = "ReadyAt"
		}
		return time.Time{}, false, &TableError{Table: t.Name, Field: "ReadyAt",
			Reason: fmt.Sprintf("PublishParams.%s needs a ReadyAt column to write the ready time to", which)}
	case p.Delay != 0:
		return now.Add(p.Delay), true, nil
	}
	return p.ReadyAt, true, nil
}

// setColumn writes v into the column col of rows (ReadyAt's encoded time,
// the metadata): of every row when override is set, else of the rows that
// give no value. A column the messages lack is added. It returns the
// columns.
func setColumn(t *Table, col string, cols []string, rows [][]any, v any, override bool) ([]string, error) {
	i := slices.IndexFunc(cols, func(c string) bool { return strings.EqualFold(c, col) })
	if i < 0 {
		cols = append(cols, col)
		for j := range rows {
			rows[j] = append(rows[j], v)
		}
		return cols, nil
	}
	for _, r := range rows {
		if override {
			r[i] = v
			continue
		}
		missing, err := noValue(r[i])
		if err != nil {
			return nil, fmt.Errorf("sqlxbroker: publish to %s: column %q: %w", t.Name, cols[i], err)
		}
		if missing {
			r[i] = v
		}
	}
	return cols, nil
}

// noValue reports whether v gives a column no value: nil, a nil pointer, a
// zero time.Time, or a driver.Valuer whose value is one of them.
func noValue(v any) (bool, error) {
	for range 4 { // a Valuer of a Valuer: a few levels are plenty
		switch x := v.(type) {
		case nil:
			return true, nil
		case time.Time:
			return x.IsZero(), nil
		case *time.Time:
			return x == nil || x.IsZero(), nil
		case driver.Valuer:
			if rv := reflect.ValueOf(x); rv.Kind() == reflect.Pointer && rv.IsNil() {
				return true, nil
			}
			dv, err := x.Value()
			if err != nil {
				return false, err
			}
			v = dv
			continue
		}
		rv := reflect.ValueOf(v)
		return rv.Kind() == reflect.Pointer && rv.IsNil(), nil
	}
	return false, nil
}

// skipDuplicates checks the SkipDuplicates column and asks the dialect how
// to skip its duplicates: the statement's start and suffix.
func (b *Broker) skipDuplicates(ctx context.Context, t *Table, pl *core.Plan, cols []string, col string) (string, string, error) {
	if err := core.CheckIdent(col); err != nil {
		return "", "", &TableError{Table: t.Name, Field: "SkipDuplicates", Reason: "PublishParams.SkipDuplicates", Err: err}
	}
	if !slices.ContainsFunc(cols, func(c string) bool { return strings.EqualFold(c, col) }) {
		return "", "", &TableError{Table: t.Name, Field: "SkipDuplicates",
			Reason: fmt.Sprintf("PublishParams.SkipDuplicates names %q, which the messages do not insert (they insert %s)", col, strings.Join(cols, ", "))}
	}
	ds := pl.Caps.DuplicateSkipper
	if ds == nil {
		return "", "", fmt.Errorf("%w: publish to %s: dialect %s cannot skip duplicates (it lacks the core.DuplicateSkipper capability), so PublishParams.SkipDuplicates is refused", core.ErrUnsupported, t.Name, b.dialect.Name())
	}
	sq, err := ds.SkipDuplicates(ctx, &core.SkipDuplicatesParams{Pool: b.pool, Plan: pl, Column: col})
	if err != nil {
		return "", "", fmt.Errorf("sqlxbroker: publish to %s: skip duplicates of %q: %w", t.Name, col, err)
	}
	insert := sq.Insert
	if insert == "" {
		insert = "INSERT INTO"
	}
	return insert, sq.Suffix, nil
}

// maxParams keeps one insert under every built-in driver's parameter limit,
// where the dialect gives no limit of its own (Features.MaxParams).
const maxParams = 30000

var mapper = reflectx.NewMapperFunc("db", strings.ToLower)

// columnsOf flattens msgs into columns and rows of values.
func columnsOf(t *Table, msgs []any) ([]string, [][]any, error) {
	var cols []string
	rows := make([][]any, 0, len(msgs))
	for i, m := range msgs {
		names, vals, err := fieldsOf(t, m)
		if err != nil {
			return nil, nil, fmt.Errorf("sqlxbroker: publish to %s: message %d: %w", t.Name, i, err)
		}
		if cols == nil {
			cols = names
			if len(cols) == 0 {
				return nil, nil, fmt.Errorf("sqlxbroker: publish to %s: message has no columns", t.Name)
			}
		} else if !slices.Equal(names, cols) {
			return nil, nil, fmt.Errorf("sqlxbroker: publish to %s: message %d has columns %v, message 0 has %v", t.Name, i, names, cols)
		}
		rows = append(rows, vals)
	}
	return cols, rows, nil
}

// fieldsOf returns the columns and values of one message.
func fieldsOf(t *Table, m any) ([]string, []any, error) {
	var names []string
	var vals []any
	hasAttempt := false
	add := func(name string, v any) {
		names = append(names, name)
		vals = append(vals, v)
	}
	switch v := m.(type) {
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if err := core.CheckIdent(k); err != nil {
				return nil, nil, fmt.Errorf("column: %w", err)
			}
			if err := bindable(reflect.ValueOf(v[k])); err != nil {
				return nil, nil, fmt.Errorf("column %q: %w", k, err)
			}
			add(k, v[k])
			hasAttempt = hasAttempt || strings.EqualFold(k, t.AttemptColumn())
		}
	default:
		rv := reflect.ValueOf(m)
		for rv.Kind() == reflect.Pointer && !rv.IsNil() {
			rv = rv.Elem()
		}
		if rv.Kind() != reflect.Struct {
			return nil, nil, fmt.Errorf("a message must be a struct or map[string]any, got %T", m)
		}
		fields, err := structColumns(rv.Type())
		if err != nil {
			return nil, nil, err
		}
		for _, f := range fields {
			fv, ok := fieldByIndex(rv, f.index)
			if !ok { // under a nil embedded pointer: NULL
				add(f.name, nil)
				continue
			}
			switch {
			case strings.EqualFold(f.name, t.IDColumn()) && fv.IsZero():
				continue
			case strings.EqualFold(f.name, t.AttemptColumn()):
				hasAttempt = true
				if fv.IsZero() {
					add(f.name, 1)
					continue
				}
			}
			v, err := f.value(fv)
			if err != nil {
				return nil, nil, fmt.Errorf("field %s (column %q): %w", f.path, f.name, err)
			}
			add(f.name, v)
		}
	}
	if !hasAttempt {
		add(t.AttemptColumn(), 1)
	}
	return names, vals, nil
}

// fieldByIndex is the field at index of v, and false when a nil embedded
// pointer lies on the way.
func fieldByIndex(v reflect.Value, index []int) (reflect.Value, bool) {
	for i, x := range index {
		if i > 0 && v.Kind() == reflect.Pointer {
			if v.IsNil() {
				return reflect.Value{}, false
			}
			v = v.Elem()
		}
		v = v.Field(x)
	}
	return v, true
}

// structField is one column of a message struct: its name, where it is,
// and how its value is read.
type structField struct {
	name  string
	path  string // Go field path, for errors: "Meta.Note"
	index []int
	// byPtr: only the field's pointer implements driver.Valuer.
	byPtr bool
	// dynamic: an interface field, checked value by value.
	dynamic bool
}

// value reads the column's value from fv.
func (f *structField) value(fv reflect.Value) (any, error) {
	switch {
	case f.byPtr:
		p := reflect.New(fv.Type())
		p.Elem().Set(fv)
		return p.Interface(), nil
	case f.dynamic:
		if fv.IsNil() {
			return nil, nil
		}
		if err := bindable(fv.Elem()); err != nil {
			return nil, err
		}
		return fv.Elem().Interface(), nil
	}
	return fv.Interface(), nil
}

var structColumnsCache sync.Map // reflect.Type -> []structField or error

// structColumns lists the columns of a message struct type as sqlx binds
// its fields, or an error naming the first field that cannot be bound as
// one column. The answer is kept per type.
func structColumns(typ reflect.Type) ([]structField, error) {
	if v, ok := structColumnsCache.Load(typ); ok {
		if err, bad := v.(error); bad {
			return nil, err
		}
		return v.([]structField), nil
	}
	fields, err := walkColumns(typ)
	if err != nil {
		structColumnsCache.Store(typ, err)
		return nil, err
	}
	structColumnsCache.Store(typ, fields)
	return fields, nil
}

var (
	valuerType = reflect.TypeFor[driver.Valuer]()
	timeType   = reflect.TypeFor[time.Time]()
)

// walkColumns is structColumns without the cache. sqlx's mapper lists every
// field, nested ones included; a field is a column when it is a
// driver.Valuer (its own fields are then not columns), a time.Time, or a
// scalar, a []byte, an interface or a pointer to one of them. An embedded
// struct's fields are columns of the message; any other struct must be a
// driver.Valuer.
func walkColumns(typ reflect.Type) ([]structField, error) {
	fm := mapper.TypeMap(typ)
	var out []structField
	isColumn := map[*reflectx.FieldInfo]bool{}
	for _, fi := range fm.Index {
		if fi.Field.Type == nil {
			continue
		}
		// A field inside a column (the String of a sql.NullString) is
		// part of that column's value.
		inside := false
		for p := fi.Parent; p != nil && p.Field.Type != nil; p = p.Parent {
			if isColumn[p] {
				inside = true
				break
			}
		}
		if inside {
			continue
		}
		ft := fi.Field.Type
		path := fieldPath(fi)
		switch {
		case ft.Implements(valuerType):
			out = append(out, structField{name: fi.Name, path: path, index: fi.Index})
			isColumn[fi] = true
		case reflect.PointerTo(ft).Implements(valuerType):
			out = append(out, structField{name: fi.Name, path: path, index: fi.Index, byPtr: true})
			isColumn[fi] = true
		case fi.Embedded && (ft.Kind() == reflect.Struct || ft.Kind() == reflect.Pointer && ft.Elem().Kind() == reflect.Struct):
			// Its fields are the message's own columns.
		case ft.Kind() == reflect.Interface:
			out = append(out, structField{name: fi.Name, path: path, index: fi.Index, dynamic: true})
			isColumn[fi] = true
		default:
			if err := bindableType(ft); err != nil {
				return nil, fmt.Errorf("field %s (column %q) of %s: %w", path, fi.Name, typ, err)
			}
			out = append(out, structField{name: fi.Name, path: path, index: fi.Index})
			isColumn[fi] = true
		}
	}
	for _, f := range out {
		if err := core.CheckIdent(f.name); err != nil {
			return nil, fmt.Errorf("field %s of %s: column: %w", f.path, typ, err)
		}
	}
	return out, nil
}

// fieldPath is the Go path of a field, e.g. "Meta.Note".
func fieldPath(fi *reflectx.FieldInfo) string {
	parts := []string{fi.Field.Name}
	for p := fi.Parent; p != nil && p.Field.Type != nil; p = p.Parent {
		parts = append([]string{p.Field.Name}, parts...)
	}
	return strings.Join(parts, ".")
}

// bindableType reports whether database/sql binds values of type t as one
// argument: a driver.Valuer, a time.Time, a bool, number or string kind, a
// []byte, or a pointer to one of them (nil binds as NULL).
func bindableType(t reflect.Type) error {
	switch {
	case t.Implements(valuerType), reflect.PointerTo(t).Implements(valuerType), t == timeType:
		return nil
	}
	switch t.Kind() {
	case reflect.Bool, reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64,
		reflect.Float32, reflect.Float64, reflect.String, reflect.Interface:
		return nil
	case reflect.Slice:
		if t.Elem().Kind() == reflect.Uint8 {
			return nil
		}
	case reflect.Pointer:
		return bindableType(t.Elem())
	case reflect.Struct:
		return fmt.Errorf("a %s is a struct that is not a driver.Valuer, so it is not one column: implement driver.Valuer, embed it, or tag the field `db:\"-\"`", t)
	}
	return fmt.Errorf("a %s cannot be bound as one column (implement driver.Valuer, or tag the field `db:\"-\"`)", t)
}

// bindable is bindableType for a dynamic value; nil is NULL.
func bindable(v reflect.Value) error {
	if !v.IsValid() {
		return nil
	}
	if v.Kind() == reflect.Interface {
		if v.IsNil() {
			return nil
		}
		return bindable(v.Elem())
	}
	return bindableType(v.Type())
}
