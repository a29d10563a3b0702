package sqlxbroker

import (
	"context"
	"database/sql"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/jmoiron/sqlx/reflectx"
	"github.com/sqlxbroker/sqlxbroker/core"
)

// Handler processes one delivery. A nil error completes the row; an error
// (or a panic) returns it for another attempt, or moves it to the dead state
// after the table's last attempt. ctx is cancelled when the delivery's hold
// on the row is lost (a lease that could not be renewed) or when the
// subscription stops without time to finish.
type Handler func(ctx context.Context, d *Delivery) error

// Delivery is one claimed row handed to a handler. It is valid while the
// handler runs.
type Delivery struct {
	row   *core.Row
	claim core.Claim
	table *Table // the subscription's description; nil for NewDelivery's
}

// Metadata returns the row's Metadata column (Table.Metadata) as text: what
// the publisher's MetadataFunc stored (Broker.SetMetadataFunc). It is ""
// when the table names no such column, the row holds NULL, or the
// delivery was made by NewDelivery.
func (d *Delivery) Metadata() string {
	if d.table == nil || d.table.Metadata == "" {
		return ""
	}
	v, ok := d.Value(d.table.Metadata)
	if !ok || v == nil {
		return ""
	}
	switch s := v.(type) {
	case string:
		return s
	case []byte:
		return string(s)
	}
	return fmt.Sprint(v)
}

// ReadyAt returns the row's ReadyAt column (Table.ReadyAt) as it stood when
// the row was claimed: the time the row became ready, which Publish sets to
// the publish time (or the Delay's end) and a retry to its retry time. ok
// is false when the table names no such column, the row holds NULL or a
// value that is not a time, or the delivery was made by NewDelivery.
func (d *Delivery) ReadyAt() (t time.Time, ok bool) {
	if d.table == nil || d.table.ReadyAt == "" {
		return time.Time{}, false
	}
	v, found := d.Value(d.table.ReadyAt)
	if !found || v == nil {
		return time.Time{}, false
	}
	switch x := v.(type) { // what the built-in drivers return, without reflection
	case time.Time:
		return x.UTC(), true
	case string:
		if t, err := time.Parse(textTime, x); err == nil {
			return t, true
		}
	case []byte:
		if t, err := time.Parse(textTime, string(x)); err == nil {
			return t, true
		}
	}
	if err := assignTime(&t, v); err != nil {
		return time.Time{}, false
	}
	return t, true
}

// textTime reads the UTC text the SQLite and MySQL dialects store.
const textTime = "2006-01-02 15:04:05.999999999"

// ID returns the row's primary key as the driver returned it.
func (d *Delivery) ID() any { return d.row.ID }

// Attempt returns the attempt this delivery is: 1 for the first delivery in
// every form, 2 for the first retry, and so on.
func (d *Delivery) Attempt() int { return d.row.Attempt }

// Key returns the advisory key held for the delivery ("" in other forms).
func (d *Delivery) Key() string { return d.row.Key }

// Columns returns the row's column names.
func (d *Delivery) Columns() []string { return d.row.Columns }

// Value returns a column's value as the driver returned it.
func (d *Delivery) Value(col string) (any, bool) {
	for i, c := range d.row.Columns {
		if strings.EqualFold(c, col) {
			return d.row.Values[i], true
		}
	}
	return nil, false
}

// Tx returns the delivery's open transaction in the row-lock form: writes
// through it commit together with the row's outcome, and are rolled back if
// the handler fails (a savepoint is taken the first time Tx is called).
// Other forms return ErrNoTx. Once the handler has returned, Tx returns
// sql.ErrTxDone: a delivery kept beyond its handler cannot write into the
// transaction of the next.
func (d *Delivery) Tx() (*sqlx.Tx, error) {
	if d.claim == nil {
		return nil, ErrNoTx
	}
	return d.claim.Tx()
}

// Scan copies the row into dest, a pointer to a struct whose fields carry
// sqlx `db` tags (untagged fields match their lower-cased name). Columns
// without a field are ignored.
func (d *Delivery) Scan(dest any) error {
	v := reflect.ValueOf(dest)
	if v.Kind() != reflect.Pointer || v.IsNil() || v.Elem().Kind() != reflect.Struct {
		return fmt.Errorf("sqlxbroker: Scan needs a non-nil pointer to a struct, got %T", dest)
	}
	fields := mapper.TraversalsByName(v.Type().Elem(), d.row.Columns)
	for i, trav := range fields {
		if len(trav) == 0 {
			continue
		}
		f := reflectx.FieldByIndexes(v.Elem(), trav)
		if err := assign(f, d.row.Values[i]); err != nil {
			return fmt.Errorf("sqlxbroker: Scan column %q into %s: %w", d.row.Columns[i], f.Type(), err)
		}
	}
	return nil
}

var scannerType = reflect.TypeFor[sql.Scanner]()

// assign converts a driver value into f, as database/sql would.
func assign(f reflect.Value, src any) error {
	if f.Addr().Type().Implements(scannerType) {
		return f.Addr().Interface().(sql.Scanner).Scan(src)
	}
	if src == nil {
		switch f.Kind() {
		case reflect.Pointer, reflect.Interface, reflect.Slice, reflect.Map:
			f.Set(reflect.Zero(f.Type()))
			return nil
		}
		return fmt.Errorf("NULL into a non-nullable field (use a pointer or sql.Null*)")
	}
	if f.Kind() == reflect.Pointer {
		n := reflect.New(f.Type().Elem())
		if err := assign(n.Elem(), src); err != nil {
			return err
		}
		f.Set(n)
		return nil
	}
	if f.Kind() == reflect.Interface {
		f.Set(reflect.ValueOf(src))
		return nil
	}
	sv := reflect.ValueOf(src)
	if sv.Type().AssignableTo(f.Type()) {
		f.Set(sv)
		return nil
	}
	text := func() (string, bool) {
		switch s := src.(type) {
		case string:
			return s, true
		case []byte:
			return string(s), true
		}
		return "", false
	}
	switch f.Kind() {
	case reflect.String:
		if s, ok := text(); ok {
			f.SetString(s)
			return nil
		}
		f.SetString(fmt.Sprint(src))
		return nil
	case reflect.Slice:
		if f.Type().Elem().Kind() == reflect.Uint8 {
			if s, ok := text(); ok {
				f.SetBytes([]byte(s))
				return nil
			}
		}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		if f.Type() == reflect.TypeFor[time.Duration]() {
			break
		}
		s := fmt.Sprint(src)
		if t, ok := text(); ok {
			s = t
		}
		n, err := strconv.ParseInt(s, 10, f.Type().Bits())
		if err != nil {
			return err
		}
		f.SetInt(n)
		return nil
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		s := fmt.Sprint(src)
		if t, ok := text(); ok {
			s = t
		}
		n, err := strconv.ParseUint(s, 10, f.Type().Bits())
		if err != nil {
			return err
		}
		f.SetUint(n)
		return nil
	case reflect.Float32, reflect.Float64:
		s := fmt.Sprint(src)
		if t, ok := text(); ok {
			s = t
		}
		n, err := strconv.ParseFloat(s, f.Type().Bits())
		if err != nil {
			return err
		}
		f.SetFloat(n)
		return nil
	case reflect.Bool:
		switch b := src.(type) {
		case int64:
			f.SetBool(b != 0)
			return nil
		}
		if s, ok := text(); ok {
			b, err := strconv.ParseBool(s)
			if err != nil {
				return err
			}
			f.SetBool(b)
			return nil
		}
	case reflect.Struct:
		if f.Type() == reflect.TypeFor[time.Time]() {
			if s, ok := text(); ok {
				for _, layout := range []string{"2006-01-02 15:04:05.999999999Z07:00", "2006-01-02 15:04:05.999999999", time.RFC3339Nano} {
					if t, err := time.Parse(layout, s); err == nil {
						f.Set(reflect.ValueOf(t))
						return nil
					}
				}
			}
		}
	}
	return fmt.Errorf("cannot convert %T", src)
}

// NewDelivery returns the delivery of a claim made by hand, as a handler
// would receive it: for the conformance suite and tools that drive a claim
// form themselves (Broker.Form). An application never needs it; its tests
// build deliveries with package sqlxbrokertest.
func NewDelivery(c core.Claim) *Delivery { return &Delivery{row: c.Row(), claim: c} }
