package sqlxbroker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/jmoiron/sqlx"
	"github.com/sqlxbroker/sqlxbroker/core"
	"github.com/sqlxbroker/sqlxbroker/forms"
	"github.com/sqlxbroker/sqlxbroker/internal/wake"
)

// Broker publishes to and subscribes to message tables of one database.
// Close it when done: it owns what the dialect keeps for the pool (a
// listening connection, for one).
type Broker struct {
	db      *sqlx.DB
	dialect core.Dialect
	pool    *core.Pool

	local wake.Fanout // in-process wake-ups: each subscription's wake channel, by table

	metadata atomic.Pointer[MetadataFunc] // SetMetadataFunc's; nil: none

	mu     sync.Mutex
	closed bool
	subs   map[*Subscription]struct{}
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

// OpenDialect returns a broker on db that speaks dialect d. A driver name
// sqlx does not know is bound to d's bind type, as Register does.
func OpenDialect(db *sqlx.DB, d core.Dialect) *Broker {
	if db != nil && sqlx.BindType(db.DriverName()) == sqlx.UNKNOWN {
		sqlx.BindDriver(db.DriverName(), d.BindType())
	}
	return &Broker{db: db, dialect: d, pool: core.NewPool(db, d), subs: map[*Subscription]struct{}{}}
}

// Close stops every subscription of the broker as Subscription.Stop does
// (with ctx) and releases what the dialect keeps for the pool; later
// subscriptions fail with ErrClosed. It does not close the *sqlx.DB, which
// belongs to the application.
func (b *Broker) Close(ctx context.Context) error {
	b.mu.Lock()
	b.closed = true
	subs := make([]*Subscription, 0, len(b.subs))
	for s := range b.subs {
		subs = append(subs, s)
	}
	b.mu.Unlock()
	var errs []error
	for _, s := range subs {
		errs = append(errs, s.Stop(ctx))
	}
	errs = append(errs, b.pool.Close())
	return errors.Join(errs...)
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
	return &checkedForm{ClaimForm: forms.New(b.pool, p), b: b, t: t, p: p}, nil
}

// checkedForm is a form whose Start checks the server and the table first,
// and whose Close gives back what the dialect's Starter took.
type checkedForm struct {
	core.ClaimForm
	b    *Broker
	t    Table
	p    *core.Plan
	stop func() error
}

// Unwrap returns the form itself, for the forms' own tests.
func (f *checkedForm) Unwrap() core.ClaimForm { return f.ClaimForm }

// Start runs the dialect's Starter (the server, the column types), then
// checks that the live table has every column the description names; a bad
// description is named as such on any server, too old or not, or refusing
// the form.
func (f *checkedForm) Start(ctx context.Context) error {
	if s := f.p.Caps.Starter; s != nil {
		stop, err := s.Start(ctx, f.b.pool, f.p)
		if err != nil {
			if errors.Is(err, ErrServerTooOld) || errors.Is(err, ErrFormUnavailable) {
				if lerr := checkLive(ctx, f.b.db, f.t, f.p); lerr != nil {
					return lerr
				}
			}
			return err
		}
		f.stop = stop
	}
	if err := checkLive(ctx, f.b.db, f.t, f.p); err != nil {
		f.release()
		return err
	}
	if err := f.ClaimForm.Start(ctx); err != nil {
		f.release()
		return err
	}
	return nil
}

func (f *checkedForm) Close() error {
	return errors.Join(f.ClaimForm.Close(), f.release())
}

// release gives back what the Starter took, once.
func (f *checkedForm) release() error {
	stop := f.stop
	f.stop = nil
	if stop == nil {
		return nil
	}
	return stop()
}

// Subscribe validates t against the live table, checks the server, and runs
// h for each row claimed until the subscription is stopped or ctx ends. A
// bad description fails here, before anything in the database changes.
func (b *Broker) Subscribe(ctx context.Context, t Table, h Handler, p SubscribeParams) (*Subscription, error) {
	b.mu.Lock()
	closed := b.closed
	b.mu.Unlock()
	if closed {
		return nil, ErrClosed
	}
	f, err := b.Form(t)
	if err != nil {
		return nil, err
	}
	plan := f.(*checkedForm).p
	var stopListen context.CancelFunc = func() {}
	if w := plan.Caps.Waker; w != nil && p.Wake == nil {
		var lctx context.Context
		lctx, stopListen = context.WithCancel(context.Background())
		switch ch, err := w.Listen(lctx, b.pool, plan); {
		case err == nil:
			p.Wake = ch
		case errors.Is(err, ErrUnsupported): // the connection is set up without them
			logger(p).Info("sqlxbroker: no wake-ups on this connection, polling only", "table", t.Name, "why", err)
		default:
			logger(p).Warn("sqlxbroker: wake-ups unavailable, polling only", "table", t.Name, "err", err)
		}
	}
	s, err := subscribe(ctx, f, t, h, p)
	if err != nil {
		stopListen()
		return nil, err
	}
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		stopListen()
		return nil, errors.Join(ErrClosed, s.Stop(ctx))
	}
	b.subs[s] = struct{}{}
	b.mu.Unlock()
	b.local.Add(t.Name, s.wakeIn)
	go func() {
		<-s.Done()
		stopListen()
		b.local.Remove(t.Name, s.wakeIn)
		b.mu.Lock()
		delete(b.subs, s)
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
