package sqlxbroker

import (
	"context"
	"fmt"
	"log/slog"
	"reflect"
	"sort"
	"strings"
	"sync"

	"github.com/jmoiron/sqlx"
	"github.com/jmoiron/sqlx/reflectx"
	"github.com/sqlxbroker/sqlxbroker/core"
	"github.com/sqlxbroker/sqlxbroker/forms"
)

// Broker publishes to and subscribes to message tables of one database.
type Broker struct {
	db      *sqlx.DB
	dialect core.Dialect

	mu    sync.Mutex
	local map[string]map[*Subscription]struct{} // in-process wake-ups by table
}

// Open returns a broker on db, with the dialect registered for
// db.DriverName().
func Open(db *sqlx.DB) (*Broker, error) {
	d, err := DialectOf(db)
	if err != nil {
		return nil, err
	}
	return OpenDialect(db, d), nil
}

// OpenDialect returns a broker on db that speaks dialect d.
func OpenDialect(db *sqlx.DB, d core.Dialect) *Broker {
	return &Broker{db: db, dialect: d, local: map[string]map[*Subscription]struct{}{}}
}

// DB returns the broker's database.
func (b *Broker) DB() *sqlx.DB { return b.db }

// Dialect returns the broker's dialect.
func (b *Broker) Dialect() core.Dialect { return b.dialect }

// Plan validates t and compiles it for the broker's dialect.
func (b *Broker) Plan(t Table) (*core.Plan, error) { return core.NewPlan(b.dialect, t) }

// Form returns the claim form t selects, bound to the broker's database.
// Subscribe drives one; tests and tools may drive one by hand.
func (b *Broker) Form(t Table) (core.ClaimForm, error) {
	p, err := b.Plan(t)
	if err != nil {
		return nil, err
	}
	return forms.New(b.db, p)
}

// Subscribe validates t against the live table, checks the server, and runs
// h for each row claimed until the subscription is stopped or ctx ends. A
// bad description fails here, before anything in the database changes.
func (b *Broker) Subscribe(ctx context.Context, t Table, h Handler, p SubscribeParams) (*Subscription, error) {
	f, err := b.Form(t)
	if err != nil {
		return nil, err
	}
	plan := f.Plan()
	var stopListen context.CancelFunc = func() {}
	if w := plan.Caps.Waker; w != nil && p.Wake == nil {
		var lctx context.Context
		lctx, stopListen = context.WithCancel(context.Background())
		if ch, err := w.Listen(lctx, b.db, plan); err == nil {
			p.Wake = ch
		} else {
			logger(p).Warn("sqlxbroker: wake-ups unavailable, polling only", "table", t.Name, "err", err)
		}
	}
	s, err := core.Subscribe(ctx, f, h, p)
	if err != nil {
		stopListen()
		return nil, err
	}
	b.mu.Lock()
	if b.local[t.Name] == nil {
		b.local[t.Name] = map[*Subscription]struct{}{}
	}
	b.local[t.Name][s] = struct{}{}
	b.mu.Unlock()
	go func() {
		<-s.Done()
		stopListen()
		b.mu.Lock()
		delete(b.local[t.Name], s)
		b.mu.Unlock()
	}()
	return s, nil
}

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
// tags, or a map[string]any. The ID column is left out when its field is
// zero, so the database assigns it; the attempt column is set to 1 when the
// message does not give it. All messages of one call must have the same
// columns.
func (b *Broker) Publish(ctx context.Context, q Execer, t Table, msgs ...any) error {
	if len(msgs) == 0 {
		return nil
	}
	p, err := b.Plan(t)
	if err != nil {
		return err
	}
	cols, rows, err := columnsOf(&t, msgs)
	if err != nil {
		return err
	}
	qcols := make([]string, len(cols))
	for i, c := range cols {
		qcols[i] = b.dialect.QuoteIdent(c)
	}
	limit := p.Dialect.Features().MaxParams
	if limit <= 0 {
		limit = maxParams
	}
	per := max(1, limit/len(cols))
	for start := 0; start < len(rows); start += per {
		chunk := rows[start:min(start+per, len(rows))]
		var sb strings.Builder
		sb.WriteString("INSERT INTO " + p.QTable + " (" + strings.Join(qcols, ", ") + ") VALUES ")
		tuple := "(?" + strings.Repeat(", ?", len(cols)-1) + ")"
		args := make([]any, 0, len(chunk)*len(cols))
		for i, r := range chunk {
			if i > 0 {
				sb.WriteString(", ")
			}
			sb.WriteString(tuple)
			args = append(args, r...)
		}
		if _, err := q.ExecContext(ctx, p.Rebind(sb.String()), args...); err != nil {
			return fmt.Errorf("sqlxbroker: publish to %s: %w", t.Name, err)
		}
	}
	if w := p.Caps.Waker; w != nil {
		if s, args := w.WakeStatement(p); s != "" {
			if _, err := q.ExecContext(ctx, p.Rebind(s), args...); err != nil {
				return fmt.Errorf("sqlxbroker: publish to %s: wake-up: %w", t.Name, err)
			}
		}
	}
	b.mu.Lock()
	for s := range b.local[t.Name] {
		s.Wake()
	}
	b.mu.Unlock()
	return nil
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
		} else if strings.Join(names, ",") != strings.Join(cols, ",") {
			return nil, nil, fmt.Errorf("sqlxbroker: publish to %s: message %d has columns %v, message 0 has %v", t.Name, i, names, cols)
		}
		rows = append(rows, vals)
	}
	return cols, rows, nil
}

func fieldsOf(t *Table, m any) ([]string, []any, error) {
	var names []string
	var vals []any
	add := func(name string, v any) error {
		if err := core.CheckIdent(name); err != nil {
			return fmt.Errorf("column: %w", err)
		}
		names = append(names, name)
		vals = append(vals, v)
		return nil
	}
	hasAttempt := false
	switch v := m.(type) {
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if err := add(k, v[k]); err != nil {
				return nil, nil, err
			}
			hasAttempt = hasAttempt || strings.EqualFold(k, t.AttemptColumn())
		}
	default:
		rv := reflect.Indirect(reflect.ValueOf(m))
		if rv.Kind() != reflect.Struct {
			return nil, nil, fmt.Errorf("a message must be a struct or map[string]any, got %T", m)
		}
		fm := mapper.TypeMap(rv.Type())
		for _, fi := range fm.Index {
			if fi.Embedded || len(fi.Children) > 0 && fi.Field.Type.Kind() == reflect.Struct && fi.Field.Type.String() != "time.Time" {
				continue
			}
			if fi.Parent != nil && fi.Parent.Field.Type != nil && !fi.Parent.Embedded {
				continue
			}
			fv := reflectx.FieldByIndexesReadOnly(rv, fi.Index)
			if strings.EqualFold(fi.Name, t.IDColumn()) && fv.IsZero() {
				continue
			}
			if strings.EqualFold(fi.Name, t.AttemptColumn()) {
				hasAttempt = true
				if fv.IsZero() {
					if err := add(fi.Name, 1); err != nil {
						return nil, nil, err
					}
					continue
				}
			}
			if err := add(fi.Name, fv.Interface()); err != nil {
				return nil, nil, err
			}
		}
	}
	if !hasAttempt {
		if err := add(t.AttemptColumn(), 1); err != nil {
			return nil, nil, err
		}
	}
	return names, vals, nil
}

// TableDDL returns the statements that create the recommended table and
// indexes for t, with payload columns given as name and portable type
// ("text", "bigint", "int", "bool", "timestamp", "bytes").
func (b *Broker) TableDDL(t Table, payload ...[2]string) ([]string, error) {
	p, err := b.Plan(t)
	if err != nil {
		return nil, err
	}
	c := p.Caps.TableCreator
	if c == nil {
		return nil, fmt.Errorf("sqlxbroker: dialect %s cannot create tables", b.dialect.Name())
	}
	for _, col := range payload {
		if err := core.CheckIdent(col[0]); err != nil {
			return nil, fmt.Errorf("sqlxbroker: payload column: %w", err)
		}
	}
	return c.CreateTable(&core.DDLParams{Plan: p, Payload: payload})
}

// CreateTable runs TableDDL's statements. The broker runs no DDL unless
// asked to here.
func (b *Broker) CreateTable(ctx context.Context, t Table, payload ...[2]string) error {
	stmts, err := b.TableDDL(t, payload...)
	if err != nil {
		return err
	}
	for _, s := range stmts {
		if _, err := b.db.ExecContext(ctx, s); err != nil {
			return fmt.Errorf("sqlxbroker: create table %s: %w\n%s", t.Name, err, s)
		}
	}
	return nil
}

func logger(p SubscribeParams) *slog.Logger {
	if p.Logger != nil {
		return p.Logger
	}
	return slog.Default()
}
