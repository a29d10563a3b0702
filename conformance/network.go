package conformance

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/core"
)

// DialFunc makes a connection as net.Dialer.DialContext does. A Target's
// Dial opens pools whose connections it makes.
type DialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

// Network is a faulty network between the pools it dials for and their
// server, on the machine's own connections: it can stall (no byte crosses
// in either direction and new connections wait, as on a link that drops
// every packet; the server sees nothing), recover, and cut (every
// connection made so far is closed, as a reset would, so the server ends
// their sessions). NewNetwork makes one; its Dial is a DialFunc.
type Network struct {
	mu      sync.Mutex
	resumed chan struct{} // closed while the network runs; open while stalled
	conns   map[*faultConn]struct{}
	dialer  net.Dialer
}

// NewNetwork returns a running network.
func NewNetwork() *Network {
	n := &Network{resumed: make(chan struct{}), conns: map[*faultConn]struct{}{}}
	close(n.resumed)
	return n
}

// running returns the channel that is closed while the network runs.
func (n *Network) running() <-chan struct{} {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.resumed
}

// Stall stops every byte, both ways, until Resume.
func (n *Network) Stall() {
	n.mu.Lock()
	defer n.mu.Unlock()
	select {
	case <-n.resumed:
		n.resumed = make(chan struct{})
	default: // stalled already
	}
}

// Resume lets the bytes a stall held, and new ones, cross.
func (n *Network) Resume() {
	n.mu.Lock()
	defer n.mu.Unlock()
	select {
	case <-n.resumed:
	default:
		close(n.resumed)
	}
}

// Cut closes every connection made so far and reports how many.
func (n *Network) Cut() int {
	n.mu.Lock()
	conns := n.conns
	n.conns = map[*faultConn]struct{}{}
	n.mu.Unlock()
	for c := range conns {
		c.Close()
	}
	return len(conns)
}

// Dial connects through the network: while it is stalled, until it
// recovers or ctx ends.
func (n *Network) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	select {
	case <-n.running():
	case <-ctx.Done():
		return nil, fmt.Errorf("dial %s through a stalled network: %w", addr, ctx.Err())
	}
	c, err := n.dialer.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	fc := &faultConn{Conn: c, n: n, closed: make(chan struct{})}
	n.mu.Lock()
	n.conns[fc] = struct{}{}
	n.mu.Unlock()
	return fc, nil
}

// faultConn is one connection through a Network.
type faultConn struct {
	net.Conn
	n      *Network
	once   sync.Once
	closed chan struct{}
}

// wait blocks while the network is stalled; false: the connection closed.
func (c *faultConn) wait() bool {
	select {
	case <-c.n.running():
		return true
	case <-c.closed:
		return false
	}
}

// Read holds what arrives while the network is stalled.
func (c *faultConn) Read(b []byte) (int, error) {
	if !c.wait() {
		return 0, net.ErrClosed
	}
	n, err := c.Conn.Read(b)
	if !c.wait() {
		return 0, net.ErrClosed
	}
	return n, err
}

func (c *faultConn) Write(b []byte) (int, error) {
	if !c.wait() {
		return 0, net.ErrClosed
	}
	return c.Conn.Write(b)
}

func (c *faultConn) Close() error {
	c.once.Do(func() { close(c.closed) })
	c.n.mu.Lock()
	delete(c.n.conns, c)
	c.n.mu.Unlock()
	return c.Conn.Close()
}

// network returns a broker whose pool connects through a new Network,
// skipping the scenario when the Target cannot open one.
func (tg *Target) network(t TB) (*sqlxbroker.Broker, *Network) {
	t.Helper()
	if tg.Dial == nil {
		t.Skipf("Target.Dial is not set: the suite cannot put a faulty network between a pool and the database (set it for a database reached over a network)")
	}
	n := NewNetwork()
	db := tg.Dial(t, n.Dial)
	db.SetMaxIdleConns(64)
	t.Cleanup(n.Resume) // a stalled pool could not close
	return sqlxbroker.OpenDialect(db, tg.Dialect), n
}

// NetworkStall stalls the network of a lease subscription whose handler
// is in work: its renewals cannot reach the database, so its handler's
// context is cancelled when the lease it last wrote ends; another broker
// then takes the row and completes it; once the network recovers, the
// stalled broker's completion changes nothing and returns ErrLeaseLost, and
// its subscription goes on to deliver a new row.
func NetworkStall(t TB, tg *Target, f sqlxbroker.Form) {
	b1, n := tg.network(t)
	b2 := tg.broker(t)
	tb := tg.fresh(t, b2.DB(), f, func(tb *sqlxbroker.Table) { tb.Lease = time.Second })
	publish(t, b2, tb, msg{Acct: "stalled"})
	var mu sync.Mutex
	var cancelledAt time.Time
	var lost []error
	handled := map[string]int{} // completions that succeeded, by acct
	started := make(chan string, 4)
	acct := func(d *sqlxbroker.Delivery) string {
		var m msg
		if err := d.Scan(&m); err != nil {
			t.Errorf("scan: %v", err)
		}
		return m.Acct
	}
	s1 := subscribe(t, b1, tb, func(ctx context.Context, d *sqlxbroker.Delivery) error {
		a := acct(d)
		select {
		case started <- a:
		default: // only the first delivery is awaited
		}
		if a != "stalled" {
			return nil
		}
		<-ctx.Done()
		mu.Lock()
		cancelledAt = time.Now()
		mu.Unlock()
		return ctx.Err()
	}, sqlxbroker.SubscribeParams{Concurrency: 2, PollInterval: 100 * time.Millisecond, CompleteTimeout: time.Minute, Logger: suiteLogger(),
		OnOutcome: func(d *sqlxbroker.Delivery, o sqlxbroker.Outcome, err error) {
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				lost = append(lost, err)
			case o.Kind == sqlxbroker.Succeeded:
				handled[acct(d)]++
			}
		}})
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatalf("the row was not delivered within 10s")
	}
	stalled := time.Now()
	n.Stall()
	defer n.Resume() // a failed check must not leave the pool stalled
	WaitFor(t, 3*tb.LeaseDuration()+5*time.Second, "the stalled handler's context to be cancelled", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return !cancelledAt.IsZero()
	})
	mu.Lock()
	if late := cancelledAt.Sub(stalled); late > tb.LeaseDuration()+time.Second {
		t.Errorf("the handler's context was cancelled %v after the stall, later than its %v lease", late, tb.LeaseDuration())
	}
	mu.Unlock()
	var took int
	s2 := subscribe(t, b2, tb, func(ctx context.Context, d *sqlxbroker.Delivery) error {
		mu.Lock()
		took++
		mu.Unlock()
		return nil
	}, quick)
	WaitFor(t, 10*time.Second+tb.LeaseDuration(), "another broker to take and complete the row", func() bool {
		return count(t, b2.DB(), tg.Dialect, tb.Name, "") == 0
	})
	if err := s2.Stop(context.Background()); err != nil {
		t.Errorf("stop the other subscription: %v", err)
	}
	n.Resume()
	WaitFor(t, 30*time.Second, "the stalled completion to answer once the network recovered", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(lost) > 0
	})
	publish(t, b2, tb, msg{Acct: "after"})
	WaitFor(t, 30*time.Second, "the recovered subscription to complete a new row", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return handled["after"] == 1
	})
	if err := s1.Stop(context.Background()); err != nil {
		t.Errorf("stop: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, err := range lost {
		if !errors.Is(err, sqlxbroker.ErrLeaseLost) {
			t.Errorf("the stalled completion returned %v, want ErrLeaseLost", err)
		}
	}
	if took != 1 || handled["stalled"] != 0 {
		t.Errorf("the stalled row was completed by the other broker %d times and by the stalled one %d times, want 1 and 0", took, handled["stalled"])
	}
	if st := s1.Stats(); st.LeaseLost != 1 {
		t.Errorf("stats %+v: want 1 lease lost", st)
	}
}

// NetworkCut closes every connection of a subscription whose handlers are
// in work. Row-lock and advisory rows are held by the cut sessions, so the
// server frees them at once: the handlers' contexts are cancelled within
// about a second, another broker claims the rows at once, and the cut
// deliveries' completions change nothing (ErrLeaseLost). A lease is
// written in the row, so a cut changes nothing for it: its handlers run on,
// and their completions succeed on new connections. Either way the
// subscription recovers on new connections, and every row completes once.
func NetworkCut(t TB, tg *Target, f sqlxbroker.Form) {
	b1, n := tg.network(t)
	b2 := tg.broker(t)
	tb := tg.fresh(t, b2.DB(), f, nil)
	const inWork = 3
	for i := range inWork {
		publish(t, b2, tb, msg{Acct: fmt.Sprint("cut", i)})
	}
	var mu sync.Mutex
	started, cancelled := 0, 0
	var lost []error
	completed := map[any]int{}
	gate, proceed := make(chan struct{}), make(chan struct{})
	open, goOn := sync.OnceFunc(func() { close(gate) }), sync.OnceFunc(func() { close(proceed) })
	defer open() // a failed step still lets the handlers go
	defer goOn()
	s1 := subscribe(t, b1, tb, func(ctx context.Context, d *sqlxbroker.Delivery) error {
		mu.Lock()
		started++
		first := started <= inWork
		mu.Unlock()
		if !first {
			return nil
		}
		select {
		case <-ctx.Done():
			mu.Lock()
			cancelled++
			mu.Unlock()
			<-proceed // the worker stays busy while the rows are checked
			return ctx.Err()
		case <-gate:
			return nil
		}
	}, sqlxbroker.SubscribeParams{Concurrency: inWork, PollInterval: 100 * time.Millisecond, Logger: suiteLogger(),
		OnOutcome: func(d *sqlxbroker.Delivery, o sqlxbroker.Outcome, err error) {
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				lost = append(lost, err)
			case o.Kind == sqlxbroker.Succeeded:
				completed[fmt.Sprint(d.ID())]++
			}
		}})
	WaitFor(t, 10*time.Second, fmt.Sprintf("%d deliveries in work", inWork), func() bool {
		mu.Lock()
		defer mu.Unlock()
		return started >= inWork
	})
	cut := n.Cut()
	cutAt := time.Now()
	if f == sqlxbroker.Lease {
		open()
	} else {
		WaitFor(t, 10*time.Second, "the cut deliveries' handlers to be cancelled", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return cancelled == inWork
		})
		f2 := form(t, b2, tb)
		var again []core.Claim
		WaitFor(t, 10*time.Second, "another broker to claim the cut rows", func() bool {
			again = append(again, claim(t, f2, inWork)...)
			return len(again) >= inWork
		})
		if back := time.Since(cutAt); back > 5*time.Second {
			t.Errorf("the cut %s rows came back %v after the cut, want at once", f, back)
		}
		// The other broker lets them go (a release leaves the attempt as
		// it was), for the recovered subscription to complete.
		for _, c := range again {
			complete(t, c, sqlxbroker.Released)
		}
		goOn()
	}
	publish(t, b2, tb, msg{Acct: "after"})
	WaitFor(t, 30*time.Second, "every row to complete after the cut", func() bool {
		return count(t, b2.DB(), tg.Dialect, tb.Name, "") == 0
	})
	if err := s1.Stop(context.Background()); err != nil {
		t.Errorf("stop: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	for id, c := range completed {
		if c != 1 {
			t.Errorf("row %s completed %d times", id, c)
		}
	}
	if len(completed) != inWork+1 {
		t.Errorf("%d rows completed by the cut subscription, want %d", len(completed), inWork+1)
	}
	for _, err := range lost {
		if !errors.Is(err, sqlxbroker.ErrLeaseLost) {
			t.Errorf("a cut delivery's completion returned %v, want ErrLeaseLost", err)
		}
	}
	if f != sqlxbroker.Lease && len(lost) != inWork {
		t.Errorf("%d cut completions reported, want %d", len(lost), inWork)
	}
	t.Logf("%d connections cut; %+v", cut, s1.Stats())
}
