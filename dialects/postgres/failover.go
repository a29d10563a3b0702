package postgres

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync/atomic"

	"github.com/lib/pq"
)

// A pool opened by Open follows a failover: its connections are lib/pq
// connections wrapped so that database/sql discards one as soon as a
// statement on it fails because its server cannot take writes, instead of
// handing it out again. Such a connection reached a node that is a standby
// (in recovery, or read-only: default_transaction_read_only) or is being
// shut down, and every later claim on it would fail the same way; a new
// connection goes where the DSN points now. lib/pq already gives up a
// connection that broke (a network error, a FATAL error such as 57P01
// admin_shutdown); the wrapper adds the errors of a live session on the
// wrong node.
//
// Where a new connection goes is the DSN's business:
//
//   - a multi-host DSN with target_session_attrs=read-write (lib/pq tries
//     each host and keeps the first that accepts writes), e.g.
//     "host=db1,db2 port=5432,5432 target_session_attrs=read-write" or
//     "postgres://u@db1:5432,db2:5432/app?target_session_attrs=read-write";
//   - a name the user's DNS, proxy or pooler moves to the new primary.
//
// A pool the application opened itself (sqlx.Open("postgres", dsn)) gets
// lib/pq's own behaviour: connections that broke are replaced, but one left
// on a node that turned read-only (a proxy or DNS name that moved while the
// old primary stayed up as a standby) stays in the pool and fails every
// claim it serves until it is closed (SetConnMaxLifetime bounds that).

// checkHosts refuses a host that still carries a port: lib/pq reads one
// port for the whole host list of a URL, so per-host ports in a URL
// ("postgres://u@db1:5432,db2:5433/app") leave "db1:5432" as a host name
// that no connection ever reaches.
func checkHosts(cfg pq.Config) error {
	hosts := []string{cfg.Host}
	for _, m := range cfg.Multi {
		hosts = append(hosts, m.Host)
	}
	for _, h := range hosts {
		i := strings.LastIndexByte(h, ':')
		if i < 0 || strings.HasPrefix(h, "/") || strings.HasPrefix(h, "@") {
			continue
		}
		if _, err := netip.ParseAddr(h); err == nil {
			continue // an IPv6 address
		}
		return fmt.Errorf("sqlxbroker: postgres: Open: host %q of the DSN carries a port, which lib/pq does not read from a multi-host URL; give one port for every host (postgres://u@db1,db2:5432/app) or the key=value form (host=db1,db2 port=5432,5433)", h)
	}
	return nil
}

// Stale reports whether err says the connection's server is not a primary
// that takes writes: SQLSTATE 25006 read_only_sql_transaction (a standby,
// "cannot execute LISTEN during recovery", or default_transaction_read_only
// on), class 57P (admin_shutdown, crash_shutdown, cannot_connect_now) or
// class 08 (connection exceptions). A pool from Open discards a connection
// whose statement failed with such an error.
func Stale(err error) bool {
	var pe *pq.Error
	if !errors.As(err, &pe) {
		return false
	}
	c := string(pe.Code)
	return c == "25006" || (len(c) == 5 && (c[:3] == "57P" || c[:2] == "08"))
}

// failoverConn is a lib/pq connection that reports itself invalid, so that
// database/sql closes it rather than pooling it, once a statement on it
// failed with a Stale error.
type failoverConn struct {
	driver.Conn // the lib/pq connection
	stale       atomic.Bool
}

var _ interface {
	driver.ConnBeginTx
	driver.ConnPrepareContext
	driver.ExecerContext
	driver.QueryerContext
	driver.Pinger
	driver.SessionResetter
	driver.Validator
	driver.NamedValueChecker
} = (*failoverConn)(nil)

// unwrapConn returns the lib/pq connection under c.
func unwrapConn(c any) any {
	if fc, ok := c.(*failoverConn); ok {
		return fc.Conn
	}
	return c
}

// check marks c stale when err is Stale, and returns err unchanged: the
// statement failed, and database/sql must not retry it on another
// connection by itself (driver.ErrBadConn would).
func (c *failoverConn) check(err error) error {
	if err != nil && Stale(err) {
		c.stale.Store(true)
	}
	return err
}

func (c *failoverConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	tx, err := c.Conn.(driver.ConnBeginTx).BeginTx(ctx, opts)
	return tx, c.check(err)
}

func (c *failoverConn) PrepareContext(ctx context.Context, q string) (driver.Stmt, error) {
	st, err := c.Conn.(driver.ConnPrepareContext).PrepareContext(ctx, q)
	if err != nil {
		return nil, c.check(err)
	}
	return &failoverStmt{Stmt: st, c: c}, nil
}

func (c *failoverConn) ExecContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Result, error) {
	r, err := c.Conn.(driver.ExecerContext).ExecContext(ctx, q, args)
	return r, c.check(err)
}

func (c *failoverConn) QueryContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Rows, error) {
	r, err := c.Conn.(driver.QueryerContext).QueryContext(ctx, q, args)
	return r, c.check(err)
}

func (c *failoverConn) Ping(ctx context.Context) error {
	return c.check(c.Conn.(driver.Pinger).Ping(ctx))
}

func (c *failoverConn) CheckNamedValue(nv *driver.NamedValue) error {
	return c.Conn.(driver.NamedValueChecker).CheckNamedValue(nv)
}

// ResetSession refuses a stale connection before its reuse.
func (c *failoverConn) ResetSession(ctx context.Context) error {
	if c.stale.Load() {
		return driver.ErrBadConn
	}
	return c.Conn.(driver.SessionResetter).ResetSession(ctx)
}

// IsValid is false once stale: database/sql closes the connection when it
// is given back.
func (c *failoverConn) IsValid() bool {
	return !c.stale.Load() && c.Conn.(driver.Validator).IsValid()
}

// failoverStmt is a prepared statement of a failoverConn.
type failoverStmt struct {
	driver.Stmt
	c *failoverConn
}

func (s *failoverStmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	r, err := s.Stmt.(driver.StmtExecContext).ExecContext(ctx, args)
	return r, s.c.check(err)
}

func (s *failoverStmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	r, err := s.Stmt.(driver.StmtQueryContext).QueryContext(ctx, args)
	return r, s.c.check(err)
}
