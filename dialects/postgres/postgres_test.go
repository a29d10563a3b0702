package postgres_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	_ "github.com/glebarez/go-sqlite" // a non-pq driver for the Listen refusal
	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/conformance"
	"github.com/sqlxbroker/sqlxbroker/core"
	"github.com/sqlxbroker/sqlxbroker/dialects/postgres"
	"github.com/sqlxbroker/sqlxbroker/internal/testreport"
)

// Run against a live server with
//
//	SQLXBROKER_POSTGRES_DSN='postgres://root@127.0.0.1:5432/test?sslmode=disable' go test -race ./dialects/postgres/
//
// SQLXBROKER_REQUIRE_DB=1 turns the skip without a DSN into a failure (CI).

func dsn(t *testing.T) string {
	t.Helper()
	s := os.Getenv("SQLXBROKER_POSTGRES_DSN")
	if s == "" {
		msg := "no PostgreSQL: set SQLXBROKER_POSTGRES_DSN, e.g. 'postgres://user@127.0.0.1:5432/db?sslmode=disable'"
		if os.Getenv("SQLXBROKER_REQUIRE_DB") == "1" {
			t.Fatal(msg + " (SQLXBROKER_REQUIRE_DB=1 forbids the skip)")
		}
		testreport.Skip(t, "PostgreSQL", msg)
	}
	testreport.Tested(t, "PostgreSQL", "SQLXBROKER_POSTGRES_DSN")
	return s
}

// openDB opens a new pool; app, when set, becomes its application_name so a
// test can find (and kill) its sessions.
func openDB(t *testing.T, app string) *sqlx.DB {
	t.Helper()
	s := dsn(t)
	if app != "" {
		switch {
		case strings.Contains(s, "://") && strings.Contains(s, "?"):
			s += "&application_name=" + app
		case strings.Contains(s, "://"):
			s += "?application_name=" + app
		default:
			s += " application_name=" + app
		}
	}
	db, err := sqlx.Open("postgres", s)
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(30)
	db.SetMaxIdleConns(30)
	if err := db.Ping(); err != nil {
		t.Fatalf("ping %s: %v", s, err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func openBroker(t *testing.T, db *sqlx.DB) *sqlxbroker.Broker {
	t.Helper()
	b, err := sqlxbroker.Open(db)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func uniq(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// formCase is one claim form's table description.
type formCase struct {
	name  string
	table func(name string, lease time.Duration) sqlxbroker.Table
}

var formCases = []formCase{
	{"rowlock", func(n string, _ time.Duration) sqlxbroker.Table { return sqlxbroker.Table{Name: n} }},
	{"lease", func(n string, l time.Duration) sqlxbroker.Table {
		return sqlxbroker.Table{Name: n, LockedUntil: "locked_until", Lease: l}
	}},
	{"advisory", func(n string, _ time.Duration) sqlxbroker.Table {
		return sqlxbroker.Table{Name: n, AdvisoryLock: "acct-{account}"}
	}},
}

// createTable creates tbl with an account column (and grp for FIFO) and
// drops it when the test ends.
func createTable(t *testing.T, b *sqlxbroker.Broker, tbl sqlxbroker.Table) {
	t.Helper()
	payload := [][2]string{{"account", "bigint"}}
	if err := b.CreateTable(context.Background(), tbl, payload...); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := b.DB().Exec("DROP TABLE IF EXISTS " + postgres.Dialect{}.QuoteIdent(tbl.Name)); err != nil {
			t.Errorf("drop %s: %v", tbl.Name, err)
		}
	})
}

func publish(t *testing.T, b *sqlxbroker.Broker, tbl sqlxbroker.Table, msgs []any) {
	t.Helper()
	if err := b.Publish(context.Background(), b.DB(), tbl, msgs...); err != nil {
		t.Fatal(err)
	}
}

func accounts(from, n int) []any {
	msgs := make([]any, n)
	for i := range msgs {
		msgs[i] = map[string]any{"account": int64(from + i)}
	}
	return msgs
}

func count(t *testing.T, db *sqlx.DB, table string) int {
	t.Helper()
	var n int
	if err := db.Get(&n, "SELECT count(*) FROM "+postgres.Dialect{}.QuoteIdent(table)); err != nil {
		t.Fatal(err)
	}
	return n
}

// waitFor polls cond until it holds or d passes.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	conformance.WaitFor(t, d, what, cond)
}

// startForm returns a started, hand-driven claim form.
func startForm(t *testing.T, b *sqlxbroker.Broker, tbl sqlxbroker.Table) core.ClaimForm {
	t.Helper()
	return conformance.StartForm(t, b, tbl)
}

func completeAll(t *testing.T, cs []core.Claim) {
	t.Helper()
	for _, c := range cs {
		if err := conformance.Complete(context.Background(), c, sqlxbroker.Outcome{Kind: sqlxbroker.Succeeded}); err != nil {
			t.Errorf("complete %v: %v", sqlxbroker.NewDelivery(c).ID(), err)
		}
	}
}

func stopAll(t *testing.T, subs []*sqlxbroker.Subscription) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, s := range subs {
		if err := s.Stop(ctx); err != nil {
			t.Errorf("stop: %v", err)
		}
	}
}

func idOf(d *sqlxbroker.Delivery) int64 {
	switch v := d.ID().(type) {
	case int64:
		return v
	default:
		panic(fmt.Sprintf("id %T", v))
	}
}

// TestContention: 8 subscriptions over 2 pools complete 5,000 rows exactly
// once; in the advisory form no two deliveries of one key overlap.
func TestContention(t *testing.T) {
	const rows = 5000
	for _, fc := range formCases {
		t.Run(fc.name, func(t *testing.T) {
			b1, b2 := openBroker(t, openDB(t, "")), openBroker(t, openDB(t, ""))
			tbl := fc.table(uniq("sxb_cont_"), 0)
			createTable(t, b1, tbl)
			msgs := make([]any, rows)
			for i := range msgs {
				msgs[i] = map[string]any{"account": int64(i % 50)}
			}
			publish(t, b1, tbl, msgs)

			var mu sync.Mutex
			seen := map[int64]int{}
			keys := map[string]bool{}
			var dups, overlaps int
			h := func(ctx context.Context, d *sqlxbroker.Delivery) error {
				mu.Lock()
				if seen[idOf(d)]++; seen[idOf(d)] > 1 {
					dups++
				}
				if k := d.Key(); k != "" {
					if keys[k] {
						overlaps++
					}
					keys[k] = true
				}
				mu.Unlock()
				time.Sleep(100 * time.Microsecond) // a little work, so deliveries overlap
				mu.Lock()
				delete(keys, d.Key())
				mu.Unlock()
				return nil
			}
			var subs []*sqlxbroker.Subscription
			for i := range 8 {
				b := []*sqlxbroker.Broker{b1, b2}[i%2]
				s, err := b.Subscribe(context.Background(), tbl, h, sqlxbroker.SubscribeParams{Concurrency: 4, PollInterval: 50 * time.Millisecond})
				if err != nil {
					t.Fatal(err)
				}
				subs = append(subs, s)
			}
			start := time.Now()
			waitFor(t, 90*time.Second, "5000 deliveries", func() bool { mu.Lock(); defer mu.Unlock(); return len(seen) == rows })
			stopAll(t, subs)
			t.Logf("%s: %d rows in %v", fc.name, rows, time.Since(start).Round(time.Millisecond))
			var succeeded int64
			for _, s := range subs {
				succeeded += s.Stats().Succeeded
			}
			if len(seen) != rows || dups != 0 || overlaps != 0 || succeeded != rows {
				t.Fatalf("seen %d rows, %d duplicates, %d key overlaps, %d succeeded; want %d, 0, 0, %d", len(seen), dups, overlaps, succeeded, rows, rows)
			}
			if n := count(t, b1.DB(), tbl.Name); n != 0 {
				t.Fatalf("%d rows left in the table", n)
			}
		})
	}
}

// TestSkipNotWait: while another session holds a row, a claim returns the
// others at once.
func TestSkipNotWait(t *testing.T) {
	const rows = 5
	for _, fc := range formCases {
		t.Run(fc.name, func(t *testing.T) {
			ctx := context.Background()
			db1, db2 := openDB(t, ""), openDB(t, "")
			b1 := openBroker(t, db1)
			tbl := fc.table(uniq("sxb_skip_"), 0)
			createTable(t, b1, tbl)
			publish(t, b1, tbl, accounts(1, rows))
			q := postgres.Dialect{}.QuoteIdent(tbl.Name)
			var first int64
			if err := db1.Get(&first, "SELECT min(id) FROM "+q); err != nil {
				t.Fatal(err)
			}
			held := map[int64]bool{first: true}

			// The holder, for 5 s at most: in the advisory form a session that
			// holds the first row's key; otherwise a transaction that locks the
			// first row (and in the lease form a live lease on the second).
			hctx, hcancel := context.WithTimeout(ctx, 5*time.Second)
			defer hcancel()
			if fc.name == "advisory" {
				conn, err := db2.Connx(hctx)
				if err != nil {
					t.Fatal(err)
				}
				defer conn.Close()
				var acct int64
				if err := db1.Get(&acct, "SELECT account FROM "+q+" WHERE id = $1", first); err != nil {
					t.Fatal(err)
				}
				key := fmt.Sprintf("acct-%d", acct)
				ap := &core.AdvisoryParams{Conn: conn, Keys: []string{key}}
				if ok, err := (postgres.Dialect{}).TryAdvisoryLocks(hctx, ap); err != nil || !ok[0] {
					t.Fatalf("hold key %s: %v %v", key, ok, err)
				}
				defer postgres.Dialect{}.AdvisoryUnlocks(ctx, ap)
			} else {
				tx, err := db2.BeginTxx(hctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				defer tx.Rollback()
				if _, err := tx.Exec("SELECT id FROM "+q+" WHERE id = $1 FOR UPDATE", first); err != nil {
					t.Fatal(err)
				}
			}
			if fc.name == "lease" {
				// A live lease: within one lease (30 s) of now. (One more
				// than two leases ahead would be dangling, and claimed.)
				future := time.Now().Add(20 * time.Second).UTC()
				if _, err := db1.Exec("UPDATE "+q+" SET locked_until = $1 WHERE id = $2", future, first+1); err != nil {
					t.Fatal(err)
				}
				held[first+1] = true
			}

			f := startForm(t, b1, tbl)
			warm(t, db1, rows+2) // measure claims, not connection set-up
			begin := time.Now()
			cs, err := f.Claim(ctx, rows)
			took := time.Since(begin)
			if err != nil {
				t.Fatal(err)
			}
			defer completeAll(t, cs)
			if took > 200*time.Millisecond {
				t.Errorf("claim took %v, want < 200ms", took)
			}
			if len(cs) != rows-len(held) {
				t.Errorf("claimed %d rows, want %d", len(cs), rows-len(held))
			}
			for _, c := range cs {
				if held[idOf(sqlxbroker.NewDelivery(c))] {
					t.Errorf("claimed held row %d", idOf(sqlxbroker.NewDelivery(c)))
				}
			}
			t.Logf("%s: claimed %d of %d rows in %v with %d held", fc.name, len(cs), rows, took, len(held))
		})
	}
}

// warm opens n connections of db, so claims find them in the pool.
func warm(t *testing.T, db *sqlx.DB, n int) {
	t.Helper()
	var conns []*sqlx.Conn
	for range n {
		c, err := db.Connx(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	for _, c := range conns {
		c.Close()
	}
}

// killSessions terminates every session of application_name app and waits
// until they are gone.
func killSessions(t *testing.T, db *sqlx.DB, app string) {
	t.Helper()
	var killed []struct {
		PID    int64 `db:"pid"`
		Killed bool  `db:"killed"`
	}
	if err := db.Select(&killed, "SELECT pid, pg_terminate_backend(pid) AS killed FROM pg_stat_activity WHERE application_name = $1", app); err != nil {
		t.Fatal(err)
	}
	pids := make([]string, len(killed))
	for i, k := range killed {
		pids[i] = fmt.Sprint(k.PID)
	}
	if len(pids) == 0 {
		t.Fatalf("no session of %s to kill", app)
	}
	// Wait for the killed sessions, not for the name: a listener may
	// already have reconnected under the same application_name.
	waitFor(t, 5*time.Second, "killed sessions to end", func() bool {
		var n int
		_ = db.Get(&n, "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1::int[])", "{"+strings.Join(pids, ",")+"}")
		return n == 0
	})
}

// TestFIFO: two brokers on one FIFO table keep each group in order, one row
// of a group in work at a time.
func TestFIFO(t *testing.T) {
	const groups, perGroup = 3, 30
	for _, fc := range formCases {
		t.Run(fc.name, func(t *testing.T) {
			b1, b2 := openBroker(t, openDB(t, "")), openBroker(t, openDB(t, ""))
			tbl := fc.table(uniq("sxb_fifo_"), 0)
			tbl.Group = "grp"
			createTable(t, b1, tbl)
			var msgs []any
			for i := range groups * perGroup {
				msgs = append(msgs, map[string]any{"account": int64(i), "grp": fmt.Sprintf("g%d", i%groups)})
			}
			publish(t, b1, tbl, msgs)

			var mu sync.Mutex
			order := map[string][]int64{}
			inWork := map[string]int{}
			var total, overlaps int
			h := func(ctx context.Context, d *sqlxbroker.Delivery) error {
				v, _ := d.Value("grp")
				g := fmt.Sprint(v)
				if b, ok := v.([]byte); ok {
					g = string(b)
				}
				mu.Lock()
				if inWork[g]++; inWork[g] > 1 {
					overlaps++
				}
				order[g] = append(order[g], idOf(d))
				mu.Unlock()
				time.Sleep(time.Millisecond) // a little work, so a second claim could overlap
				mu.Lock()
				inWork[g]--
				total++
				mu.Unlock()
				return nil
			}
			var subs []*sqlxbroker.Subscription
			for _, b := range []*sqlxbroker.Broker{b1, b2, b1, b2} {
				s, err := b.Subscribe(context.Background(), tbl, h, sqlxbroker.SubscribeParams{Concurrency: 3, PollInterval: 20 * time.Millisecond})
				if err != nil {
					t.Fatal(err)
				}
				subs = append(subs, s)
			}
			waitFor(t, 60*time.Second, "every FIFO row", func() bool { mu.Lock(); defer mu.Unlock(); return total == groups*perGroup })
			stopAll(t, subs)
			if overlaps != 0 {
				t.Errorf("%d times two rows of a group were in work at once", overlaps)
			}
			for g, ids := range order {
				if len(ids) != perGroup {
					t.Errorf("group %s: %d deliveries, want %d", g, len(ids), perGroup)
				}
				for i := 1; i < len(ids); i++ {
					if ids[i] <= ids[i-1] {
						t.Errorf("group %s out of order: %v", g, ids)
						break
					}
				}
			}
		})
	}
}

// TestAdvisoryKeysAcrossTables: equal keys of two tables exclude each other;
// other keys do not wait.
func TestAdvisoryKeysAcrossTables(t *testing.T) {
	ctx := context.Background()
	b1, b2 := openBroker(t, openDB(t, "")), openBroker(t, openDB(t, ""))
	ta := sqlxbroker.Table{Name: uniq("sxb_keya_"), AdvisoryLock: "acct-{account}"}
	tb := sqlxbroker.Table{Name: uniq("sxb_keyb_"), AdvisoryLock: "acct-{account}"}
	createTable(t, b1, ta)
	createTable(t, b1, tb)
	publish(t, b1, ta, accounts(7, 1))
	publish(t, b1, tb, accounts(7, 2)) // accounts 7 and 8

	fa, fb := startForm(t, b1, ta), startForm(t, b2, tb)
	ca, err := fa.Claim(ctx, 1)
	if err != nil || len(ca) != 1 || sqlxbroker.NewDelivery(ca[0]).Key() != "acct-7" {
		t.Fatalf("claim table A: %d claims, %v", len(ca), err)
	}
	cb, err := fb.Claim(ctx, 10)
	if err != nil || len(cb) != 1 || sqlxbroker.NewDelivery(cb[0]).Key() != "acct-8" {
		t.Fatalf("claim table B while A holds acct-7: %d claims, %v; want only acct-8", len(cb), err)
	}
	completeAll(t, ca)
	// A keeps acct-7 a moment for a claim of its own (a parked key), then
	// releases it.
	var cb2 []core.Claim
	conformance.WaitFor(t, 10*time.Second, "table B to claim acct-7 once A released it", func() bool {
		cs, err := fb.Claim(ctx, 10)
		if err != nil || len(cs) > 1 || len(cs) == 1 && sqlxbroker.NewDelivery(cs[0]).Key() != "acct-7" {
			t.Fatalf("claim table B after A finished acct-7: %d claims, %v", len(cs), err)
		}
		cb2 = append(cb2, cs...)
		return len(cb2) == 1
	})
	completeAll(t, append(cb, cb2...))
}

// TestVersionGate decides forms by server_version_num.
func TestVersionGate(t *testing.T) {
	for _, c := range []struct {
		num    int
		found  string
		tooOld []sqlxbroker.Form
	}{
		{90400, "9.4.0", []sqlxbroker.Form{sqlxbroker.RowLock, sqlxbroker.Lease, sqlxbroker.Advisory}},
		{90600, "9.6.0", []sqlxbroker.Form{sqlxbroker.Advisory}},
		{100023, "10.23", []sqlxbroker.Form{sqlxbroker.Advisory}},
		{110000, "11.0", nil},
		{150020, "15.20", nil},
	} {
		if got := postgres.VersionString(c.num); got != c.found {
			t.Errorf("VersionString(%d) = %q, want %q", c.num, got, c.found)
		}
		for _, f := range core.Forms {
			err := postgres.CheckVersion(c.num, f)
			want := false
			for _, o := range c.tooOld {
				want = want || o == f
			}
			var ve *sqlxbroker.VersionError
			switch {
			case !want && err != nil:
				t.Errorf("%d %s: %v, want nil", c.num, f, err)
			case want && (!errors.Is(err, sqlxbroker.ErrServerTooOld) || !errors.As(err, &ve)):
				t.Errorf("%d %s: %v, want a *sqlxbroker.VersionError", c.num, f, err)
			case want && (ve.Found != c.found || ve.Form != f || (c.num >= 90500) != (ve.Need == "11")):
				t.Errorf("%d %s: %+v", c.num, f, ve)
			}
		}
	}
	if db := os.Getenv("SQLXBROKER_POSTGRES_DSN"); db != "" {
		for _, f := range core.Forms {
			if _, err := (postgres.Dialect{}).Start(context.Background(), core.NewPool(openDB(t, ""), postgres.Dialect{}), &core.Plan{Form: f, Table: "sxb_gate", QTable: `"sxb_gate"`}); err != nil {
				t.Errorf("live server, %s: %v", f, err)
			}
		}
	}
}

// TestWake: a publish from another pool wakes an idle subscription that
// would otherwise poll every 30 s.
func TestWake(t *testing.T) {
	b1, b2 := openBroker(t, openDB(t, "")), openBroker(t, openDB(t, ""))
	tbl := sqlxbroker.Table{Name: uniq("sxb_wake_")}
	createTable(t, b1, tbl)
	got := make(chan time.Time, 10)
	s, err := b1.Subscribe(context.Background(), tbl, func(ctx context.Context, d *sqlxbroker.Delivery) error {
		got <- time.Now()
		return nil
	}, sqlxbroker.SubscribeParams{PollInterval: 30 * time.Second, MinPollInterval: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer stopAll(t, []*sqlxbroker.Subscription{s})
	// The first row may be taken by the subscription's first claim; each
	// later one only by a wake-up, the next poll being 30 s away.
	for i := range 4 {
		sent := time.Now()
		publish(t, b2, tbl, accounts(i, 1))
		select {
		case at := <-got:
			if d := at.Sub(sent); i > 0 && d >= time.Second {
				t.Errorf("publish %d woke the subscription after %v, want < 1s", i, d)
			} else {
				t.Logf("publish %d handled after %v", i, d.Round(time.Millisecond))
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("publish %d: no delivery within 5s", i)
		}
	}
}

// TestListen: the channel closes with its context; a driver other than
// lib/pq is refused at once.
func TestListen(t *testing.T) {
	d := postgres.Dialect{}
	lite := sqlx.MustOpen("sqlite", ":memory:")
	defer lite.Close()
	p, err := sqlxbroker.NewPlan(d, sqlxbroker.Table{Name: "jobs"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Listen(context.Background(), core.NewPool(lite, d), p); err == nil {
		t.Error("Listen on a sqlite pool: nil error")
	}
	if n := postgres.ChannelOf(&core.Plan{Table: strings.Repeat("s", 63) + "." + strings.Repeat("t", 63)}); len(n) > 63 {
		t.Errorf("channel %q is longer than 63 bytes", n)
	}
	if a, b := postgres.IndexName(strings.Repeat("t", 63), "claim"), postgres.IndexName(strings.Repeat("t", 63), "fifo"); len(a) > 63 || a == b {
		t.Errorf("index names %q, %q", a, b)
	}

	app := uniq("sxblisten_")
	db, other := openDB(t, app), openDB(t, "")
	pool := core.NewPool(db, d)
	defer pool.Close()
	ctx, cancel := context.WithCancel(context.Background())
	ch, err := d.Listen(ctx, pool, p)
	if err != nil {
		t.Fatal(err)
	}
	notify := func() {
		q, args := d.WakeStatement(p)
		if _, err := other.Exec(q, args...); err != nil {
			t.Fatal(err)
		}
	}
	received := func() bool { return polled(ch) }
	received() // the start pokes every receiver
	notify()
	waitFor(t, time.Second, "a notification", received)

	// A killed listening session is replaced, and wakes its receivers.
	killSessions(t, other, app)
	waitFor(t, 2*time.Second, "the wake-up after a reconnect", received)
	notify()
	waitFor(t, time.Second, "a notification after the reconnect", received)

	cancel()
	waitFor(t, time.Second, "the channel to close", func() bool { return closed(ch) })
	// The last receiver gone, the listening connection leaves the pool.
	waitFor(t, 2*time.Second, "the listening connection to close", func() bool { return db.Stats().InUse == 0 })
}

// TestDDL: the recommended table, without a database.
// TestArrayLiteral: the server reads arrayLiteral's text back as the values
// it was given: integer ids (the fenced completion's), with their sign and
// at their limits, and text that needs escaping, mixed in one array.
func TestArrayLiteral(t *testing.T) {
	db := openDB(t, "")
	ids := []any{int64(1), int64(-7), int64(0), int64(math.MaxInt64), int64(math.MinInt64), int64(1234567890123)}
	var got pq.Int64Array
	if err := db.QueryRow("SELECT $1::bigint[]", postgres.ArrayLiteral(ids)).Scan(&got); err != nil {
		t.Fatal(err)
	}
	if len(got) != len(ids) {
		t.Fatalf("%d ids back, want %d: %v", len(got), len(ids), got)
	}
	for i, id := range ids {
		if got[i] != id.(int64) {
			t.Errorf("id %d: %d back, want %d", i, got[i], id)
		}
	}
	mixed := []any{int64(42), `a"b\c`, []byte("x,y"), "{}"}
	var texts pq.StringArray
	if err := db.QueryRow("SELECT $1::text[]", postgres.ArrayLiteral(mixed)).Scan(&texts); err != nil {
		t.Fatal(err)
	}
	want := []string{"42", `a"b\c`, "x,y", "{}"}
	if strings.Join(texts, "|") != strings.Join(want, "|") {
		t.Errorf("texts back %q, want %q", texts, want)
	}
}

func TestDDL(t *testing.T) {
	b := sqlxbroker.OpenDialect(nil, postgres.Dialect{})
	tbl := sqlxbroker.Table{Name: "app.jobs", LockedUntil: "locked_until", Group: "account", DoneAt: "done_at", DeadAt: "dead_at", MaxAttempts: 3, Order: "seq"}
	stmts, err := b.TableDDL(tbl, [2]string{"body", "bytes"}, [2]string{"account", "bigint"})
	if err != nil {
		t.Fatal(err)
	}
	ddl := strings.Join(stmts, ";\n")
	t.Log(ddl)
	for _, want := range []string{
		`CREATE TABLE IF NOT EXISTS "app"."jobs"`, `"id" bigserial PRIMARY KEY`, `"attempt" integer NOT NULL DEFAULT 1`,
		`"locked_until" timestamptz DEFAULT '1970-01-01 00:00:00+00'`, `"seq" bigint NOT NULL`, `"account" bigint`, `"body" bytea`,
		`ON "app"."jobs" ("seq") WHERE "dead_at" IS NULL AND "done_at" IS NULL`,
		`ON "app"."jobs" ("account", "seq") WHERE "dead_at" IS NULL AND "done_at" IS NULL`,
	} {
		if !strings.Contains(ddl, want) {
			t.Errorf("DDL lacks %s", want)
		}
	}
	if _, err := b.TableDDL(tbl, [2]string{"body", "json"}); err == nil {
		t.Error("unknown payload type: nil error")
	}
	if _, err := b.TableDDL(tbl, [2]string{"locked_until", "text"}); err == nil {
		t.Error("payload retyping the lease column: nil error")
	}
	if stmts, _ := b.TableDDL(sqlxbroker.Table{Name: "plain"}); len(stmts) != 1 {
		t.Errorf("a plain table needs no index beyond its primary key: %v", stmts)
	}
}

// TestListenPush: with a DSN to listen with, a notification wakes the
// receiver as the server sends it; a killed listening session is
// reconnected and wakes its receivers; the channel closes with its context,
// and the last receiver gone, the listening session ends.
func TestListenPush(t *testing.T) {
	app := uniq("sxbpush_")
	listen := dsn(t)
	if strings.Contains(listen, "?") {
		listen += "&application_name=" + app
	} else if strings.Contains(listen, "://") {
		listen += "?application_name=" + app
	} else {
		listen += " application_name=" + app
	}
	d := postgres.Dialect{ListenDSN: listen}
	p, err := sqlxbroker.NewPlan(d, sqlxbroker.Table{Name: uniq("sxb_push_")})
	if err != nil {
		t.Fatal(err)
	}
	db, other := openDB(t, ""), openDB(t, "")
	pool := core.NewPool(db, d)
	defer pool.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := d.Listen(ctx, pool, p)
	if err != nil {
		t.Fatal(err)
	}
	received := func() bool { return polled(ch) }
	sessions := func() int {
		var n int
		if err := other.Get(&n, "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", app); err != nil {
			t.Fatal(err)
		}
		return n
	}
	listening := func() bool {
		var n int
		if err := other.Get(&n, "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND query LIKE 'LISTEN%'", app); err != nil {
			t.Fatal(err)
		}
		return n > 0
	}
	waitFor(t, 5*time.Second, "the listener to connect and LISTEN", listening)
	for received() {
	}
	notify := func() time.Time {
		q, args := d.WakeStatement(p)
		sent := time.Now()
		if _, err := other.Exec(q, args...); err != nil {
			t.Fatal(err)
		}
		return sent
	}
	sent := notify()
	waitFor(t, time.Second, "a notification", received)
	t.Logf("notification received %v after the commit", time.Since(sent).Round(time.Microsecond))
	if db.Stats().OpenConnections != 1 { // openDB's ping
		t.Errorf("the pool opened %d connections; the listener must use its own", db.Stats().OpenConnections)
	}

	killSessions(t, other, app)
	waitFor(t, 5*time.Second, "the wake-up after the listener reconnects", received)
	waitFor(t, 5*time.Second, "the listener to LISTEN again", listening)
	for received() {
	}
	notify()
	waitFor(t, time.Second, "a notification after the reconnect", received)

	cancel()
	waitFor(t, time.Second, "the channel to close", func() bool { return closed(ch) })
	waitFor(t, 5*time.Second, "the listening session to end", func() bool { return sessions() == 0 })
}

// TestListenPushChurn: subscriptions of one table that stop and start in
// quick succession leave the table listened to, whatever order the LISTEN
// and UNLISTEN of each change reach the server in.
func TestListenPushChurn(t *testing.T) {
	d := postgres.Dialect{ListenDSN: dsn(t)}
	p, err := sqlxbroker.NewPlan(d, sqlxbroker.Table{Name: uniq("sxb_churn_")})
	if err != nil {
		t.Fatal(err)
	}
	db, other := openDB(t, ""), openDB(t, "")
	pool := core.NewPool(db, d)
	defer pool.Close()
	keep, stopKeep := context.WithCancel(context.Background())
	defer stopKeep()
	// Another table keeps the listener alive through the churn.
	q, err := sqlxbroker.NewPlan(d, sqlxbroker.Table{Name: uniq("sxb_churn_")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Listen(keep, pool, q); err != nil {
		t.Fatal(err)
	}
	var ch <-chan struct{}
	for i := 0; i < 50; i++ {
		ctx, cancel := context.WithCancel(context.Background())
		if ch, err = d.Listen(ctx, pool, p); err != nil {
			t.Fatal(err)
		}
		if i < 49 {
			cancel()
		} else {
			defer cancel()
		}
	}
	wake, args := d.WakeStatement(p)
	waitFor(t, 5*time.Second, "a notification to the table that stopped and started 50 times", func() bool {
		if _, err := other.Exec(wake, args...); err != nil {
			t.Fatal(err)
		}
		select {
		case <-ch:
			return true
		case <-time.After(50 * time.Millisecond):
			return false
		}
	})
}

// polled reports whether a wake-up waits on ch, taking it.
func polled(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// closed reports whether ch is closed (a wake-up waiting on it is taken).
func closed(ch <-chan struct{}) bool {
	select {
	case _, ok := <-ch:
		return !ok
	default:
		return false
	}
}
