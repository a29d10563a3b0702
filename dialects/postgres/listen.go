package postgres

import (
	"context"
	"crypto/sha256"
	"database/sql/driver"
	"encoding/hex"
	"fmt"
	"sync"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
	"github.com/sqlxbroker/sqlxbroker/core"
)

// Wake-ups are LISTEN/NOTIFY on one channel per table: Publish runs
// pg_notify in the publishing transaction (delivered at commit, once per
// transaction), and each *sqlx.DB keeps one pooled connection that LISTENs
// for all of its subscriptions. lib/pq reads a notification only while it
// runs a statement on the connection, and a *sqlx.DB does not reveal the DSN
// a pq.Listener would need, so that connection runs an empty statement every
// heartbeat: a wake-up arrives within about one heartbeat. The connection
// leaves the pool for good (it is closed, never returned) when the last
// subscription of the pool stops, and is replaced when it fails; every
// subscription is then woken, since notifications may have been missed.
//
// With a DSN (Dialect.ListenDSN, or a pool opened by Open) the wake-ups
// come through a pq.Listener instead: its own connection reads
// notifications as the server sends them, so a subscription wakes within a
// round trip of the publishing commit, and no statement runs while idle.
//
// The pgx stdlib driver is not imported, so its subscriptions poll only. A
// pooler in transaction mode does not deliver notifications.
const heartbeat = 100 * time.Millisecond

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
// than lib/pq or when the listening connection cannot be opened; the
// subscription then polls only.
func (d Dialect) Listen(ctx context.Context, db *sqlx.DB, p *core.Plan) (<-chan struct{}, error) {
	if _, ok := db.Driver().(*pq.Driver); !ok {
		return nil, fmt.Errorf("sqlxbroker: postgres: wake-ups need the lib/pq driver, not %T", db.Driver())
	}
	name := channelOf(p)
	ch := make(chan struct{}, 1)
	if dsn := d.listenDSN(db); dsn != "" {
		h := joinPush(dsn, name, ch)
		go func() { <-ctx.Done(); h.leave(name, ch) }()
		return ch, nil
	}
	h := join(db, name, ch)
	if err := h.listen(ctx, name); err != nil {
		h.leave(name, ch)
		return nil, fmt.Errorf("sqlxbroker: postgres: listen on %q: %w", name, err)
	}
	go func() { <-ctx.Done(); h.leave(name, ch) }()
	return ch, nil
}

// hubs are the listening hubs by pool. The mutex also guards every hub's
// subs; it is never held during a statement, since notifications are
// dispatched from inside statements.
var hubs = struct {
	sync.Mutex
	m map[*sqlx.DB]*hub
}{m: map[*sqlx.DB]*hub{}}

// hub is one pool's listening connection and the receivers by channel.
type hub struct {
	db   *sqlx.DB
	subs map[string]map[chan struct{}]struct{}

	io   sync.Mutex // held for every statement on conn
	conn *sqlx.Conn // nil: not connected
}

// join adds ch as a receiver of channel name on db's hub, starting the hub.
func join(db *sqlx.DB, name string, ch chan struct{}) *hub {
	hubs.Lock()
	defer hubs.Unlock()
	h := hubs.m[db]
	if h == nil {
		h = &hub{db: db, subs: map[string]map[chan struct{}]struct{}{}}
		hubs.m[db] = h
		go h.run()
	}
	if h.subs[name] == nil {
		h.subs[name] = map[chan struct{}]struct{}{}
	}
	h.subs[name][ch] = struct{}{}
	return h
}

// leave removes and closes ch. The hub stops at its next heartbeat when no
// receiver is left; the channel stays listened to until then (harmless).
func (h *hub) leave(name string, ch chan struct{}) {
	hubs.Lock()
	defer hubs.Unlock()
	if _, ok := h.subs[name][ch]; !ok {
		return
	}
	delete(h.subs[name], ch)
	if len(h.subs[name]) == 0 {
		delete(h.subs, name)
	}
	close(ch)
}

// listen LISTENs on name, connecting first if need be.
func (h *hub) listen(ctx context.Context, name string) error {
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

// run beats until no receiver is left, then closes the connection.
func (h *hub) run() {
	t := time.NewTicker(heartbeat)
	defer t.Stop()
	for range t.C {
		hubs.Lock()
		idle := len(h.subs) == 0
		if idle {
			delete(hubs.m, h.db)
		}
		hubs.Unlock()
		h.io.Lock()
		if idle {
			h.drop()
			h.io.Unlock()
			return
		}
		h.beat()
		h.io.Unlock()
	}
}

// beat runs the empty statement that reads pending notifications, and
// reconnects a failed connection. The caller holds h.io.
func (h *hub) beat() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*heartbeat)
	defer cancel()
	if h.conn != nil {
		if _, err := h.conn.ExecContext(ctx, ";"); err == nil {
			return
		}
		h.drop()
	}
	_ = h.connect(ctx) // on failure, try again next beat
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
		c, _ := dc.(driver.Conn)
		pq.SetNotificationHandler(c, h.dispatch)
		return nil
	})
	hubs.Lock()
	names := make([]string, 0, len(h.subs))
	for n := range h.subs {
		names = append(names, n)
	}
	hubs.Unlock()
	for _, n := range names {
		if err != nil {
			break
		}
		_, err = conn.ExecContext(ctx, "LISTEN "+pq.QuoteIdentifier(n))
	}
	if err != nil {
		h.drop()
		return err
	}
	h.wake(nil)
	return nil
}

// drop discards the connection: a session with a notification handler and
// LISTENs must never go back to the pool. The caller holds h.io.
func (h *hub) drop() {
	if h.conn != nil {
		_ = h.conn.Raw(func(any) error { return driver.ErrBadConn })
		_ = h.conn.Close()
		h.conn = nil
	}
}

// dispatch is lib/pq's notification handler, run inside a statement.
func (h *hub) dispatch(n *pq.Notification) { h.wake(n) }

// wake pokes the receivers of n's channel, or every receiver for nil.
func (h *hub) wake(n *pq.Notification) {
	hubs.Lock()
	defer hubs.Unlock()
	for name, chs := range h.subs {
		if n != nil && name != n.Channel {
			continue
		}
		for ch := range chs {
			select {
			case ch <- struct{}{}:
			default:
			}
		}
	}
}

// opened remembers the DSN of each pool Open made, for its wake-ups.
var opened sync.Map // *sqlx.DB -> string

// Open opens a lib/pq pool on dsn whose subscriptions receive wake-ups as
// soon as the server sends them (see Dialect.ListenDSN). Close it as usual.
func Open(dsn string) (*sqlx.DB, error) {
	db, err := sqlx.Open("postgres", dsn)
	if err != nil {
		return nil, err
	}
	opened.Store(db, dsn)
	return db, nil
}

// listenDSN is the DSN wake-ups listen with: ListenDSN, else the DSN db
// was opened with by Open, else "" (heartbeat on a pooled connection).
func (d Dialect) listenDSN(db *sqlx.DB) string {
	if d.ListenDSN != "" {
		return d.ListenDSN
	}
	if dsn, ok := opened.Load(db); ok {
		return dsn.(string)
	}
	return ""
}

// pushHubs are the pq.Listeners by DSN. The mutex guards every push hub's
// subs too.
var pushHubs = struct {
	sync.Mutex
	m map[string]*pushHub
}{m: map[string]*pushHub{}}

// pushHub is one pq.Listener and the receivers by channel.
type pushHub struct {
	dsn  string
	lmu  sync.Mutex // held for each LISTEN or UNLISTEN
	l    *pq.Listener
	subs map[string]map[chan struct{}]struct{}
	stop chan struct{}
}

// joinPush adds ch as a receiver of channel name on dsn's listener,
// starting it. LISTEN runs in the background: until the listener is
// connected a subscription polls, and the first connection wakes it.
func joinPush(dsn, name string, ch chan struct{}) *pushHub {
	pushHubs.Lock()
	defer pushHubs.Unlock()
	h := pushHubs.m[dsn]
	if h == nil {
		h = &pushHub{dsn: dsn, subs: map[string]map[chan struct{}]struct{}{}, stop: make(chan struct{})}
		h.l = pq.NewListener(dsn, 10*time.Millisecond, time.Second, func(ev pq.ListenerEventType, err error) {
			if ev == pq.ListenerEventConnected || ev == pq.ListenerEventReconnected {
				h.wake("") // notifications may have been missed meanwhile
			}
		})
		pushHubs.m[dsn] = h
		go h.run()
	}
	if h.subs[name] == nil {
		h.subs[name] = map[chan struct{}]struct{}{}
		go h.sync(name) // blocks until the server answers
	}
	h.subs[name][ch] = struct{}{}
	return h
}

// sync LISTENs on name while it has receivers and UNLISTENs otherwise. Calls
// run one at a time and each reads the receivers afresh, so a leave and a
// join racing on one channel end as the last of them left it.
func (h *pushHub) sync(name string) {
	h.lmu.Lock()
	defer h.lmu.Unlock()
	pushHubs.Lock()
	want := h.subs[name] != nil
	pushHubs.Unlock()
	if want {
		_ = h.l.Listen(name) // ErrChannelAlreadyOpen: nothing to do
	} else {
		_ = h.l.Unlisten(name) // ErrChannelNotOpen: nothing to do
	}
}

// leave removes and closes ch; the last receiver of a channel unlistens,
// the last of the hub closes the listener.
func (h *pushHub) leave(name string, ch chan struct{}) {
	pushHubs.Lock()
	defer pushHubs.Unlock()
	if _, ok := h.subs[name][ch]; !ok {
		return
	}
	delete(h.subs[name], ch)
	close(ch)
	if len(h.subs[name]) > 0 {
		return
	}
	delete(h.subs, name)
	if len(h.subs) > 0 {
		go h.sync(name)
		return
	}
	delete(pushHubs.m, h.dsn)
	close(h.stop)
}

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
			h.wake(n.Channel)
		case <-ping.C:
			go func() { _ = h.l.Ping() }()
		case <-h.stop:
			return
		}
	}
}

// wake pokes the receivers of channel name, or every receiver for "".
func (h *pushHub) wake(name string) {
	pushHubs.Lock()
	defer pushHubs.Unlock()
	for n, chs := range h.subs {
		if name != "" && n != name {
			continue
		}
		for ch := range chs {
			select {
			case ch <- struct{}{}:
			default:
			}
		}
	}
}
