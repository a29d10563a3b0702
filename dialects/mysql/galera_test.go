package mysql_test

import (
	"context"
	"database/sql"
	sqldriver "database/sql/driver"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	driver "github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"

	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/conformance"
	"github.com/sqlxbroker/sqlxbroker/dialects/mysql"
	"github.com/sqlxbroker/sqlxbroker/internal/testreport"
)

const galeraEnv = "SQLXBROKER_GALERA_DSNS"

// galeraDSNs returns the DSNs of the nodes of a Galera cluster (at least
// two), or skips (fails when SQLXBROKER_REQUIRE_GALERA=1) without them.
func galeraDSNs(t *testing.T) []string {
	t.Helper()
	v := strings.TrimSpace(os.Getenv(galeraEnv))
	if v == "" {
		how := fmt.Sprintf("set %s to two or more comma-separated DSNs of one Galera cluster's nodes; eval \"$(bash scripts/galera.sh)\" starts a three-node cluster on loopback and sets it", galeraEnv)
		if os.Getenv("SQLXBROKER_REQUIRE_GALERA") == "1" {
			t.Fatalf("%s is not set and SQLXBROKER_REQUIRE_GALERA=1 forbids skipping: %s", galeraEnv, how)
		}
		testreport.Skip(t, "MariaDB Galera", how)
	}
	dsns := strings.Split(v, ",")
	if len(dsns) < 2 {
		t.Fatalf("%s names %d node; the tests need two", galeraEnv, len(dsns))
	}
	testreport.Tested(t, "MariaDB Galera", galeraEnv)
	return dsns
}

// textDSN is dsn with statements sent as text, which the lease form needs
// on a Galera node.
func textDSN(dsn string) string { return withParams(dsn, "interpolateParams=true") }

// galeraStatus reads a node's counters of transactions it rolled back for
// the cluster: write sets that failed certification, and local
// transactions aborted for a replicated one.
func galeraStatus(t *testing.T, db *sqlx.DB) (certFailures, bfAborts int64) {
	t.Helper()
	rows, err := db.Queryx("SELECT VARIABLE_NAME, VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME IN ('WSREP_LOCAL_CERT_FAILURES', 'WSREP_LOCAL_BF_ABORTS')")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var name string
		var v int64
		if err := rows.Scan(&name, &v); err != nil {
			t.Fatal(err)
		}
		if strings.EqualFold(name, "WSREP_LOCAL_CERT_FAILURES") {
			certFailures = v
		} else {
			bfAborts = v
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return certFailures, bfAborts
}

// waitTable waits until the table, created through another node, exists
// on db's node.
func waitTable(t *testing.T, db *sqlx.DB, name string) {
	t.Helper()
	waitFor(t, 30*time.Second, "table "+name+" on every node", func() bool {
		var n int
		return db.Get(&n, "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?", name) == nil && n == 1
	})
}

// TestGaleraRefusesLockForms: on a Galera node the row-lock and advisory
// forms are refused at Subscribe with a FormError that says why and names
// the lease form; the lease form is accepted on a pool that sends
// statements as text, and refused, naming interpolateParams, on one that
// prepares them.
func TestGaleraRefusesLockForms(t *testing.T) {
	dsns := galeraDSNs(t)
	db := openDB(t, textDSN(dsns[0]))
	b := openBroker(t, db)
	t.Run("LeasePrepared", func(t *testing.T) {
		bp := openBroker(t, openDB(t, dsns[0]))
		tbl := newTable(t, b, sqlxbroker.Table{LockedUntil: "locked_until"}, payload...)
		s, err := bp.Subscribe(context.Background(), tbl, func(context.Context, *sqlxbroker.Delivery) error { return nil }, sqlxbroker.SubscribeParams{})
		if err == nil {
			stop(t, s)
			t.Fatalf("the lease form was accepted on a Galera node through a pool that prepares statements (%s)", dsns[0])
		}
		if !strings.Contains(err.Error(), "interpolateParams=true") {
			t.Errorf("error %q does not name interpolateParams=true", err)
		}
	})
	h := func(context.Context, *sqlxbroker.Delivery) error { return nil }
	for _, f := range forms() {
		t.Run(f.name, func(t *testing.T) {
			tbl := newTable(t, b, f.table, payload...)
			s, err := b.Subscribe(context.Background(), tbl, h, sqlxbroker.SubscribeParams{})
			if tbl.Form() == sqlxbroker.Lease {
				if err != nil {
					t.Fatalf("lease form refused on a Galera node: %v", err)
				}
				stop(t, s)
				return
			}
			if err == nil {
				stop(t, s)
				t.Fatalf("the %s form was accepted on a Galera node", tbl.Form())
			}
			var fe *sqlxbroker.FormError
			if !errors.Is(err, sqlxbroker.ErrFormUnavailable) || !errors.As(err, &fe) {
				t.Fatalf("got %v (%T), want a *FormError matching ErrFormUnavailable", err, err)
			}
			if fe.Form != tbl.Form() {
				t.Errorf("FormError.Form = %s, want %s", fe.Form, tbl.Form())
			}
			for _, want := range []string{"Galera", "lease form", map[sqlxbroker.Form]string{sqlxbroker.RowLock: "row locks", sqlxbroker.Advisory: "GET_LOCK"}[tbl.Form()]} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not say %q", err, want)
				}
			}
		})
	}
}

// TestGaleraDrainTwoNodes: two brokers, each on its own node, drain 10,000
// lease-form rows at once; every row is handled exactly once, at attempt
// 1 (a claim that lost certification counted no attempt), and none is
// left. It logs the rate and the conflicts seen: the claims the engine
// made again (Stats.Conflicts) and the nodes' certification failures and
// aborts.
func TestGaleraDrainTwoNodes(t *testing.T) {
	dsns := galeraDSNs(t)
	for _, d := range []struct {
		name    string
		dialect mysql.Dialect
	}{{"Registered", mysql.Dialect{}}, {"MariaDB", mysql.Dialect{MariaDB: true}}} {
		t.Run(d.name, func(t *testing.T) { drainTwoNodes(t, textDSN(dsns[0]), textDSN(dsns[1]), d.dialect) })
	}
}

func drainTwoNodes(t *testing.T, dsn1, dsn2 string, d mysql.Dialect) {
	const rows = 10000
	n := rows
	if testing.Short() {
		n = 2000
	}
	db1, db2 := openDB(t, dsn1), openDB(t, dsn2)
	b1, b2 := sqlxbroker.OpenDialect(db1, d), sqlxbroker.OpenDialect(db2, d)
	tbl := newTable(t, b1, sqlxbroker.Table{LockedUntil: "locked_until"}, payload...)
	waitTable(t, db2, tbl.Name)
	batch := make([]msg, 0, 1000)
	for i := range n {
		batch = append(batch, msg{N: int64(i)})
		if len(batch) == cap(batch) || i == n-1 {
			publish(t, b1, tbl, batch...)
			batch = batch[:0]
		}
	}
	var want []int64
	if err := db1.Select(&want, "SELECT id FROM `"+tbl.Name+"`"); err != nil {
		t.Fatal(err)
	}
	if len(want) != n {
		t.Fatalf("published %d rows, the table has %d", n, len(want))
	}
	waitFor(t, 30*time.Second, "the rows on node 2", func() bool { return count(t, db2, tbl, "1 = 1") == n })

	var mu sync.Mutex
	handled := map[int64]int{} // id: times handled
	seen := map[int64][]string{}
	var byBroker [2]atomic.Int64
	var badAttempt atomic.Int64
	handler := func(i int) sqlxbroker.Handler {
		return func(_ context.Context, dl *sqlxbroker.Delivery) error {
			id, err := idOf(dl.ID())
			if err != nil {
				t.Error(err)
				return err
			}
			if dl.Attempt() != 1 {
				badAttempt.Add(1)
			}
			lu, _ := dl.Value("locked_until")
			mu.Lock()
			handled[id]++
			seen[id] = append(seen[id], fmt.Sprintf("b%d %s %v", i+1, lu, time.Now().Format("15:04:05.000000")))
			mu.Unlock()
			byBroker[i].Add(1)
			return nil
		}
	}
	cert1, bf1 := galeraStatus(t, db1)
	cert2, bf2 := galeraStatus(t, db2)
	start := time.Now()
	p := sqlxbroker.SubscribeParams{Concurrency: 16, PollInterval: 100 * time.Millisecond}
	s1 := subscribe(t, b1, tbl, handler(0), p)
	s2 := subscribe(t, b2, tbl, handler(1), p)
	waitFor(t, 5*time.Minute, "every row handled", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(handled) >= n
	})
	waitFor(t, time.Minute, "every completion recorded", func() bool {
		st1, st2 := s1.Stats(), s2.Stats()
		return st1.Succeeded+st2.Succeeded+st1.LeaseLost+st2.LeaseLost+st1.CompleteErrors+st2.CompleteErrors >= int64(n)
	})
	elapsed := time.Since(start)
	stop(t, s1)
	stop(t, s2)
	c1, a1 := galeraStatus(t, db1)
	c2, a2 := galeraStatus(t, db2)

	mu.Lock()
	defer mu.Unlock()
	twice := 0
	for id, k := range handled {
		if k != 1 {
			twice++
			if twice <= 5 {
				t.Errorf("row %d handled %d times: %q", id, k, seen[id])
			}
		}
	}
	missing := 0
	for _, id := range want {
		if handled[id] == 0 {
			missing++
		}
	}
	if twice > 0 || missing > 0 || len(handled) != n {
		t.Errorf("%d rows handled more than once, %d never, %d distinct handled of %d", twice, missing, len(handled), n)
	}
	if k := badAttempt.Load(); k > 0 {
		t.Errorf("%d deliveries reported an attempt other than 1", k)
	}
	for i, db := range []*sqlx.DB{db1, db2} {
		waitFor(t, 30*time.Second, fmt.Sprintf("no rows left on node %d", i+1), func() bool { return count(t, db, tbl, "1 = 1") == 0 })
	}
	st1, st2 := s1.Stats(), s2.Stats()
	for i, st := range []sqlxbroker.Stats{st1, st2} {
		if st.LeaseLost != 0 || st.CompleteErrors != 0 || st.ClaimErrors != 0 {
			t.Errorf("broker %d: %d leases lost, %d completion errors, %d claim errors; want none", i+1, st.LeaseLost, st.CompleteErrors, st.ClaimErrors)
		}
	}
	if got := st1.Succeeded + st2.Succeeded; got != int64(n) {
		t.Errorf("%d completions succeeded, want %d", got, n)
	}
	if byBroker[0].Load() == 0 || byBroker[1].Load() == 0 {
		t.Errorf("one broker handled nothing (%d and %d): the drain did not run on two nodes", byBroker[0].Load(), byBroker[1].Load())
	}
	t.Logf("%s: %d rows in %v (%.0f rows/s) by two brokers on two nodes (%d and %d); claims made again after a conflict: %d and %d; node certification failures: %d and %d, aborts for replicated writes: %d and %d",
		d.Name(), n, elapsed.Round(time.Millisecond), float64(n)/elapsed.Seconds(), byBroker[0].Load(), byBroker[1].Load(),
		st1.Conflicts, st2.Conflicts, c1-cert1, c2-cert2, a1-bf1, a2-bf2)
}

func idOf(v any) (int64, error) {
	switch x := v.(type) {
	case int64:
		return x, nil
	case []byte:
		var id int64
		_, err := fmt.Sscan(string(x), &id)
		return id, err
	}
	return 0, fmt.Errorf("id %v of type %T", v, v)
}

// TestGaleraConflicts makes a lease claim and a batched lease completion
// on node 1 lose to a write of node 2 committed between their statements
// and their COMMIT (a hook in the driver): the claim delivers nothing and
// says ErrConflict, the next claim gets the rows at attempt 1; the
// completion is run again by itself and succeeds through its fence.
func TestGaleraConflicts(t *testing.T) {
	dsns := galeraDSNs(t)
	for _, d := range []mysql.Dialect{{}, {MariaDB: true}} {
		t.Run(d.Name(), func(t *testing.T) { conflicts(t, textDSN(dsns[0]), dsns[1], d) })
	}
}

func conflicts(t *testing.T, dsn1, dsn2 string, d mysql.Dialect) {
	db2 := openDB(t, dsn2)
	h := &commitHook{}
	db1 := openHooked(t, dsn1, h)
	b1 := sqlxbroker.OpenDialect(db1, d)
	tbl := newTable(t, b1, sqlxbroker.Table{LockedUntil: "locked_until"}, payload...)
	waitTable(t, db2, tbl.Name)
	const rows = 5
	for i := range rows {
		publish(t, b1, tbl, msg{N: int64(i)})
	}
	waitFor(t, 30*time.Second, "the rows on node 2", func() bool { return count(t, db2, tbl, "1 = 1") == rows })
	f := startForm(t, b1, tbl)
	ctx := context.Background()
	// Node 2 changes the rows while node 1's claim transaction holds them.
	touch := func() {
		if _, err := db2.Exec("UPDATE `" + tbl.Name + "` SET n = n + 100"); err != nil {
			t.Errorf("node 2 update: %v", err)
		}
	}

	h.arm(touch)
	cs, err := f.Claim(ctx, rows)
	if h.fired() != 1 {
		t.Fatalf("the commit hook fired %d times, want 1: the claim did not commit in a transaction", h.fired())
	}
	if !errors.Is(err, sqlxbroker.ErrConflict) || len(cs) != 0 {
		t.Fatalf("claim that lost to node 2: %d claims, err %v; want none and ErrConflict", len(cs), err)
	}
	var me *driver.MySQLError
	if !errors.As(err, &me) || me.Number != 1213 {
		t.Errorf("the conflict's cause is %v, want MySQL error 1213", err)
	}
	// The lost claim left nothing: no lease, no attempt counted.
	waitFor(t, 10*time.Second, "node 2's update on node 1", func() bool { return count(t, db1, tbl, "n >= 100") == rows })
	// A lease written is after the column's default (1970-01-01).
	if k := count(t, db1, tbl, "locked_until > '1970-01-01 00:00:00' OR attempt <> 1"); k != 0 {
		t.Fatalf("%d rows leased or counted by the claim that lost", k)
	}
	cs = nil
	waitFor(t, 10*time.Second, "the rows claimed again", func() bool {
		got, err := f.Claim(ctx, rows-len(cs))
		if err != nil {
			t.Fatalf("claim: %v", err)
		}
		cs = append(cs, got...)
		return len(cs) == rows
	})
	for _, c := range cs {
		if c.Row().Attempt != 1 {
			t.Errorf("row %v delivered at attempt %d, want 1", c.Row().ID, c.Row().Attempt)
		}
	}

	// The completions, the last three in one batch: the first two hold
	// both of the form's flushers at the gate while the three queue; node
	// 2 changes the rows between the batch's statements and its COMMIT.
	h.closeGate()
	errs := make(chan error, len(cs))
	done := func(err error) { errs <- err }
	ok := sqlxbroker.Outcome{Kind: sqlxbroker.Succeeded}
	t.Cleanup(h.openGate)
	for i, c := range cs[:2] {
		c.Complete(ctx, ok, done)
		waitFor(t, 10*time.Second, fmt.Sprintf("%d completions at the gate", i+1), func() bool { return h.atGate() == i+1 })
	}
	h.arm(touch)
	for _, c := range cs[2:] {
		c.Complete(ctx, ok, done)
	}
	h.openGate()
	for range cs {
		if err := <-errs; err != nil {
			t.Errorf("completion: %v, want it recorded (run again after the conflict)", err)
		}
	}
	if h.fired() != 2 {
		t.Errorf("the commit hook fired %d times in all, want 2: the batch did not commit in a transaction", h.fired())
	}
	if k := count(t, db1, tbl, "1 = 1"); k != 0 {
		t.Errorf("%d rows left after their completions", k)
	}
}

// commitHook runs its function once, before the next COMMIT of a hooked
// pool, once armed; and while its gate is closed, holds the pool's DELETE
// statements.
type commitHook struct {
	mu      sync.Mutex
	fn      func()
	n       int
	gate    chan struct{} // nil: open
	waiting int
}

func (h *commitHook) closeGate() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.gate = make(chan struct{})
}

func (h *commitHook) openGate() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.gate != nil {
		close(h.gate)
		h.gate = nil
	}
}

func (h *commitHook) atGate() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.waiting
}

// pass waits at the gate, if closed, for a DELETE statement.
func (h *commitHook) pass(query string) {
	if !strings.HasPrefix(strings.TrimSpace(query), "DELETE") {
		return
	}
	h.mu.Lock()
	g := h.gate
	if g != nil {
		h.waiting++
	}
	h.mu.Unlock()
	if g == nil {
		return
	}
	<-g
	h.mu.Lock()
	h.waiting--
	h.mu.Unlock()
}

func (h *commitHook) arm(fn func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.fn = fn
}

func (h *commitHook) fired() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.n
}

func (h *commitHook) beforeCommit() {
	h.mu.Lock()
	fn := h.fn
	h.fn = nil
	if fn != nil {
		h.n++
	}
	h.mu.Unlock()
	if fn != nil {
		fn()
	}
}

// openHooked opens a pool on dsn whose transactions run h before COMMIT.
// Its driver name is "mysql", so the registered dialect binds as usual.
func openHooked(t *testing.T, dsn string, h *commitHook) *sqlx.DB {
	t.Helper()
	cfg, err := driver.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	c, err := driver.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	db := sqlx.NewDb(sql.OpenDB(hookConnector{c, h}), "mysql")
	t.Cleanup(func() { db.Close() })
	return db
}

type hookConnector struct {
	sqldriver.Connector
	h *commitHook
}

func (c hookConnector) Connect(ctx context.Context) (sqldriver.Conn, error) {
	conn, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	mc, ok := conn.(mysqlConn)
	if !ok {
		conn.Close()
		return nil, fmt.Errorf("the MySQL driver's connection %T lacks an interface the hook wraps", conn)
	}
	return &hookConn{mc, c.h}, nil
}

// mysqlConn is what the MySQL driver's connections do beyond driver.Conn.
type mysqlConn interface {
	sqldriver.Conn
	sqldriver.ConnBeginTx
	sqldriver.ExecerContext
	sqldriver.QueryerContext
	sqldriver.ConnPrepareContext
	sqldriver.Pinger
	sqldriver.SessionResetter
	sqldriver.NamedValueChecker
}

type hookConn struct {
	mysqlConn
	h *commitHook
}

func (c *hookConn) BeginTx(ctx context.Context, opts sqldriver.TxOptions) (sqldriver.Tx, error) {
	tx, err := c.mysqlConn.BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	return hookTx{tx, c.h}, nil
}

func (c *hookConn) ExecContext(ctx context.Context, query string, args []sqldriver.NamedValue) (sqldriver.Result, error) {
	c.h.pass(query)
	return c.mysqlConn.ExecContext(ctx, query, args)
}

func (c *hookConn) QueryContext(ctx context.Context, query string, args []sqldriver.NamedValue) (sqldriver.Rows, error) {
	c.h.pass(query)
	return c.mysqlConn.QueryContext(ctx, query, args)
}

type hookTx struct {
	sqldriver.Tx
	h *commitHook
}

func (t hookTx) Commit() error {
	t.h.beforeCommit()
	return t.Tx.Commit()
}

// TestGaleraFIFOTwoNodes: FIFO groups of a lease table drained by brokers
// on two nodes keep their order and run one row of a group at a time
// (fifoTwoBrokers): two claims of a group's head on two nodes conflict on
// that row, and the loser delivers nothing.
func TestGaleraFIFOTwoNodes(t *testing.T) {
	dsns := galeraDSNs(t)
	b1, b2 := openBroker(t, openDB(t, textDSN(dsns[0]))), openBroker(t, openDB(t, textDSN(dsns[1])))
	tbl := newTable(t, b1, sqlxbroker.Table{LockedUntil: "locked_until", Group: "grp"}, payload...)
	waitTable(t, b2.DB(), tbl.Name)
	fifoTwoBrokers(t, b1, b2, tbl)
}

// TestGaleraConformanceLease runs the shared suite's lease form against one
// node of the cluster (the other forms are refused there), at the short
// volumes unless SQLXBROKER_GALERA_FULL=1: the full ones take minutes on a
// cluster (OperationsAtScale's 120,000 rows).
func TestGaleraConformanceLease(t *testing.T) {
	tg := target(t, textDSN(galeraDSNs(t)[0]))
	tg.Forms = []sqlxbroker.Form{sqlxbroker.Lease}
	tg.Short = os.Getenv("SQLXBROKER_GALERA_FULL") != "1"
	conformance.Run(t, tg)
}
