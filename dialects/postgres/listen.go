package postgres

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"database/sql/driver"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
	"github.com/sqlxbroker/sqlxbroker/core"
	"github.com/sqlxbroker/sqlxbroker/internal/wake"
)

// Wake-ups are LISTEN/NOTIFY on one channel per table: Publish runs
// pg_notify in the publishing transaction (delivered at commit, once per
// transaction), and each broker's pool keeps one listener for all of its
// subscriptions (core.Pool: the broker closes it).
//
// With a DSN (Dialect.ListenDSN, or a pool opened by Open) the listener is a
// pq.Listener on a connection of its own: it reads notifications as the
// server sends them, so a subscription wakes within a round trip of the
// publishing commit, and no statement runs while idle.
//
// Without one, the listener is a pooled connection: lib/pq reads a
// notification only while it runs a statement, and a *sqlx.DB does not
// reveal the DSN a pq.Listener would need, so that connection runs an empty
// statement every heartbeat and a wake-up arrives within about one
// heartbeat. It leaves the pool for good (it is closed, never returned).
//
// Either listener is given up when the last subscription of the pool stops,
// and replaced when it fails; every subscription is then woken, since
// notifications may have been missed. A replacement that fails (the server
// is down, or is a standby: "cannot execute LISTEN during recovery",
// SQLSTATE 25006) is retried with a backoff that doubles up to
// maxRetry, logged through Dialect.Logger (see downLog);
// subscriptions poll meanwhile, and are woken when it succeeds (after a
// failover, on the promoted server). The pgx stdlib driver is not
// imported, so its subscriptions poll only. Behind a pooler in transaction
// mode (Dialect.TransactionPooling) nothing listens unless ListenDSN is set:
// publishes still notify, for subscribers connected otherwise.
const heartbeat = 100 * time.Millisecond

// maxRetry is the longest wait between two attempts to reconnect a
// listener. A listener down for warnAfter is logged as a warning, then at
// most every logEvery; shorter outages (a session ended, replaced within
// milliseconds) only at debug level.
const (
	maxRetry  = 5 * time.Second
	warnAfter = time.Second
	logEvery  = 30 * time.Second
)

// downLog logs a listener's failures: each at debug level, a warning once
// it has been down for warnAfter and then at most every logEvery, and a
// line when it is back after a warning.
type downLog struct {
	log    *slog.Logger
	mu     sync.Mutex
	since  time.Time // the first failure not followed by a success
	warned time.Time // the last warning
	n      int       // failures since the last warning
}

func (l *downLog) failed(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	if l.since.IsZero() {
		l.since = now
	}
	l.n++
	if now.Sub(l.since) < warnAfter || now.Sub(l.warned) < logEvery {
		l.log.Debug("sqlxbroker: postgres: wake-up listener down", "err", err)
		return
	}
	l.log.Warn("sqlxbroker: postgres: wake-up listener down; subscriptions poll until it reconnects",
		"err", err, "failures", l.n, "down_for", now.Sub(l.since).Round(time.Millisecond))
	l.warned, l.n = now, 0
}

func (l *downLog) ok() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.warned.IsZero() {
		l.log.Info("sqlxbroker: postgres: wake-up listener reconnected", "down_for", time.Since(l.since).Round(time.Millisecond))
	}
	l.since, l.warned, l.n = time.Time{}, time.Time{}, 0
}

// channelOf is the notification channel of p's table: "sqlxbroker:<table>",
// or for a long name a cut one made unique with a hash, at most 63 bytes.
func channelOf(p *core.Plan) string {
	name := "sqlxbroker:" + p.Table
	if len(name) <= core.MaxIdentLength {
		return name
	}
	sum := sha256.Sum256([]byte(p.Table))
	return name[:core.MaxIdentLength-17] + ":" + hex.EncodeToString(sum[:8])
}

// WakeStatement notifies the table's channel. It is written with $1, since
// Publish runs it as it is.
func (Dialect) WakeStatement(p *core.Plan) (string, []any) {
	return "SELECT pg_notify($1, '')", []any{channelOf(p)}
}

// Listen returns a channel that receives after a publish to p's table
// commits, and is closed when ctx ends. It fails at once for a driver other
// than lib/pq, when the listening connection cannot be opened, and behind
// a transaction-mode pooler unless ListenDSN is set (an error matching
// sqlxbroker.ErrUnsupported); the subscription then polls only.
func (d Dialect) Listen(ctx context.Context, pool *core.Pool, p *core.Plan) (<-chan struct{}, error) {
	db := pool.DB
	if d.ListenDSN == "" {
		if pooled, how := d.txPooling(ctx, pool); pooled {
			return nil, errNoListen(how)
		}
	}
	if !isPQ(db) {
		return nil, fmt.Errorf("sqlxbroker: postgres: wake-ups need the lib/pq driver, not %T", db.Driver())
	}
	ls, err := core.Keep(pool, listenersKey{}, func() (*listeners, error) {
		log := d.Logger
		if log == nil {
			log = slog.Default()
		}
		return &listeners{db: db, log: log}, nil
	})
	if err != nil {
		return nil, err
	}
	name := channelOf(p)
	ch := make(chan struct{}, 1)
	l, first := ls.join(d.listenDSN(db), name, ch)
	if err := l.listen(ctx, name, first); err != nil {
		l.leave(name, ch)
		return nil, fmt.Errorf("sqlxbroker: postgres: listen on %q: %w", name, err)
	}
	go func() { <-ctx.Done(); l.leave(name, ch) }()
	return ch, nil
}

// listenersKey keeps a pool's listeners (core.Keep).
type listenersKey struct{}

// listeners is a pool's listener, made on the first Listen and given up
// when its last receiver leaves; Close (the broker's) ends it.
type listeners struct {
	db     *sqlx.DB
	log    *slog.Logger
	mu     sync.Mutex
	cur    listener
	closed bool
}

// listener is a hub or a pushHub.
type listener interface {
	fanout() *wake.Fanout
	// listen LISTENs on name, new to the listener when first.
	listen(ctx context.Context, name string, first bool) error
	leave(name string, ch chan struct{})
	stop()
}

// join adds ch as a receiver of name on the pool's listener (a pushHub on
// dsn, else a hub), making one when there is none.
func (ls *listeners) join(dsn, name string, ch chan struct{}) (l listener, first bool) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	switch h := ls.cur.(type) {
	case *pushHub:
		if h.dsn == dsn {
			l = h
		}
	case *hub:
		if dsn == "" {
			l = h
		}
	}
	if l == nil {
		if ls.cur != nil {
			ls.cur.stop()
		}
		if dsn != "" {
			l = newPushHub(ls, dsn)
		} else {
			h := &hub{ls: ls, db: ls.db, done: make(chan struct{}), down: downLog{log: ls.log}}
			go h.run()
			l = h
		}
		ls.cur = l
		if ls.closed {
			l.stop()
		}
	}
	return l, l.fanout().Add(name, ch)
}

// idle gives l up when its last receiver left; false when a receiver came
// meanwhile.
func (ls *listeners) idle(l listener) bool {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if !l.fanout().Empty() {
		return false
	}
	if ls.cur == l {
		ls.cur = nil
	}
	l.stop()
	return true
}

// Close ends the listener (core.Pool.Close).
func (ls *listeners) Close() error {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	ls.closed = true
	if ls.cur != nil {
		ls.cur.stop()
		ls.cur = nil
	}
	return nil
}

// hub is a pooled connection that LISTENs, read every heartbeat.
type hub struct {
	ls   *listeners
	db   *sqlx.DB
	subs wake.Fanout

	io      sync.Mutex // held for every statement on conn
	conn    *sqlx.Conn // nil: not connected
	backoff time.Duration
	retryAt time.Time // no reconnection before
	down    downLog

	once sync.Once
	done chan struct{}
}

func (h *hub) fanout() *wake.Fanout { return &h.subs }

// leave removes and closes ch. The hub stops at its next heartbeat when no
// receiver is left; the channel stays listened to until then (harmless).
func (h *hub) leave(name string, ch chan struct{}) {
	if was, _ := h.subs.Remove(name, ch); was {
		close(ch)
	}
}

func (h *hub) stop() { h.once.Do(func() { close(h.done) }) }

// listen LISTENs on name, connecting first if need be.
func (h *hub) listen(ctx context.Context, name string, _ bool) error {
	h.io.Lock()
	defer h.io.Unlock()
	if h.conn == nil {
		return h.connect(ctx) // listens on every channel, name included
	}
	if _, err := h.conn.ExecContext(ctx, "LISTEN "+pq.QuoteIdentifier(name)); err != nil {
		h.drop()
		return err
	}
	return nil
}

// run beats until no receiver is left or the hub stops, then closes the
// connection.
func (h *hub) run() {
	t := time.NewTicker(heartbeat)
	defer t.Stop()
	defer func() {
		h.io.Lock()
		h.drop()
		h.io.Unlock()
	}()
	for {
		select {
		case <-h.done:
			return
		case <-t.C:
		}
		if h.ls.idle(h) {
			return
		}
		h.io.Lock()
		h.beat()
		h.io.Unlock()
	}
}

// beat runs the empty statement that reads pending notifications, and
// reconnects a failed connection, backing off while reconnections fail.
// The caller holds h.io.
func (h *hub) beat() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*heartbeat)
	defer cancel()
	if h.conn != nil {
		_, err := h.conn.ExecContext(ctx, ";")
		if err == nil {
			return
		}
		h.drop()
		h.down.failed(err)
	}
	if time.Now().Before(h.retryAt) {
		return
	}
	if err := h.connect(ctx); err != nil {
		h.backoff = min(max(2*h.backoff, heartbeat), maxRetry)
		h.retryAt = time.Now().Add(h.backoff)
		h.down.failed(err)
		return
	}
	h.backoff, h.retryAt = 0, time.Time{}
	h.down.ok()
}

// connect takes a connection from the pool, hooks the notification handler
// into it and LISTENs on every channel; then it wakes every receiver, which
// may have missed notifications while no connection listened. The caller
// holds h.io.
func (h *hub) connect(ctx context.Context) (err error) {
	conn, err := h.db.Connx(ctx)
	if err != nil {
		return err
	}
	h.conn = conn
	err = conn.Raw(func(dc any) (err error) {
		defer func() {
			if r := recover(); r != nil { // not a lib/pq connection
				err = fmt.Errorf("cannot receive notifications on %T: %v", dc, r)
			}
		}()
		c, _ := unwrapConn(dc).(driver.Conn)
		pq.SetNotificationHandler(c, func(n *pq.Notification) { h.subs.Wake(n.Channel) })
		return nil
	})
	for _, n := range h.subs.Names() {
		if err != nil {
			break
		}
		_, err = conn.ExecContext(ctx, "LISTEN "+pq.QuoteIdentifier(n))
	}
	if err != nil {
		h.drop()
		return err
	}
	h.subs.Wake("")
	return nil
}

// drop discards the connection: a session with a notification handler and
// LISTENs must never go back to the pool. The caller holds h.io.
func (h *hub) drop() {
	if h.conn != nil {
		core.Discard(h.conn)
		h.conn = nil
	}
}

// pushHub is a pq.Listener on a DSN: notifications as the server sends them.
type pushHub struct {
	ls   *listeners
	dsn  string
	down downLog
	lmu  sync.Mutex // held for each LISTEN or UNLISTEN
	l    *pq.Listener
	subs wake.Fanout
	once sync.Once
	done chan struct{}
}

func newPushHub(ls *listeners, dsn string) *pushHub {
	h := &pushHub{ls: ls, dsn: dsn, done: make(chan struct{}), down: downLog{log: ls.log}}
	h.l = pq.NewListener(dsn, 10*time.Millisecond, maxRetry, func(ev pq.ListenerEventType, err error) {
		switch ev {
		case pq.ListenerEventConnected, pq.ListenerEventReconnected:
			h.down.ok()
			h.subs.Wake("") // notifications may have been missed meanwhile
		case pq.ListenerEventDisconnected, pq.ListenerEventConnectionAttemptFailed:
			h.down.failed(err)
		}
	})
	go h.run()
	return h
}

func (h *pushHub) fanout() *wake.Fanout { return &h.subs }

// listen LISTENs on a new channel in the background: until the listener is
// connected a subscription polls, and the first connection wakes it.
func (h *pushHub) listen(_ context.Context, name string, first bool) error {
	if first {
		go h.sync(name) // blocks until the server answers
	}
	return nil
}

// sync LISTENs on name while it has receivers and UNLISTENs otherwise. Calls
// run one at a time and each reads the receivers afresh, so a leave and a
// join racing on one channel end as the last of them left it. A LISTEN the
// server refuses (a standby: 25006) is tried again, backing off, until it
// succeeds, the channel has no receiver left or the hub stops; the
// listener itself re-LISTENs on every channel it holds when it reconnects.
func (h *pushHub) sync(name string) {
	wait := 10 * time.Millisecond
	for {
		h.lmu.Lock()
		var err error
		if h.subs.Has(name) {
			err = h.l.Listen(name)
		} else {
			_ = h.l.Unlisten(name) // ErrChannelNotOpen: nothing to do
		}
		h.lmu.Unlock()
		if err == nil && wait > 10*time.Millisecond {
			h.down.ok()
			h.subs.Wake(name) // publishes while it was refused went unheard
		}
		if err == nil || errors.Is(err, pq.ErrChannelAlreadyOpen) || errors.Is(err, net.ErrClosed) {
			return
		}
		h.down.failed(err)
		select {
		case <-h.done:
			return
		case <-time.After(wait):
		}
		wait = min(2*wait, maxRetry)
	}
}

// leave removes and closes ch; the last receiver of a channel unlistens,
// the last of the hub closes the listener.
func (h *pushHub) leave(name string, ch chan struct{}) {
	was, last := h.subs.Remove(name, ch)
	if !was {
		return
	}
	close(ch)
	if last && !h.ls.idle(h) {
		go h.sync(name)
	}
}

func (h *pushHub) stop() { h.once.Do(func() { close(h.done) }) }

// run dispatches notifications, pings the connection every half minute so
// a dead one is noticed and replaced, and closes the listener at the end.
func (h *pushHub) run() {
	defer h.l.Close()
	ping := time.NewTicker(30 * time.Second)
	defer ping.Stop()
	for {
		select {
		case n := <-h.l.Notify:
			if n == nil { // reconnected: the callback has woken everyone
				continue
			}
			h.subs.Wake(n.Channel)
		case <-ping.C:
			go func() { _ = h.l.Ping() }()
		case <-h.done:
			return
		}
	}
}

// Open opens a lib/pq pool on dsn whose subscriptions receive wake-ups as
// soon as the server sends them (see Dialect.ListenDSN): the pool's driver
// carries the DSN, so nothing is kept beside the pool. Close it as usual.
//
// The pool follows a failover: a connection whose statement failed because
// its server is a standby, read-only or shutting down (Stale) is closed
// instead of pooled, and the next one goes where dsn points then (a
// multi-host DSN with target_session_attrs=read-write, or a name that moves
// to the new primary). Conn.Raw on the pool's connections sees a wrapper of
// the lib/pq connection.
func Open(dsn string) (*sqlx.DB, error) {
	cfg, err := pq.NewConfig(dsn)
	if err != nil {
		return nil, err
	}
	if err := checkHosts(cfg); err != nil {
		return nil, err
	}
	c, err := pq.NewConnectorConfig(cfg)
	if err != nil {
		return nil, err
	}
	return sqlx.NewDb(sql.OpenDB(&dsnConnector{c: c, d: &dsnDriver{dsn: dsn}}), "postgres"), nil
}

// dsnConnector opens lib/pq connections and names its driver, which keeps
// the DSN.
type dsnConnector struct {
	c *pq.Connector
	d *dsnDriver
}

// Connect opens a lib/pq connection that the pool discards after a Stale
// error (see failover.go).
func (c *dsnConnector) Connect(ctx context.Context) (driver.Conn, error) {
	cn, err := c.c.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &failoverConn{Conn: cn}, nil
}

func (c *dsnConnector) Driver() driver.Driver { return c.d }

// dsnDriver is lib/pq's driver with the DSN its pool was opened with.
type dsnDriver struct {
	pq.Driver
	dsn string
}

// listenDSN is the DSN wake-ups listen with: ListenDSN, else the DSN db
// was opened with by Open, else "" (heartbeat on a pooled connection).
func (d Dialect) listenDSN(db *sqlx.DB) string {
	if d.ListenDSN != "" {
		return d.ListenDSN
	}
	if dd, ok := db.Driver().(*dsnDriver); ok {
		return dd.dsn
	}
	return ""
}

// isPQ reports whether db's driver is lib/pq (plain, from Open, or
// TxPoolDriver's).
func isPQ(db *sqlx.DB) bool {
	switch db.Driver().(type) {
	case *pq.Driver, *dsnDriver, txPoolDriver:
		return true
	}
	return false
}
