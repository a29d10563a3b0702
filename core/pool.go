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

// Pool is a database pool bound to a dialect: what the dialect keeps for the
// pool lives here (Keep), and the broker that owns the pool closes it, which
// releases all of it. Its methods are safe for concurrent use.
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

// Keep returns what the dialect keeps under key for pool p, made by open on
// first use; a value that is an io.Closer is closed when the pool closes,
// the last kept first. After Close it fails with ErrClosed. open runs with
// the pool's lock held, so it must not call Keep.
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

// SetSessionIsolation records the isolation level the pool's sessions start
// at, as the dialect learnt it from the server (a DSN setting): claim
// transactions at that level then begin without naming it, which saves a
// statement each on MySQL and MariaDB.
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

// Close releases what the dialect keeps for the pool. It does not close DB,
// which belongs to the application.
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

// Discard closes conn for good: the pool does not get it back. For a
// session whose state is unknown (its locks, a notification handler).
func Discard(conn *sqlx.Conn) {
	_ = conn.Raw(func(any) error { return driver.ErrBadConn })
	_ = conn.Close()
}
