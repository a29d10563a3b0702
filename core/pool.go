package core

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"io"
	"sync"

	"github.com/jmoiron/sqlx"
)

// Pool is a database pool bound to a dialect, owned by a broker: what the
// dialect keeps for the pool lives here (Keep) and goes when it closes.
type Pool struct {
	DB      *sqlx.DB
	Dialect Dialect

	mu     sync.Mutex
	kept   map[any]any
	order  []any // keys in the order they were kept
	iso    sql.IsolationLevel
	isoSet bool
	closed bool
}

// NewPool binds d to db.
func NewPool(db *sqlx.DB, d Dialect) *Pool { return &Pool{DB: db, Dialect: d, kept: map[any]any{}} }

// Keep returns what is kept under key for p, made by open (which must not
// call Keep) on first use; an io.Closer is closed with the pool. After
// Close: ErrClosed.
func Keep[T any](p *Pool, key any, open func() (T, error)) (T, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var zero T
	if p.closed {
		return zero, ErrClosed
	}
	if v, ok := p.kept[key]; ok {
		return v.(T), nil
	}
	v, err := open()
	if err != nil {
		return zero, err
	}
	p.kept[key] = v
	p.order = append(p.order, key)
	return v, nil
}

// SetSessionIsolation records the level the pool's sessions start at (a
// DSN setting): claims at that level begin without naming it.
func (p *Pool) SetSessionIsolation(l sql.IsolationLevel) {
	p.mu.Lock()
	p.iso, p.isoSet = l, true
	p.mu.Unlock()
}

// BeginClaim opens a claim transaction at isolation l (LevelDefault: the
// server's own).
func (p *Pool) BeginClaim(ctx context.Context, l sql.IsolationLevel) (*sqlx.Tx, error) {
	p.mu.Lock()
	same := p.isoSet && p.iso == l
	p.mu.Unlock()
	if l == sql.LevelDefault || same {
		return p.DB.BeginTxx(ctx, nil)
	}
	return p.DB.BeginTxx(ctx, &sql.TxOptions{Isolation: l})
}

// Close releases what is kept, the last kept first (not DB itself).
func (p *Pool) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	kept, order := p.kept, p.order
	p.kept, p.order = nil, nil
	p.mu.Unlock()
	var errs []error
	for i := len(order) - 1; i >= 0; i-- {
		if c, ok := kept[order[i]].(io.Closer); ok {
			errs = append(errs, c.Close())
		}
	}
	return errors.Join(errs...)
}

// Discard closes conn for good, out of the pool (a session whose locks or
// handlers are unknown).
func Discard(conn *sqlx.Conn) {
	_ = conn.Raw(func(any) error { return driver.ErrBadConn })
	_ = conn.Close()
}
