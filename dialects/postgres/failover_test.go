package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/dialects/postgres"
	"github.com/sqlxbroker/sqlxbroker/internal/testreport"
)

// TestOpenDropsReadOnlyConn: a connection of a pool from Open whose
// statement failed with 25006 (its session is read-only, as on a standby)
// is closed, not pooled: the next statement runs on a new session. A pool
// from sqlx.Open keeps the session (what Open changes).
func TestOpenDropsReadOnlyConn(t *testing.T) {
	s := dsn(t)
	ctx := context.Background()
	const create = "CREATE TEMP TABLE failover_ro (id int)"
	fails := map[string]func(db *sqlx.DB) error{
		"statement": func(db *sqlx.DB) error { _, err := db.ExecContext(ctx, create); return err },
		"transaction": func(db *sqlx.DB) error {
			tx, err := db.BeginTxx(ctx, nil)
			if err != nil {
				return err
			}
			defer tx.Rollback()
			// lib/pq begins READ WRITE, which a session default does not
			// override (a standby refuses the BEGIN itself).
			if _, err := tx.ExecContext(ctx, "SET TRANSACTION READ ONLY"); err != nil {
				return err
			}
			_, err = tx.ExecContext(ctx, create)
			return err
		},
		"prepared": func(db *sqlx.DB) error {
			st, err := db.PreparexContext(ctx, create)
			if err != nil {
				return err
			}
			defer st.Close()
			_, err = st.ExecContext(ctx)
			return err
		},
	}
	// after sets the pool's one session read-only, runs fail and says
	// whether the next statement ran on the same session, and its setting.
	after := func(t *testing.T, db *sqlx.DB, fail func(*sqlx.DB) error) (same bool, readOnly string) {
		t.Helper()
		var pid1, pid2 int
		if err := db.GetContext(ctx, &pid1, "SELECT pg_backend_pid()"); err != nil {
			t.Fatal(err)
		}
		if _, err := db.ExecContext(ctx, "SET default_transaction_read_only = on"); err != nil {
			t.Fatal(err)
		}
		err := fail(db)
		var pe *pq.Error
		if !errors.As(err, &pe) || pe.Code != "25006" || !postgres.Stale(err) {
			t.Fatalf("CREATE on a read-only session: %v, want SQLSTATE 25006 (Stale)", err)
		}
		if err := db.GetContext(ctx, &pid2, "SELECT pg_backend_pid()"); err != nil {
			t.Fatal(err)
		}
		if err := db.GetContext(ctx, &readOnly, "SHOW default_transaction_read_only"); err != nil {
			t.Fatal(err)
		}
		_, _ = db.ExecContext(ctx, "RESET default_transaction_read_only")
		return pid1 == pid2, readOnly
	}
	for name, fail := range fails {
		t.Run(name, func(t *testing.T) {
			db, err := postgres.Open(s)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			db.SetMaxOpenConns(1)
			if same, ro := after(t, db, fail); same || ro != "off" {
				t.Fatalf("Open: after 25006, same session %v, default_transaction_read_only %s; want a new session (off)", same, ro)
			}
			plain := openDB(t, "")
			plain.SetMaxOpenConns(1)
			if same, ro := after(t, plain, fail); !same || ro != "on" {
				t.Fatalf("sqlx.Open: after 25006, same session %v, default_transaction_read_only %s; want the session kept (on)", same, ro)
			}
		})
	}
}

func TestStale(t *testing.T) {
	for code, want := range map[pq.ErrorCode]bool{
		"25006": true, "57P01": true, "57P03": true, "08006": true,
		"57014": false, "40001": false, "23505": false, "25P02": false,
	} {
		if got := postgres.Stale(fmt.Errorf("wrapped: %w", &pq.Error{Code: code})); got != want {
			t.Errorf("Stale(%s) = %v, want %v", code, got, want)
		}
	}
	if postgres.Stale(io.EOF) || postgres.Stale(nil) {
		t.Error("Stale of a non-server error")
	}
}

// TestOpenMultiHostDSN: Open takes the multi-host DSN forms lib/pq reads,
// and refuses per-host ports in a URL, which lib/pq would read as part of
// the host name.
func TestOpenMultiHostDSN(t *testing.T) {
	for _, dsn := range []string{
		"host=db1,db2 port=5432,5433 dbname=app target_session_attrs=read-write",
		"postgres://app@db1,db2:5433/app?target_session_attrs=read-write",
		"postgres://app@/app?host=db1,db2&port=5432,5433&target_session_attrs=read-write",
		"postgres://app@[::1]:5432/app",
		"host=/var/run/postgresql dbname=app",
	} {
		db, err := postgres.Open(dsn)
		if err != nil {
			t.Errorf("Open(%q): %v", dsn, err)
			continue
		}
		db.Close()
	}
	_, err := postgres.Open("postgres://app@db1:5432,db2:5433/app?target_session_attrs=read-write")
	if err == nil || !strings.Contains(err.Error(), `host "db1:5432"`) {
		t.Fatalf("Open with per-host ports in a URL: %v, want an error naming the host", err)
	}
}

// pgBin is where the PostgreSQL server binaries the failover test runs are.
func pgBin() string {
	if b := os.Getenv("SQLXBROKER_PG_BIN"); b != "" {
		return b
	}
	return "/usr/lib/postgresql/15/bin"
}

// pgNode is a PostgreSQL server the test runs from a data directory of its
// own, on a loopback port.
type pgNode struct {
	t     *testing.T
	name  string
	base  string // the test's directory, owned by the server's user
	dir   string // data directory
	port  int
	runAs []string // runuser prefix when the test runs as root
}

func (n *pgNode) dsn() string {
	return fmt.Sprintf("host=127.0.0.1 port=%d user=root dbname=postgres sslmode=disable connect_timeout=2", n.port)
}

func (n *pgNode) addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(n.port)) }

// cmd runs a server binary as the server's user, failing the test on error.
func (n *pgNode) cmd(name string, args ...string) {
	n.t.Helper()
	if out, err := n.try(name, args...); err != nil {
		n.t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}

func (n *pgNode) try(name string, args ...string) ([]byte, error) {
	argv := append(append(append([]string{}, n.runAs...), filepath.Join(pgBin(), name)), args...)
	c := exec.Command(argv[0], argv[1:]...)
	c.Dir = n.base
	return c.CombinedOutput()
}

// start starts the server; a port taken meanwhile by another program is
// replaced by a new free one (up to three tries).
func (n *pgNode) start() {
	n.t.Helper()
	log := filepath.Join(n.base, n.name+".log")
	for try := 1; ; try++ {
		out, err := n.try("pg_ctl", "-D", n.dir, "-l", log, "-w", "-t", "60", "start")
		if err == nil {
			return
		}
		text, _ := os.ReadFile(log)
		if try == 3 || !strings.Contains(string(text), "already in use") {
			n.t.Fatalf("pg_ctl start %s: %v\n%s\n%s", n.name, err, out, text)
		}
		n.port = freePort(n.t)
		n.conf(fmt.Sprintf("port = %d", n.port))
	}
}

// stop stops the server at once, as a crash would: no shutdown checkpoint,
// sessions cut.
func (n *pgNode) stop() { n.cmd("pg_ctl", "-D", n.dir, "-m", "immediate", "-w", "stop") }

func (n *pgNode) conf(lines ...string) {
	n.t.Helper()
	f, err := os.OpenFile(filepath.Join(n.dir, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		n.t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString("\n" + strings.Join(lines, "\n") + "\n"); err != nil {
		n.t.Fatal(err)
	}
}

func (n *pgNode) open() *sqlx.DB {
	n.t.Helper()
	db, err := sqlx.Open("postgres", n.dsn())
	if err != nil {
		n.t.Fatal(err)
	}
	n.t.Cleanup(func() { db.Close() })
	return db
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startPair starts a primary and a streaming standby made from it with
// pg_basebackup, in synchronous replication (synchronous_standby_names =
// '*'): a commit the primary acknowledged is on the standby's disk, so a
// promotion loses none. They stop, and their directory goes, at the end of
// the test. It skips when the server binaries are missing.
func startPair(t *testing.T) (primary, standby *pgNode) {
	t.Helper()
	if _, err := os.Stat(filepath.Join(pgBin(), "pg_basebackup")); err != nil {
		msg := fmt.Sprintf("no PostgreSQL server binaries in %s (install postgresql-15, or set SQLXBROKER_PG_BIN to the directory of initdb, pg_ctl and pg_basebackup)", pgBin())
		if os.Getenv("SQLXBROKER_REQUIRE_DB") == "1" {
			t.Fatal(msg + " (SQLXBROKER_REQUIRE_DB=1 forbids the skip)")
		}
		testreport.Skip(t, "PostgreSQL failover", msg)
	}
	var runAs []string
	uid, gid := -1, -1
	if os.Geteuid() == 0 { // the server refuses to run as root
		u, err := user.Lookup("postgres")
		if err != nil {
			testreport.Skip(t, "PostgreSQL failover", "running as root and no user postgres to run the servers as: create one, or run the test as another user")
		}
		uid, _ = strconv.Atoi(u.Uid)
		gid, _ = strconv.Atoi(u.Gid)
		runAs = []string{"runuser", "-u", "postgres", "--"}
	}
	testreport.Tested(t, "PostgreSQL failover", "a primary and a standby from "+pgBin())
	reapClusters(t, runAs)
	base, err := os.MkdirTemp("", "sqlxbroker-failover-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	if err := os.WriteFile(filepath.Join(base, "owner.pid"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		t.Fatal(err)
	}
	if uid >= 0 {
		if err := os.Chown(base, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	primary = &pgNode{t: t, name: "primary", base: base, dir: filepath.Join(base, "primary"), port: freePort(t), runAs: runAs}
	standby = &pgNode{t: t, name: "standby", base: base, dir: filepath.Join(base, "standby"), port: freePort(t), runAs: runAs}
	primary.cmd("initdb", "-D", primary.dir, "-U", "root", "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync")
	common := []string{"listen_addresses = '127.0.0.1'", "unix_socket_directories = ''", "fsync = off",
		"shared_buffers = 32MB", "max_connections = 80", "wal_level = replica", "hot_standby = on", "max_wal_senders = 4"}
	primary.conf(append(common, fmt.Sprintf("port = %d", primary.port))...)
	primary.start()
	t.Cleanup(func() { _, _ = primary.try("pg_ctl", "-D", primary.dir, "-m", "immediate", "-w", "stop") })
	// pg_hba from initdb -A trust lets 127.0.0.1 in, replication included.
	standby.cmd("pg_basebackup", "-h", "127.0.0.1", "-p", strconv.Itoa(primary.port), "-U", "root",
		"-D", standby.dir, "-R", "-X", "stream", "--no-sync", "-c", "fast")
	standby.conf(fmt.Sprintf("port = %d", standby.port))
	standby.start()
	t.Cleanup(func() { _, _ = standby.try("pg_ctl", "-D", standby.dir, "-m", "immediate", "-w", "stop") })

	pdb := primary.open()
	// Synchronous from now on (the standby's configuration was copied
	// before, so once promoted it waits for no standby of its own).
	for _, q := range []string{"ALTER SYSTEM SET synchronous_standby_names = '*'", "SELECT pg_reload_conf()"} {
		if _, err := pdb.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	waitUntil(t, 30*time.Second, "the standby streaming in synchronous replication", func() (bool, error) {
		var n int
		err := pdb.Get(&n, "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming' AND sync_state = 'sync'")
		return n == 1, err
	})
	var rec bool
	if err := standby.open().Get(&rec, "SELECT pg_is_in_recovery()"); err != nil || !rec {
		t.Fatalf("standby in recovery: %v, %v", rec, err)
	}
	return primary, standby
}

// reapClusters stops the servers, and removes the directory, of clusters
// an earlier test process left behind (it was killed or timed out before
// its cleanup ran): their owner.pid names a process that is gone.
func reapClusters(t *testing.T, runAs []string) {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), "sqlxbroker-failover-*"))
	for _, base := range dirs {
		b, err := os.ReadFile(filepath.Join(base, "owner.pid"))
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || pid == os.Getpid() || syscall.Kill(pid, 0) != syscall.ESRCH {
			continue // still running (or not ours to judge)
		}
		for _, name := range []string{"primary", "standby"} {
			n := &pgNode{t: t, name: name, base: base, dir: filepath.Join(base, name), runAs: runAs}
			_, _ = n.try("pg_ctl", "-D", n.dir, "-m", "immediate", "-w", "stop")
		}
		t.Logf("removed the clusters of test process %d, which ended without its cleanup: %s", pid, base)
		os.RemoveAll(base)
	}
}

// waitUntil polls cond until it holds, failing the test after limit.
func waitUntil(t *testing.T, limit time.Duration, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(limit)
	var last error
	for {
		ok, err := cond()
		if ok && err == nil {
			return
		}
		if err != nil {
			last = err
		}
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s (last error: %v)", limit, what, last)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// replayed waits until the standby has replayed everything the primary has
// written so far: with asynchronous replication, what an immediate stop
// would lose otherwise.
func replayed(t *testing.T, primary, standby *sqlx.DB) {
	t.Helper()
	var lsn string
	if err := primary.Get(&lsn, "SELECT pg_current_wal_lsn()::text"); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 30*time.Second, "the standby to replay "+lsn, func() (bool, error) {
		var ok bool
		err := standby.Get(&ok, "SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn", lsn)
		return ok, err
	})
}

// tcpProxy forwards loopback connections to a target it can be moved off,
// as a DNS name, a virtual IP or a pooler moves to a new primary.
type tcpProxy struct {
	ln     net.Listener
	target atomic.Value // string
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
}

func newProxy(t *testing.T, target string) *tcpProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &tcpProxy{ln: ln, conns: map[net.Conn]struct{}{}}
	p.target.Store(target)
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(func() {
		ln.Close()
		p.cut()
		p.wg.Wait()
	})
	return p
}

func (p *tcpProxy) port() int { return p.ln.Addr().(*net.TCPAddr).Port }

func (p *tcpProxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.DialTimeout("tcp", p.target.Load().(string), 2*time.Second)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns[c], p.conns[s] = struct{}{}, struct{}{}
		p.mu.Unlock()
		p.wg.Add(2)
		pipe := func(dst, src net.Conn) {
			defer p.wg.Done()
			_, _ = io.Copy(dst, src)
			dst.Close()
			src.Close()
			p.mu.Lock()
			delete(p.conns, dst)
			delete(p.conns, src)
			p.mu.Unlock()
		}
		go pipe(c, s)
		go pipe(s, c)
	}
}

// moveTo sends new connections to target.
func (p *tcpProxy) moveTo(target string) { p.target.Store(target) }

// cut closes every connection through the proxy.
func (p *tcpProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
	}
}

// TestFailover publishes rows to a table of each form (lease, row lock,
// advisory lock; 5,000 to the lease table and 2,000 to each other with the
// multi-host DSN, 2,000 each through the proxy) on a primary, drains them with a subscription each, stops
// the primary with deliveries in work and promotes the standby. The
// subscriptions must resume on the new primary by themselves and drain
// every row, none completed twice.
//
// "multi-host": the pool's DSN names both servers with
// target_session_attrs=read-write. "proxy": the DSN names a TCP proxy that
// moves to the standby after the primary stopped and before the promotion
// (the claims meanwhile meet a server in recovery: 25006).
func TestFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two PostgreSQL servers; not in -short")
	}
	t.Run("multi-host", func(t *testing.T) {
		primary, standby := startPair(t)
		dsn := fmt.Sprintf("host=127.0.0.1,127.0.0.1 port=%d,%d user=root dbname=postgres sslmode=disable connect_timeout=2 target_session_attrs=read-write",
			primary.port, standby.port)
		failover(t, primary, standby, dsn, nil, [3]int{5000, 2000, 2000})
	})
	t.Run("proxy", func(t *testing.T) {
		primary, standby := startPair(t)
		px := newProxy(t, primary.addr())
		dsn := fmt.Sprintf("host=127.0.0.1 port=%d user=root dbname=postgres sslmode=disable connect_timeout=2", px.port())
		failover(t, primary, standby, dsn, px, [3]int{2000, 2000, 2000})
	})
}

// failover runs TestFailover's scenario with a pool on dsn, publishing
// counts[i] rows to the lease, row-lock and advisory table; px, when set, is
// moved to the standby once the primary stopped.
func failover(t *testing.T, primary, standby *pgNode, dsn string, px *tcpProxy, counts [3]int) {
	const concurrency = 8
	ctx := context.Background()
	db, err := postgres.Open(dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(2*concurrency + 8)
	db.SetMaxIdleConns(2*concurrency + 8)
	var listenErrs sync.Map // what the wake-up listener logged
	b := sqlxbroker.OpenDialect(db, postgres.Dialect{Logger: quietLogger(&listenErrs)})
	lease := sqlxbroker.Table{Name: "failover_lease", LockedUntil: "locked_until", Lease: 2 * time.Second}
	rowLock := sqlxbroker.Table{Name: "failover_rowlock"}
	advisory := sqlxbroker.Table{Name: "failover_advisory", AdvisoryLock: "k-{n}"}
	tables := []sqlxbroker.Table{lease, rowLock, advisory}
	for i, tb := range tables {
		if err := b.CreateTable(ctx, tb, [2]string{"n", "bigint"}); err != nil {
			t.Fatal(err)
		}
		msgs := make([]any, counts[i])
		for i := range msgs {
			msgs[i] = map[string]any{"n": i}
		}
		if err := b.Publish(ctx, db, tb, msgs...); err != nil {
			t.Fatal(err)
		}
	}
	// Row-lock handlers write an audit row in the delivery's transaction:
	// it commits with the row's deletion or not at all.
	if _, err := db.Exec("CREATE TABLE failover_audit (id bigint NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	pdb, sdb := primary.open(), standby.open()
	replayed(t, pdb, sdb) // synchronous already; asynchronous would need it

	// Handlers of rows past the first half wait at the gate, so the stop
	// finds every handler in work.
	gate := make(chan struct{})
	var openGate sync.Once
	defer openGate.Do(func() { close(gate) }) // before the subscriptions stop
	var waiting [3]atomic.Int64
	type tally struct {
		mu       sync.Mutex
		ok       map[int64]int // completions recorded, by id
		failed   map[int64]int // completions that returned an error
		handled  map[int64]int
		attempts map[int64][]int // each delivery's Attempt, by id
		firstOK  time.Time       // the first completion after the promotion
		promoted time.Time
	}
	var tallies [3]*tally
	var claimErrs sync.Map // error texts the claims met
	subs := make([]*sqlxbroker.Subscription, len(tables))
	for i, tb := range tables {
		ty := &tally{ok: map[int64]int{}, failed: map[int64]int{}, handled: map[int64]int{}, attempts: map[int64][]int{}}
		tallies[i] = ty
		rows := int64(counts[i])
		h := func(ctx context.Context, d *sqlxbroker.Delivery) error {
			id := d.ID().(int64)
			ty.mu.Lock()
			ty.handled[id]++
			ty.attempts[id] = append(ty.attempts[id], d.Attempt())
			ty.mu.Unlock()
			if id > rows/2 {
				select {
				case <-gate:
				default:
					waiting[i].Add(1)
					select {
					case <-gate:
					case <-ctx.Done():
					}
					waiting[i].Add(-1)
				}
			}
			if tb.Form() == sqlxbroker.RowLock {
				tx, err := d.Tx()
				if err != nil {
					return err
				}
				if _, err := tx.ExecContext(ctx, "INSERT INTO failover_audit (id) VALUES ($1)", id); err != nil {
					return err
				}
			}
			return nil
		}
		sub, err := b.Subscribe(ctx, tb, h, sqlxbroker.SubscribeParams{
			Concurrency: concurrency, PollInterval: 200 * time.Millisecond,
			RetryDelay: func(int, error) time.Duration { return 0 },
			Logger:     quietLogger(&claimErrs),
			OnOutcome: func(d *sqlxbroker.Delivery, o sqlxbroker.Outcome, err error) {
				id := d.ID().(int64)
				ty.mu.Lock()
				defer ty.mu.Unlock()
				switch {
				case err != nil:
					ty.failed[id]++
				case o.Kind == sqlxbroker.Succeeded:
					ty.ok[id]++
					if !ty.promoted.IsZero() && ty.firstOK.IsZero() {
						ty.firstOK = time.Now()
					}
				}
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		subs[i] = sub
	}
	defer func() {
		openGate.Do(func() { close(gate) })
		for _, s := range subs {
			_ = s.Stop(ctx)
		}
		_ = b.Close(ctx)
	}()
	// A subscription that never polls (PollInterval an hour) across the
	// failover: after it, only a wake-up on the promoted server delivers.
	wakeT := sqlxbroker.Table{Name: "failover_wake", LockedUntil: "locked_until"}
	if err := b.CreateTable(ctx, wakeT); err != nil {
		t.Fatal(err)
	}
	woken := make(chan any, 10)
	wakeSub, err := b.Subscribe(ctx, wakeT, func(_ context.Context, d *sqlxbroker.Delivery) error {
		woken <- d.ID()
		return nil
	}, sqlxbroker.SubscribeParams{PollInterval: time.Hour, MinPollInterval: time.Hour, Logger: quietLogger(&claimErrs)})
	if err != nil {
		t.Fatal(err)
	}
	defer wakeSub.Stop(ctx)
	// Every delivery in work waits there (the lease form claims batches of
	// at least half its Concurrency, so it may hold fewer than 8).
	waitUntil(t, 60*time.Second, "every delivery in work waiting at the gate", func() (bool, error) {
		var why []string
		for i, s := range subs {
			if w := waiting[i].Load(); w == 0 || int(w) != s.InFlight() {
				why = append(why, fmt.Sprintf("%s: %d of %d waiting (%+v)", tables[i].Name, w, s.InFlight(), s.Stats()))
			}
		}
		if why != nil {
			return false, errors.New(strings.Join(why, "; "))
		}
		return true, nil
	})

	stopAt := time.Now()
	primary.stop()
	openGate.Do(func() { close(gate) }) // the handlers' completions meet a dead server
	if px != nil {
		px.moveTo(standby.addr())
		// Claims reach the standby and fail there (25006) until it is
		// promoted; each failing connection is dropped.
		waitUntil(t, 30*time.Second, "a claim refused by the standby", func() (bool, error) {
			return logged(&claimErrs, "25006"), nil
		})
		// The wake-up listener reconnects to it and is refused too.
		waitUntil(t, 30*time.Second, "the wake-up listener refused by the standby", func() (bool, error) {
			return logged(&listenErrs, "cannot execute LISTEN during recovery"), nil
		})
	}
	promoteStart := time.Now()
	standby.cmd("pg_ctl", "-D", standby.dir, "-w", "-t", "60", "promote")
	promoted := time.Now()
	for _, ty := range tallies {
		ty.mu.Lock()
		ty.promoted = promoted
		ty.mu.Unlock()
	}
	t.Logf("primary stopped; promotion took %v (%v after the stop)", promoted.Sub(promoteStart), promoted.Sub(stopAt))

	// Drained: no row left on the new primary, and the audit complete.
	waitUntil(t, 60*time.Second, "the tables drained on the new primary", func() (bool, error) {
		var n int
		err := sdb.Get(&n, "SELECT (SELECT count(*) FROM failover_lease) + (SELECT count(*) FROM failover_rowlock) + (SELECT count(*) FROM failover_advisory)")
		return n == 0, err
	})
	drained := time.Now()
	for _, s := range subs {
		if err := s.Stop(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for i, tb := range tables {
		ty := tallies[i]
		ty.mu.Lock()
		for id := int64(1); id <= int64(counts[i]); id++ {
			switch {
			case ty.handled[id] == 0:
				t.Errorf("%s: row %d never handled", tb.Name, id)
			case ty.ok[id] > 1:
				t.Errorf("%s: row %d completed %d times", tb.Name, id, ty.ok[id])
			case ty.ok[id] == 0 && ty.failed[id] == 0:
				// Gone from the table with no completion recorded: only a
				// completion whose answer was lost may do that.
				t.Errorf("%s: row %d gone with no completion recorded", tb.Name, id)
			}
		}
		var again, failed int
		for id, n := range ty.handled {
			if n > 1 {
				again++
				// A row-lock delivery cut off counts no attempt (its
				// transaction rolled back); the other forms count one at
				// the claim.
				a := ty.attempts[id]
				for k := 1; k < len(a); k++ {
					if tb.Form() == sqlxbroker.RowLock && a[k] != a[k-1] || tb.Form() != sqlxbroker.RowLock && a[k] <= a[k-1] {
						t.Errorf("%s: row %d delivered with attempts %v", tb.Name, id, a)
						break
					}
				}
			}
			if ty.failed[id] > 0 {
				failed++
			}
		}
		resume := "no completion after the promotion"
		if !ty.firstOK.IsZero() {
			resume = ty.firstOK.Sub(promoted).Round(time.Millisecond).String()
		}
		if !ty.firstOK.IsZero() {
			resume += fmt.Sprintf(" after the promotion (%v after the stop)", ty.firstOK.Sub(stopAt).Round(time.Millisecond))
		}
		t.Logf("%s (%s, %d rows): first completion %s; drained %v after it; %d rows handled again, %d completions failed at the failover",
			tb.Name, tb.Form(), counts[i], resume, drained.Sub(promoted).Round(time.Millisecond), again, failed)
		if ty.firstOK.IsZero() {
			t.Errorf("%s: no completion after the promotion", tb.Name)
		}
		ty.mu.Unlock()
	}
	// Wake-ups work on the new primary: a publish through another pool (no
	// in-process wake-up) reaches the subscription that never polls.
	other := standby.open()
	ob, err := sqlxbroker.Open(other)
	if err != nil {
		t.Fatal(err)
	}
	published := time.Now()
	if err := ob.Publish(ctx, other, wakeT, map[string]any{"attempt": 1}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-woken:
		t.Logf("a publish on the new primary woke the subscription in %v", time.Since(published).Round(time.Millisecond))
	case <-time.After(30 * time.Second):
		t.Errorf("a publish on the new primary woke no subscription in 30s; the listener logged: %v", keys(&listenErrs))
	}
	var dup, distinct int
	if err := sdb.Get(&dup, "SELECT count(*) FROM (SELECT id FROM failover_audit GROUP BY id HAVING count(*) > 1) d"); err != nil {
		t.Fatal(err)
	}
	if err := sdb.Get(&distinct, "SELECT count(DISTINCT id) FROM failover_audit"); err != nil {
		t.Fatal(err)
	}
	if dup != 0 || distinct != counts[1] {
		t.Errorf("row-lock audit: %d rows handled more than once in committed work, %d distinct of %d", dup, distinct, counts[1])
	}
}

// logged reports whether a recorded line contains text.
func logged(seen *sync.Map, text string) bool {
	found := false
	seen.Range(func(k, _ any) bool {
		found = strings.Contains(k.(string), text)
		return !found
	})
	return found
}

// keys lists the recorded lines.
func keys(seen *sync.Map) []string {
	var out []string
	seen.Range(func(k, _ any) bool { out = append(out, k.(string)); return true })
	return out
}

// quietLogger records the error texts of the lines logged (claim and
// completion errors) in seen instead of printing them.
func quietLogger(seen *sync.Map) *slog.Logger {
	return slog.New(&recordHandler{seen: seen})
}

type recordHandler struct{ seen *sync.Map }

func (h *recordHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *recordHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *recordHandler) WithGroup(string) slog.Handler            { return h }
func (h *recordHandler) Handle(_ context.Context, r slog.Record) error {
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "err" {
			h.seen.Store(r.Message+": "+a.Value.String(), true)
		}
		return true
	})
	return nil
}
