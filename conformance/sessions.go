package conformance

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/core"
)

// Sessions returns a Target.Sessions for a database whose server sessions
// can be ended from another session. connect makes the driver's connector
// to the database under test (pq.NewConnector(dsn),
// mysql.NewConnector(cfg)); every connection the pool opens reports its
// session with idQuery ("SELECT pg_backend_pid()", "SELECT
// CONNECTION_ID()"); kill ends them with killFmt run for each id from a
// second pool ("SELECT pg_terminate_backend(%d)", "KILL CONNECTION %d").
func Sessions(driverName string, connect func() (driver.Connector, error), idQuery, killFmt string) func(t TB) (*sqlx.DB, func(t TB) int) {
	return func(t TB) (*sqlx.DB, func(t TB) int) {
		t.Helper()
		c, err := connect()
		if err != nil {
			t.Fatalf("connector: %v", err)
		}
		tc := &trackingConnector{Connector: c, query: idQuery}
		db, admin := sqlx.NewDb(sql.OpenDB(tc), driverName), sqlx.NewDb(sql.OpenDB(c), driverName)
		t.Cleanup(func() { db.Close(); admin.Close() })
		return db, func(t TB) int {
			t.Helper()
			tc.mu.Lock()
			ids := tc.ids
			tc.ids = nil
			tc.mu.Unlock()
			if len(ids) == 0 {
				t.Fatalf("the pool has opened no session to end")
			}
			n, err := KillSessions(context.Background(), admin, killFmt, ids)
			if err != nil {
				t.Fatalf("end the pool's sessions: %v", err)
			}
			return n
		}
	}
}

// KillSessions ends the server sessions ids from db's session with killFmt
// (one %d for the id) and returns how many statements succeeded; a session
// already gone is not an error. It fails only when db cannot run anything.
func KillSessions(ctx context.Context, db *sqlx.DB, killFmt string, ids []int64) (int, error) {
	if err := db.PingContext(ctx); err != nil {
		return 0, err
	}
	n := 0
	for _, id := range ids {
		if _, err := db.ExecContext(ctx, fmt.Sprintf(killFmt, id)); err == nil {
			n++
		}
	}
	return n, nil
}

// trackingConnector records the server session id of every connection it
// opens. The connections themselves are the driver's, unwrapped, so the
// pool behaves exactly as one opened on the driver.
type trackingConnector struct {
	driver.Connector
	query string
	mu    sync.Mutex
	ids   []int64
}

func (c *trackingConnector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	id, err := sessionID(ctx, conn, c.query)
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("conformance: session id (%s): %w", c.query, err)
	}
	c.mu.Lock()
	c.ids = append(c.ids, id)
	c.mu.Unlock()
	return conn, nil
}

func sessionID(ctx context.Context, conn driver.Conn, query string) (int64, error) {
	q, ok := conn.(driver.QueryerContext)
	if !ok {
		return 0, errors.New("the driver's connections do not implement driver.QueryerContext")
	}
	rows, err := q.QueryContext(ctx, query, nil)
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	v := make([]driver.Value, len(rows.Columns()))
	if len(v) != 1 {
		return 0, fmt.Errorf("%d columns, want 1", len(v))
	}
	if err := rows.Next(v); err != nil {
		if err == io.EOF {
			err = errors.New("no row")
		}
		return 0, err
	}
	var id sql.NullInt64
	if err := id.Scan(v[0]); err != nil || !id.Valid {
		return 0, fmt.Errorf("session id %v is not an integer", v[0])
	}
	return id.Int64, nil
}

// sessions returns tg.Sessions' pool and kill, skipping the scenario when
// the Target has none.
func (tg *Target) sessions(t TB) (*sqlx.DB, func(t TB) int) {
	t.Helper()
	if tg.Sessions == nil {
		t.Skipf("Target.Sessions is not set: the suite cannot end the database's sessions (set it with conformance.Sessions for a server database)")
	}
	db, kill := tg.Sessions(t)
	db.SetMaxIdleConns(64)
	return db, kill
}

// SessionLoss ends every server session of a running subscription's pool
// (as a failover or an administrator would) while deliveries are in work:
// the subscription reconnects and goes on claiming, the rows in work when
// their sessions ended come back and complete, and no row completes twice.
func SessionLoss(t TB, tg *Target, f sqlxbroker.Form) {
	db, kill := tg.sessions(t)
	admin := tg.Open(t)
	b, ba := sqlxbroker.OpenDialect(db, tg.Dialect), sqlxbroker.OpenDialect(admin, tg.Dialect)
	tb := tg.fresh(t, admin, f, func(tb *sqlxbroker.Table) {
		if tb.LockedUntil != "" {
			tb.Lease = time.Second
		}
	})
	const batch, blocked = 12, 4
	rows := func(from int) []msg {
		out := make([]msg, batch)
		for i := range out {
			out[i] = msg{Acct: fmt.Sprint("a", from+i)}
		}
		return out
	}
	publish(t, ba, tb, rows(0)...)
	var mu sync.Mutex
	completed := map[string]int{}
	inWork := 0
	gate := make(chan struct{})
	release := sync.OnceFunc(func() { close(gate) })
	defer release() // a failed step still lets the handlers go
	h := func(ctx context.Context, d *sqlxbroker.Delivery) error {
		mu.Lock()
		inWork++
		first := inWork <= blocked
		mu.Unlock()
		if first {
			<-gate // in work while the sessions end
		}
		return nil
	}
	s := subscribe(t, b, tb, h, sqlxbroker.SubscribeParams{
		Concurrency: blocked, PollInterval: 200 * time.Millisecond, Logger: suiteLogger(),
		OnOutcome: func(d *sqlxbroker.Delivery, o sqlxbroker.Outcome, err error) {
			if err == nil && o.Kind == sqlxbroker.Succeeded {
				mu.Lock()
				completed[fmt.Sprint(d.ID())]++
				mu.Unlock()
			}
		},
	})
	WaitFor(t, 10*time.Second, fmt.Sprintf("%d deliveries in work", blocked), func() bool {
		mu.Lock()
		defer mu.Unlock()
		return inWork >= blocked
	})
	n := kill(t)
	release()
	publish(t, ba, tb, rows(batch)...)
	WaitFor(t, 30*time.Second, "every row to complete after the sessions ended", func() bool {
		return count(t, admin, tg.Dialect, tb.Name, "") == 0
	})
	if err := s.Stop(context.Background()); err != nil { // waits for every completion and its OnOutcome
		t.Errorf("stop: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	for id, c := range completed {
		if c != 1 {
			t.Errorf("row %s completed %d times", id, c)
		}
	}
	if len(completed) != 2*batch {
		t.Errorf("%d rows completed, want %d", len(completed), 2*batch)
	}
	t.Logf("%d sessions ended; %+v", n, s.Stats())
}

// HolderLost ends the sessions of an advisory subscription, the one that
// holds its keys among them, while its handlers run: every handler's
// context is cancelled (the key session's ping notices within about a
// second), their completions change nothing (ErrLeaseLost), and the rows
// come back with the attempt counted and complete once.
func HolderLost(t TB, tg *Target, f sqlxbroker.Form) {
	db, kill := tg.sessions(t)
	admin := tg.Open(t)
	b, ba := sqlxbroker.OpenDialect(db, tg.Dialect), sqlxbroker.OpenDialect(admin, tg.Dialect)
	tb := tg.fresh(t, admin, f, nil)
	const n = 4
	for i := range n {
		publish(t, ba, tb, msg{Acct: fmt.Sprint("k", i)})
	}
	var mu sync.Mutex
	cancelled, attempts := 0, map[string][]int{}
	var lost []error
	h := func(ctx context.Context, d *sqlxbroker.Delivery) error {
		mu.Lock()
		attempts[fmt.Sprint(d.ID())] = append(attempts[fmt.Sprint(d.ID())], d.Attempt())
		mu.Unlock()
		if d.Attempt() != 1 {
			return nil
		}
		select {
		case <-ctx.Done():
			mu.Lock()
			cancelled++
			mu.Unlock()
			return ctx.Err()
		case <-time.After(30 * time.Second):
			return nil // fails below: the loss went unnoticed
		}
	}
	s := subscribe(t, b, tb, h, sqlxbroker.SubscribeParams{
		Concurrency: n, PollInterval: 100 * time.Millisecond, Logger: suiteLogger(),
		OnOutcome: func(d *sqlxbroker.Delivery, o sqlxbroker.Outcome, err error) {
			if err != nil {
				mu.Lock()
				lost = append(lost, err)
				mu.Unlock()
			}
		},
	})
	WaitFor(t, 10*time.Second, "every row in work", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(attempts) == n
	})
	kill(t)
	WaitFor(t, 10*time.Second, "every handler cancelled", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return cancelled == n
	})
	WaitFor(t, 20*time.Second, "every row completed", func() bool {
		return count(t, admin, tg.Dialect, tb.Name, "") == 0
	})
	if err := s.Stop(context.Background()); err != nil {
		t.Errorf("stop: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	for id, as := range attempts {
		if len(as) != 2 || as[1] != 2 {
			t.Errorf("row %s ran with attempts %v, want [1 2]", id, as)
		}
	}
	if st := s.Stats(); st.LeaseLost != n || st.Succeeded != n {
		t.Errorf("stats %+v: want %d lost and %d succeeded", st, n, n)
	}
	for _, err := range lost {
		if !errors.Is(err, sqlxbroker.ErrLeaseLost) {
			t.Errorf("a lost delivery's completion returned %v, want ErrLeaseLost", err)
		}
	}
}

// SessionCrash ends the sessions of a broker holding a claim, as a crash of
// its database connection would (CrashRecovery kills a process instead):
// row-lock rows are claimable at once with the attempt unchanged, advisory
// rows at once with it counted, lease rows once the lease ends with it
// counted. The crashed claim's own completion then changes nothing.
func SessionCrash(t TB, tg *Target, f sqlxbroker.Form) {
	db, kill := tg.sessions(t)
	b1, b2 := sqlxbroker.OpenDialect(db, tg.Dialect), tg.broker(t)
	tb := tg.fresh(t, b2.DB(), f, func(tb *sqlxbroker.Table) {
		if tb.LockedUntil != "" {
			tb.Lease = time.Second
		}
	})
	publish(t, b2, tb, msg{Acct: "crash"})
	f1, f2 := form(t, b1, tb), form(t, b2, tb)
	claimed := time.Now() // the lease runs from before the claim
	cs := claim(t, f1, 1)
	if len(cs) != 1 {
		t.Fatalf("claimed %d rows, want 1", len(cs))
	}
	if f == sqlxbroker.Lease {
		f1.Close() // a crashed process renews nothing
	}
	kill(t)
	killed := time.Now()
	if f == sqlxbroker.Lease {
		if again := claim(t, f2, 1); len(again) != 0 && time.Since(claimed) < tb.LeaseDuration() {
			t.Fatalf("the row was claimed %v after a claim with a %v lease", time.Since(claimed), tb.LeaseDuration())
		}
	}
	var again []core.Claim
	WaitFor(t, 10*time.Second+tb.LeaseDuration(), "the row back after its sessions ended", func() bool {
		again = claim(t, f2, 1)
		return len(again) == 1
	})
	back := time.Since(claimed)
	switch {
	case f == sqlxbroker.Lease && back < tb.LeaseDuration():
		t.Errorf("the row came back %v after its claim, inside its %v lease", back, tb.LeaseDuration())
	case f != sqlxbroker.Lease && time.Since(killed) > 5*time.Second:
		t.Errorf("the %s row came back %v after its sessions ended, want at once", f, time.Since(killed))
	}
	want := map[sqlxbroker.Form]int{sqlxbroker.RowLock: 1, sqlxbroker.Lease: 2, sqlxbroker.Advisory: 2}[f]
	if a := sqlxbroker.NewDelivery(again[0]).Attempt(); a != want {
		t.Errorf("after its sessions ended the %s row reports attempt %d, want %d", f, a, want)
	}
	if f != sqlxbroker.Lease { // the crashed claim's completion fails: its session is gone
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := Complete(ctx, cs[0], sqlxbroker.Outcome{Kind: sqlxbroker.Succeeded})
		cancel()
		if err == nil {
			t.Errorf("the completion of a claim whose session ended succeeded")
		}
	}
	complete(t, again[0], sqlxbroker.Succeeded)
	if n := count(t, b2.DB(), tg.Dialect, tb.Name, ""); n != 0 {
		t.Errorf("%d rows left", n)
	}
	t.Logf("row back %v after its claim, attempt %d", back.Round(time.Millisecond), sqlxbroker.NewDelivery(again[0]).Attempt())
}
