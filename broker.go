package sqlxbroker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/jmoiron/sqlx"
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

// Plan validates t and compiles it for the broker's dialect. Dialect
// authors and tools use plans; an application needs none.
func (b *Broker) Plan(t Table) (*core.Plan, error) { return NewPlan(b.dialect, t) }

// Form returns the claim form t selects, bound to the broker's database,
// for driving claims by hand (the conformance suite, tools); Subscribe
// drives one for an application. Its Start checks the server and the live
// table first, as Subscribe does.
func (b *Broker) Form(t Table) (core.ClaimForm, error) {
	p, err := b.Plan(t)
	if err != nil {
		return nil, err
	}
	return &checkedForm{ClaimForm: forms.New(b.db, p), b: b, t: t, p: p}, nil
}

// checkedForm is a form whose Start checks the server and the table first.
type checkedForm struct {
	core.ClaimForm
	b *Broker
	t Table
	p *core.Plan
}

// Unwrap returns the form itself, for the forms' own tests.
func (f *checkedForm) Unwrap() core.ClaimForm { return f.ClaimForm }

func (f *checkedForm) Start(ctx context.Context) error {
	if err := f.b.check(ctx, f.t, f.p); err != nil {
		return err
	}
	return f.ClaimForm.Start(ctx)
}

// check checks the server (a DSN the dialect refuses, a version too old
// for the form), then the description against the live table.
func (b *Broker) check(ctx context.Context, t Table, p *core.Plan) error {
	if c := p.Caps.ServerChecker; c != nil {
		if err := c.CheckServer(ctx, b.db, p.Form); err != nil {
			if errors.Is(err, ErrServerTooOld) {
				// A bad description is named as such on any server.
				if lerr := checkLive(ctx, b.db, t, p); lerr != nil {
					return lerr
				}
			}
			return err
		}
	}
	if err := checkLive(ctx, b.db, t, p); err != nil {
		return err
	}
	if c := p.Caps.TableChecker; c != nil {
		return c.CheckTable(ctx, b.db, p)
	}
	return nil
}

// Subscribe validates t against the live table, checks the server, and runs
// h for each row claimed until the subscription is stopped or ctx ends. A
// bad description fails here, before anything in the database changes.
func (b *Broker) Subscribe(ctx context.Context, t Table, h Handler, p SubscribeParams) (*Subscription, error) {
	f, err := b.Form(t)
	if err != nil {
		return nil, err
	}
	plan := f.(*checkedForm).p
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
	s, err := subscribe(ctx, f, t, h, p)
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
