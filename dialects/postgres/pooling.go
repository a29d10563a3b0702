package postgres

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/lib/pq"
	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/core"
)

// TxPoolDriver is the database/sql driver name (lib/pq) whose dialect is
// Dialect{TransactionPooling: true}: open a pool through a
// transaction-mode pooler with it, e.g. sqlx.Open("postgres-txpool", dsn),
// or pass it to the sqlxbroker command as --driver. It adds
// binary_parameters=yes to a DSN that does not set binary_parameters.
const TxPoolDriver = "postgres-txpool"

func init() {
	sql.Register(TxPoolDriver, txPoolDriver{})
	sqlxbroker.Register(TxPoolDriver, Dialect{TransactionPooling: true})
}

// txPoolDriver is lib/pq with binary_parameters=yes added to a DSN that
// does not set it: a statement with arguments then goes in one round trip
// (parse, bind and execute before one sync), which a transaction-mode
// pooler keeps on one server session.
type txPoolDriver struct{ pq.Driver }

func (d txPoolDriver) Open(dsn string) (driver.Conn, error) {
	return d.Driver.Open(withBinaryParameters(dsn))
}

func (txPoolDriver) OpenConnector(dsn string) (driver.Connector, error) {
	c, err := pq.NewConnector(withBinaryParameters(dsn))
	if err != nil {
		return nil, err
	}
	return &txPoolConnector{c}, nil
}

// txPoolConnector names txPoolDriver as its driver, so the pool's driver
// says how it was opened.
type txPoolConnector struct{ *pq.Connector }

func (txPoolConnector) Driver() driver.Driver { return txPoolDriver{} }

// withBinaryParameters adds binary_parameters=yes to a URL or key=value
// DSN that does not name binary_parameters.
func withBinaryParameters(dsn string) string {
	if strings.Contains(dsn, "binary_parameters") {
		return dsn
	}
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return dsn // lib/pq reports the bad DSN
		}
		q := u.Query()
		q.Set("binary_parameters", "yes")
		u.RawQuery = q.Encode()
		return u.String()
	}
	if strings.TrimSpace(dsn) == "" {
		return "binary_parameters=yes"
	}
	return dsn + " binary_parameters=yes"
}

// Transaction pooling: a pooler in transaction mode (PgBouncer's
// pool_mode = transaction, or statement) gives a client's connection a
// server session for one transaction, or for one statement outside a
// transaction, then hands that session to another client. What lives in
// the session is lost in between: the advisory form's locks, LISTEN,
// prepared statements (PgBouncer before 1.21).
//
// Dialect.TransactionPooling says so. Without it, the first subscription
// start of a pool probes for such a pooler (txPooled): two connections of
// the pool, both open, ask for their server process (pg_backend_pid) in
// turn, outside a transaction. On a server or a session-mode pooler two
// open connections never share a process; a transaction-mode pooler
// hands the process one just released to the other, so an equal answer
// proves the pooler. A different answer proves nothing (the pooler may
// have picked another idle server session, another client may have taken
// it), so the probe can miss a pooler, never invent one: the setting is
// what the library relies on, the probe a safety net for the advisory form.

// probeTries is how many answers in turn the probe compares.
const probeTries = 4

// probeTimeout bounds the probe; a pool that cannot lend two connections
// that fast (MaxOpenConns reached) is not probed again.
const probeTimeout = 2 * time.Second

// pooledKey keeps a pool's probe result (core.Keep).
type pooledKey struct{}

// pooledResult is the kept outcome of the probe.
type pooledResult struct{ pooled bool }

// txPooling reports whether pool's connections go through a
// transaction-mode pooler: set (TransactionPooling), or found by the probe
// (run once per pool). how says which, for messages.
func (d Dialect) txPooling(ctx context.Context, pool *core.Pool) (pooled bool, how string) {
	if d.TransactionPooling {
		return true, "postgres.Dialect.TransactionPooling is set"
	}
	r, err := core.Keep(pool, pooledKey{}, func() (pooledResult, error) {
		p, err := txPooled(ctx, pool)
		return pooledResult{p}, err
	})
	if err != nil || !r.pooled {
		return false, "" // an unfinished probe is tried again next time
	}
	return true, "two open connections were served by one server process, as a transaction-mode pooler does"
}

// txPooled is the probe: true when two open connections of pool answered
// pg_backend_pid() with one process. A pool that cannot lend two
// connections within probeTimeout is taken as not pooled (and not probed
// again); other failures are returned, and the probe runs again next time.
func txPooled(ctx context.Context, pool *core.Pool) (pooled bool, err error) {
	db := pool.DB
	if n := db.Stats().MaxOpenConnections; n > 0 && n < 2 {
		return false, nil // one connection: nothing to compare, nothing to run
	}
	parent := ctx
	ctx, cancel := context.WithTimeout(parent, probeTimeout)
	defer cancel()
	defer func() {
		if err != nil && parent.Err() == nil && ctx.Err() != nil {
			pooled, err = false, nil // busy pool: inconclusive, kept
		}
	}()
	var conns [2]*sql.Conn
	for i := range conns {
		c, err := db.DB.Conn(ctx)
		if err != nil {
			return false, err
		}
		defer c.Close()
		conns[i] = c
	}
	last := -1
	for i := range probeTries {
		var pid int
		if err := conns[i%2].QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
			return false, err
		}
		if pid == last {
			return true, nil
		}
		last = pid
	}
	return false, nil
}

// refuseAdvisory is the advisory form's refusal behind a transaction-mode
// pooler.
func (d Dialect) refuseAdvisory(how string) error {
	return &sqlxbroker.FormError{Dialect: d.Name(), Form: core.Advisory, Reason: fmt.Sprintf(
		"the connections go through a pooler in transaction mode (%s): a session-scoped advisory lock "+
			"(pg_try_advisory_lock) does not survive transaction pooling, since the key would be taken on one "+
			"server session and released on another; use the lease or row-lock form, or give the advisory "+
			"tables a direct connection or a pooler in session mode", how)}
}

// errNoListen is Listen's answer behind a transaction-mode pooler.
func errNoListen(how string) error {
	return fmt.Errorf("sqlxbroker: postgres: %w: no LISTEN through a pooler in transaction mode (%s), "+
		"which would hand the listening session to other clients; subscriptions poll "+
		"(set Dialect.ListenDSN to a direct or session-mode DSN for wake-ups)", core.ErrUnsupported, how)
}
