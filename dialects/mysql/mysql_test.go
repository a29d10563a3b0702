package mysql_test

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/conformance"
	"github.com/sqlxbroker/sqlxbroker/core"
	"github.com/sqlxbroker/sqlxbroker/dialects/mysql"
)

func TestCheckVersion(t *testing.T) {
	for _, c := range []struct {
		version, server, found, need string // need "": new enough
	}{
		{"5.7.44", "MySQL", "5.7.44", "8.0.1"},
		{"8.0.0", "MySQL", "8.0.0", "8.0.1"},
		{"8.0.1", "", "", ""},
		{"8.4.3", "", "", ""},
		{"10.5.27-MariaDB", "MariaDB", "10.5.27", "10.6.0"},
		{"10.6.0-MariaDB-1:10.6.0+maria~focal", "", "", ""},
		{"10.11.19-MariaDB-0+deb12u1", "", "", ""},
		{"11.4.2-MariaDB", "", "", ""},
		{"5.5.5-10.5.27-MariaDB", "MariaDB", "10.5.27", "10.6.0"},
	} {
		err := mysql.CheckVersion(c.version, sqlxbroker.Lease)
		if c.need == "" {
			if err != nil {
				t.Errorf("%s: %v, want nil", c.version, err)
			}
			continue
		}
		var ve *sqlxbroker.VersionError
		if !errors.Is(err, sqlxbroker.ErrServerTooOld) || !errors.As(err, &ve) {
			t.Errorf("%s: %v, want a *sqlxbroker.VersionError", c.version, err)
			continue
		}
		if ve.Server != c.server || ve.Found != c.found || ve.Need != c.need || ve.Form != sqlxbroker.Lease {
			t.Errorf("%s: %+v, want %s %s < %s", c.version, ve, c.server, c.found, c.need)
		}
		if !strings.Contains(err.Error(), c.found) || !strings.Contains(err.Error(), c.need) {
			t.Errorf("%s: message %q names neither found nor needed version", c.version, err)
		}
	}
	if err := mysql.CheckVersion("banana", sqlxbroker.RowLock); err == nil || errors.Is(err, sqlxbroker.ErrServerTooOld) {
		t.Errorf("unreadable version: %v, want a plain error", err)
	}
}

// TestContention: 8 subscriptions over 2 brokers complete 5,000 rows, each
// exactly once.
func TestContention(t *testing.T) {
	dsn := testDSN(t)
	const rows = 5000
	for _, fc := range forms() {
		t.Run(fc.name, func(t *testing.T) {
			// Broker 2 interpolates (text protocol, ids read as []byte) and parses times.
			db1, db2 := openDB(t, dsn), openDB(t, withParams(dsn, "interpolateParams=true&parseTime=true"))
			b1 := openBroker(t, db1)
			b2 := openBroker(t, db2)
			if fc.name == "Lease" && isMariaDB(t, db2) {
				b2 = sqlxbroker.OpenDialect(db2, mysql.Dialect{MariaDB: true}) // DELETE .. RETURNING batches
			}
			tbl := newTable(t, b1, fc.table, payload...)
			msgs := make([]msg, rows)
			for i := range msgs {
				msgs[i] = msg{N: int64(i), Acct: fmt.Sprint(i % 97)}
			}
			publish(t, b1, tbl, msgs...)

			var seen [rows]atomic.Int32
			var done, failed atomic.Int64
			h := func(ctx context.Context, d *sqlxbroker.Delivery) error {
				seen[nOf(t, d)].Add(1)
				return nil
			}
			p := sqlxbroker.SubscribeParams{Concurrency: 4, PollInterval: 50 * time.Millisecond,
				OnOutcome: func(d *sqlxbroker.Delivery, o sqlxbroker.Outcome, err error) {
					if err == nil && o.Kind == sqlxbroker.Succeeded {
						done.Add(1)
					} else {
						failed.Add(1)
						t.Errorf("row %v: outcome %v, err %v", d.ID(), o.Kind, err)
					}
				}}
			start := time.Now()
			var subs []*sqlxbroker.Subscription
			for i := range 8 {
				subs = append(subs, subscribe(t, []*sqlxbroker.Broker{b1, b2}[i%2], tbl, h, p))
			}
			waitFor(t, 3*time.Minute, "every row completed", func() bool { return done.Load()+failed.Load() >= rows })
			elapsed := time.Since(start)
			var st sqlxbroker.Stats
			for _, s := range subs {
				stop(t, s)
				x := s.Stats()
				st.Claimed += x.Claimed
				st.ClaimErrors += x.ClaimErrors
				st.CompleteErrors += x.CompleteErrors
				st.LeaseLost += x.LeaseLost
			}
			for i := range seen {
				if n := seen[i].Load(); n != 1 {
					t.Errorf("row n=%d delivered %d times", i, n)
				}
			}
			if st.Claimed != rows || st.ClaimErrors+st.CompleteErrors+st.LeaseLost != 0 {
				t.Errorf("stats %+v, want %d claims and no errors", st, rows)
			}
			if n := count(t, db1, tbl, "1=1"); n != 0 {
				t.Errorf("%d rows left in the table", n)
			}
			t.Logf("%s: %d rows, 8 subscriptions on 2 brokers, in %v", fc.name, rows, elapsed.Round(time.Millisecond))
		})
	}
}

// TestSkipNotWait: rows held elsewhere are skipped, not waited for.
func TestSkipNotWait(t *testing.T) {
	dsn := testDSN(t)
	for _, fc := range forms() {
		t.Run(fc.name, func(t *testing.T) {
			db, other := openDB(t, dsn), openDB(t, dsn)
			b := openBroker(t, db)
			tbl := newTable(t, b, fc.table, payload...)
			for i := int64(1); i <= 5; i++ {
				publish(t, b, tbl, msg{N: i, Acct: fmt.Sprint("a", i)})
			}
			ids := map[int]int64{}
			rows, err := db.Query("SELECT n, id FROM `" + tbl.Name + "`")
			if err != nil {
				t.Fatal(err)
			}
			for rows.Next() {
				var n int
				var id int64
				if err := rows.Scan(&n, &id); err != nil {
					t.Fatal(err)
				}
				ids[n] = id
			}
			rows.Close()
			// Holds last 5 s unless the test ends first.
			hold, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			lockRow := func(n int) {
				tx, err := other.BeginTxx(hold, nil)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { tx.Rollback() })
				// By primary key: a scan of n would lock every row it reads.
				if _, err := tx.Exec("SELECT id FROM `"+tbl.Name+"` WHERE id = ? FOR UPDATE", ids[n]); err != nil {
					t.Fatal(err)
				}
			}
			want := map[int64]bool{2: true, 3: true, 4: true, 5: true}
			switch fc.name {
			case "RowLock":
				lockRow(1)
			case "Lease":
				if _, err := db.Exec("UPDATE `"+tbl.Name+"` SET locked_until = ? WHERE n = 1", dialect.EncodeTime(time.Now().Add(5*time.Second))); err != nil {
					t.Fatal(err)
				}
				lockRow(2)
				delete(want, 2)
			case "Advisory":
				conn, err := other.Connx(hold)
				if err != nil {
					t.Fatal(err)
				}
				defer conn.Close()
				pool := core.NewPool(other, dialect)
				defer pool.Close()
				if ok, err := dialect.TryAdvisoryLocks(hold, &core.AdvisoryParams{Pool: pool, Conn: conn, Keys: []string{"acct-a1"}}); err != nil || !ok[0] {
					t.Fatalf("hold key: %v %v", ok, err)
				}
			}
			f := startForm(t, b, tbl)
			start := time.Now()
			claims, err := f.Claim(context.Background(), 10)
			elapsed := time.Since(start)
			if err != nil {
				t.Fatal(err)
			}
			got := map[int64]bool{}
			for _, c := range claims {
				got[nOf(t, sqlxbroker.NewDelivery(c))] = true
				if err := conformance.Complete(context.Background(), c, sqlxbroker.Outcome{Kind: sqlxbroker.Released}); err != nil {
					t.Error(err)
				}
			}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("claimed %v, want %v", got, want)
			}
			if elapsed > 200*time.Millisecond {
				t.Errorf("claim took %v with a row held: it waited", elapsed)
			}
			t.Logf("%s: claimed %d rows in %v while others were held", fc.name, len(claims), elapsed.Round(time.Microsecond))
		})
	}
}

// TestFIFOTwoBrokers: two brokers on one table keep each group's order and
// run one row of a group at a time, also across retries.
func TestFIFOTwoBrokers(t *testing.T) {
	dsn := testDSN(t)
	for _, fc := range forms() {
		t.Run(fc.name, func(t *testing.T) {
			db1, db2 := openDB(t, dsn), openDB(t, dsn)
			b1, b2 := openBroker(t, db1), openBroker(t, db2)
			tbl := fc.table
			tbl.Group = "grp"
			if tbl.AdvisoryLock != "" {
				tbl.AdvisoryLock = "row-{n}" // keys never collide: only the group orders rows
			}
			tbl = newTable(t, b1, tbl, payload...)
			fifoTwoBrokers(t, b1, b2, tbl)
		})
	}
}

// fifoTwoBrokers runs four subscriptions, two on each broker, over 3
// FIFO groups of 30 rows each (every tenth row fails its first attempt)
// and checks that no group has two rows in work at once and that each
// runs in order, every row completed once and retried ones twice.
func fifoTwoBrokers(t *testing.T, b1, b2 *sqlxbroker.Broker, tbl sqlxbroker.Table) {
	const groups, per = 3, 30
	var msgs []msg
	for i := range groups * per {
		msgs = append(msgs, msg{N: int64(i), Grp: fmt.Sprint("g", i%groups)})
	}
	publish(t, b1, tbl, msgs...)

	var mu sync.Mutex
	starts := map[string][]int64{}
	inWork := map[string]int{}
	var done atomic.Int64
	h := func(ctx context.Context, d *sqlxbroker.Delivery) error {
		var m msg
		if err := d.Scan(&m); err != nil {
			return err
		}
		mu.Lock()
		inWork[m.Grp]++
		if inWork[m.Grp] > 1 {
			t.Errorf("group %s: row %d runs while another row of the group is in work", m.Grp, m.N)
		}
		starts[m.Grp] = append(starts[m.Grp], m.N)
		mu.Unlock()
		time.Sleep(time.Millisecond) // the handler's work
		mu.Lock()
		inWork[m.Grp]--
		mu.Unlock()
		if m.N%10 == 0 && d.Attempt() == 1 {
			return errors.New("first attempt fails")
		}
		return nil
	}
	p := sqlxbroker.SubscribeParams{Concurrency: 4, PollInterval: 20 * time.Millisecond,
		OnOutcome: func(d *sqlxbroker.Delivery, o sqlxbroker.Outcome, err error) {
			if err != nil {
				t.Errorf("completion: %v", err)
			}
			if o.Kind == sqlxbroker.Succeeded {
				done.Add(1)
			}
		}}
	for i := range 4 {
		subscribe(t, []*sqlxbroker.Broker{b1, b2}[i%2], tbl, h, p)
	}
	waitFor(t, 90*time.Second, "every row completed", func() bool { return done.Load() == groups*per })
	mu.Lock()
	defer mu.Unlock()
	for g, ns := range starts {
		for i := 1; i < len(ns); i++ {
			if ns[i] < ns[i-1] {
				t.Errorf("group %s ran out of order: %v", g, ns)
				break
			}
		}
		if len(ns) != per+per/10 {
			t.Errorf("group %s: %d deliveries, want %d", g, len(ns), per+per/10)
		}
	}
}

// TestGroupGuard: a guarded group is refused to a second transaction
// without waiting, and that transaction goes on working.
func TestGroupGuard(t *testing.T) {
	dsn := testDSN(t)
	db1, db2 := openDB(t, dsn), openDB(t, dsn)
	b := openBroker(t, db1)
	tbl := newTable(t, b, sqlxbroker.Table{Group: "grp"}, payload...)
	publish(t, b, tbl, msg{N: 1, Grp: "a"}, msg{N: 2, Grp: "a"}, msg{N: 3, Grp: "b"})
	p, err := b.Plan(tbl)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	rc := &sql.TxOptions{Isolation: sql.LevelReadCommitted}
	tx1, err := db1.BeginTxx(ctx, rc)
	if err != nil {
		t.Fatal(err)
	}
	defer tx1.Rollback()
	if ok, err := dialect.GuardGroup(ctx, tx1, &core.GroupGuardParams{Plan: p, Group: "a"}); !ok || err != nil {
		t.Fatalf("first guard of a: %v %v", ok, err)
	}
	tx2, err := db2.BeginTxx(ctx, rc)
	if err != nil {
		t.Fatal(err)
	}
	defer tx2.Rollback()
	start := time.Now()
	if ok, err := dialect.GuardGroup(ctx, tx2, &core.GroupGuardParams{Plan: p, Group: "a"}); ok || err != nil {
		t.Fatalf("second guard of a: %v %v, want false", ok, err)
	}
	if el := time.Since(start); el > 200*time.Millisecond {
		t.Errorf("refused guard took %v", el)
	}
	if ok, err := dialect.GuardGroup(ctx, tx2, &core.GroupGuardParams{Plan: p, Group: "b"}); !ok || err != nil {
		t.Fatalf("guard of b after a refusal: %v %v", ok, err)
	}
	if _, err := tx2.Exec("UPDATE `" + tbl.Name + "` SET attempt = 5 WHERE n = 3"); err != nil {
		t.Fatal(err)
	}
	if err := tx2.Commit(); err != nil {
		t.Fatalf("transaction unusable after a refused guard: %v", err)
	}
}

// TestAdvisoryKeyAcrossTables: equal keys of two tables exclude each other.
func TestAdvisoryKeyAcrossTables(t *testing.T) {
	dsn := testDSN(t)
	db := openDB(t, dsn)
	b := openBroker(t, db)
	desc := sqlxbroker.Table{AdvisoryLock: "acct-{acct}"}
	ta, tb := newTable(t, b, desc, payload...), newTable(t, b, desc, payload...)
	publish(t, b, ta, msg{N: 1, Acct: "x"})
	publish(t, b, tb, msg{N: 2, Acct: "x"}, msg{N: 3, Acct: "y"})
	fa, fb := startForm(t, b, ta), startForm(t, b, tb)
	ctx := context.Background()
	ca, err := fa.Claim(ctx, 5)
	if err != nil || len(ca) != 1 {
		t.Fatalf("claim a: %v %v", ca, err)
	}
	cb, err := fb.Claim(ctx, 5)
	if err != nil || len(cb) != 1 || nOf(t, sqlxbroker.NewDelivery(cb[0])) != 3 {
		t.Fatalf("claim b while acct-x is held by table a: %v %v, want only n=3", cb, err)
	}
	if err := conformance.Complete(ctx, ca[0], sqlxbroker.Outcome{Kind: sqlxbroker.Succeeded}); err != nil {
		t.Fatal(err)
	}
	c := claimWithin(t, fb, time.Second)
	if n := nOf(t, sqlxbroker.NewDelivery(c)); n != 2 {
		t.Errorf("after release claimed n=%d, want 2", n)
	}
	for _, c := range append(cb, c) {
		if err := conformance.Complete(ctx, c, sqlxbroker.Outcome{Kind: sqlxbroker.Succeeded}); err != nil {
			t.Error(err)
		}
	}
}

// TestAdvisoryLongKey: 100-character keys are hashed into lock names that
// still separate keys sharing a 64-character prefix.
func TestAdvisoryLongKey(t *testing.T) {
	dsn := testDSN(t)
	db1, db2 := openDB(t, dsn), openDB(t, dsn)
	b1, b2 := openBroker(t, db1), openBroker(t, db2)
	tbl := newTable(t, b1, sqlxbroker.Table{AdvisoryLock: "{k}"}, payload...)
	prefix := strings.Repeat("p", 64)
	k1, k2 := prefix+strings.Repeat("a", 36), prefix+strings.Repeat("b", 36)
	publish(t, b1, tbl, msg{N: 1, K: k1}, msg{N: 2, K: k1}, msg{N: 3, K: k2})
	f1, f2 := startForm(t, b1, tbl), startForm(t, b2, tbl)
	ctx := context.Background()
	c1, err := f1.Claim(ctx, 1)
	if err != nil || len(c1) != 1 || nOf(t, sqlxbroker.NewDelivery(c1[0])) != 1 {
		t.Fatalf("claim 1: %v %v", c1, err)
	}
	var database string
	if err := db1.Get(&database, "SELECT DATABASE()"); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte(database + ":" + k1))
	var holder sql.NullInt64
	if err := db2.Get(&holder, "SELECT IS_USED_LOCK(?)", hex.EncodeToString(sum[:])); err != nil || !holder.Valid {
		t.Fatalf("lock name of the 100-character key is not its SHA-256: %v %v", holder, err)
	}
	c2, err := f2.Claim(ctx, 3)
	if err != nil || len(c2) != 1 || nOf(t, sqlxbroker.NewDelivery(c2[0])) != 3 {
		t.Fatalf("second broker claimed %v (%v), want only n=3 (same key as n=1: n=2)", c2, err)
	}
	if err := conformance.Complete(ctx, c1[0], sqlxbroker.Outcome{Kind: sqlxbroker.Succeeded}); err != nil {
		t.Fatal(err)
	}
	c3 := claimWithin(t, f2, time.Second)
	if n := nOf(t, sqlxbroker.NewDelivery(c3)); n != 2 {
		t.Errorf("after release claimed n=%d, want 2", n)
	}
	for _, c := range []core.Claim{c2[0], c3} {
		if err := conformance.Complete(ctx, c, sqlxbroker.Outcome{Kind: sqlxbroker.Succeeded}); err != nil {
			t.Error(err)
		}
	}

	// At the limit the name is kept as is; one byte more and it is hashed.
	conn, err := db1.Connx(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if ok, err := dialect.TryAdvisoryLocks(ctx, &core.AdvisoryParams{Conn: conn}); err != nil || len(ok) != 0 {
		t.Errorf("no keys: %v %v, want none and no error", ok, err)
	}
	if err := dialect.AdvisoryUnlocks(ctx, &core.AdvisoryParams{Conn: conn}); err != nil {
		t.Errorf("no keys to release: %v", err)
	}
	exact := strings.Repeat("e", 64-len(database)-1)
	for _, c := range []struct{ key, name string }{
		{exact, database + ":" + exact},
		{exact + "f", hashOf(database + ":" + exact + "f")},
	} {
		ap := &core.AdvisoryParams{Conn: conn, Keys: []string{c.key}}
		if ok, err := dialect.TryAdvisoryLocks(ctx, ap); err != nil || !ok[0] {
			t.Fatalf("lock %q: %v %v", c.key, ok, err)
		}
		var used sql.NullInt64
		if err := db2.Get(&used, "SELECT IS_USED_LOCK(?)", c.name); err != nil || !used.Valid {
			t.Errorf("key of %d bytes: lock name %q not held (%v)", len(c.key), c.name, err)
		}
		if err := dialect.AdvisoryUnlocks(ctx, ap); err != nil {
			t.Error(err)
		}
	}
}

func hashOf(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// TestLeaseDSN: the lease form's tokens compare exactly whatever the DSN
// says about parseTime, loc and interpolation: a handler outlives its
// lease through renewals, a retry waits for its ready time, and no
// completion finds its lease lost.
func TestLeaseDSN(t *testing.T) {
	dsn := testDSN(t)
	for _, params := range []string{"", "parseTime=true&loc=Local", "parseTime=true&loc=Asia%2FTokyo", "interpolateParams=true&parseTime=true&loc=America%2FNew_York"} {
		t.Run(params, func(t *testing.T) {
			t.Parallel()
			db := openDB(t, withParams(dsn, params))
			b := openBroker(t, db)
			tbl := newTable(t, b, sqlxbroker.Table{LockedUntil: "locked_until", Lease: time.Second, ReadyAt: "ready_at"}, payload...)
			var msgs []msg
			for i := range 10 {
				msgs = append(msgs, msg{N: int64(i)})
			}
			publish(t, b, tbl, msgs...)
			var done atomic.Int64
			var retriedAt, redelivered atomic.Int64
			h := func(ctx context.Context, d *sqlxbroker.Delivery) error {
				switch n := nOf(t, d); {
				case n == 0: // outlives its 1s lease
					select {
					case <-time.After(1600 * time.Millisecond):
					case <-ctx.Done():
						return ctx.Err()
					}
				case n == 1 && d.Attempt() == 1:
					retriedAt.Store(time.Now().UnixNano())
					return errors.New("try again")
				case n == 1:
					redelivered.Store(time.Now().UnixNano())
				}
				return nil
			}
			s := subscribe(t, b, tbl, h, sqlxbroker.SubscribeParams{PollInterval: 20 * time.Millisecond,
				RetryDelay: func(int, error) time.Duration { return 300 * time.Millisecond },
				OnOutcome: func(d *sqlxbroker.Delivery, o sqlxbroker.Outcome, err error) {
					if err != nil {
						t.Errorf("row %v: %v: %v", d.ID(), o.Kind, err)
					}
					if o.Kind == sqlxbroker.Succeeded {
						done.Add(1)
					}
				}})
			waitFor(t, 10*time.Second, "every row completed", func() bool { return done.Load() == 10 })
			if st := s.Stats(); st.LeaseLost != 0 || st.Retried != 1 || st.Succeeded != 10 {
				t.Errorf("stats %+v", st)
			}
			if wait := time.Duration(redelivered.Load() - retriedAt.Load()); wait < 250*time.Millisecond {
				t.Errorf("retry redelivered after %v, before its ready time", wait)
			}
			if n := count(t, db, tbl, "1=1"); n != 0 {
				t.Errorf("%d rows left", n)
			}
		})
	}
}

// TestRefusals: DSN settings and lease columns the dialect cannot work with
// fail Subscribe with a clear error.
func TestRefusals(t *testing.T) {
	dsn := testDSN(t)
	h := func(context.Context, *sqlxbroker.Delivery) error { return nil }
	desc := sqlxbroker.Table{LockedUntil: "locked_until"}
	for _, c := range []struct{ params, want string }{
		{"columnsWithAlias=true", "columnsWithAlias"},
		{"autocommit=0", "autocommit"},
	} {
		db := openDB(t, withParams(dsn, c.params))
		b := openBroker(t, db)
		tbl := newTable(t, b, desc, payload...)
		if _, err := b.Subscribe(context.Background(), tbl, h, sqlxbroker.SubscribeParams{}); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Subscribe: %v, want an error naming %s", c.params, err, c.want)
		}
	}

	db := openDB(t, dsn)
	b := openBroker(t, db)
	tbl := newTable(t, b, desc, payload...)
	if _, err := db.Exec("ALTER TABLE `" + tbl.Name + "` MODIFY locked_until DATETIME NULL"); err != nil {
		t.Fatal(err)
	}
	_, err := b.Subscribe(context.Background(), tbl, h, sqlxbroker.SubscribeParams{})
	if !errors.Is(err, sqlxbroker.ErrInvalidTable) || !strings.Contains(err.Error(), "DATETIME(6)") {
		t.Errorf("DATETIME lease column: Subscribe: %v, want ErrInvalidTable asking for DATETIME(6)", err)
	}

	fifo := newTable(t, b, sqlxbroker.Table{Group: "grp", Isolation: sql.LevelSerializable}, payload...)
	_, err = b.Subscribe(context.Background(), fifo, h, sqlxbroker.SubscribeParams{})
	if !errors.Is(err, sqlxbroker.ErrInvalidTable) || !strings.Contains(err.Error(), "SERIALIZABLE") {
		t.Errorf("FIFO at SERIALIZABLE: Subscribe: %v, want ErrInvalidTable naming SERIALIZABLE", err)
	}

	if !isMariaDB(t, db) {
		mb := sqlxbroker.OpenDialect(db, mysql.Dialect{MariaDB: true})
		tbl := newTable(t, mb, desc, payload...)
		if _, err := mb.Subscribe(context.Background(), tbl, h, sqlxbroker.SubscribeParams{}); err == nil {
			t.Error("Dialect{MariaDB: true} accepted a MySQL server")
		}
	}
}

// TestClaimIsolation: claim transactions run at READ COMMITTED (each
// statement sees the latest commits) whether the pool's sessions start at
// REPEATABLE READ (the claim names its level) or, through the DSN, at READ
// COMMITTED (the claim then leaves the level to the session).
func TestClaimIsolation(t *testing.T) {
	base := testDSN(t)
	variable := "transaction_isolation"
	if isMariaDB(t, openDB(t, base)) {
		variable = "tx_isolation"
	}
	for _, c := range []struct{ name, dsn string }{
		{"server default", base},
		{"session at READ COMMITTED", withParams(base, variable+"=%27READ-COMMITTED%27")},
	} {
		t.Run(c.name, func(t *testing.T) {
			db := openDB(t, c.dsn)
			pool := core.NewPool(db, mysql.Dialect{})
			defer pool.Close()
			if _, err := (mysql.Dialect{}).Start(context.Background(), pool, &core.Plan{Form: sqlxbroker.RowLock}); err != nil {
				t.Fatal(err)
			}
			writer := openDB(t, base)
			name := fmt.Sprintf("sxb_iso_%d", time.Now().UnixNano())
			writer.MustExec("CREATE TABLE " + name + " (id INT PRIMARY KEY)")
			t.Cleanup(func() { writer.Exec("DROP TABLE " + name) })
			tx, err := pool.BeginClaim(context.Background(), sql.LevelReadCommitted)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback()
			var n int
			if err := tx.Get(&n, "SELECT COUNT(*) FROM "+name); err != nil || n != 0 {
				t.Fatalf("first read: %d rows, %v", n, err)
			}
			writer.MustExec("INSERT INTO " + name + " VALUES (1)")
			if err := tx.Get(&n, "SELECT COUNT(*) FROM "+name); err != nil || n != 1 {
				t.Errorf("a second read in the claim transaction sees %d rows (%v), want 1: not READ COMMITTED", n, err)
			}
		})
	}
}

// TestRowLockChainsCommits: the row-lock form goes from one delivery to the
// next with COMMIT AND CHAIN (core.RowLockSQL.ChainCommit), so a drain of one handler
// opens a transaction for the first row only, not one per row; a handler
// that asks for its transaction gets a plain commit.
func TestRowLockChainsCommits(t *testing.T) {
	const rows = 100
	db := openDB(t, testDSN(t))
	b := openBroker(t, db)
	begins := func() int {
		var name string
		var n int
		if err := db.QueryRow("SHOW GLOBAL STATUS LIKE 'Com_begin'").Scan(&name, &n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	for _, useTx := range []bool{false, true} {
		tbl := newTable(t, b, sqlxbroker.Table{}, payload...)
		msgs := make([]msg, rows)
		for i := range msgs {
			msgs[i] = msg{N: int64(i)}
		}
		publish(t, b, tbl, msgs...)
		before := begins()
		s := subscribe(t, b, tbl, func(ctx context.Context, d *sqlxbroker.Delivery) error {
			if useTx {
				_, err := d.Tx()
				return err
			}
			return nil
		}, sqlxbroker.SubscribeParams{Concurrency: 1, PollInterval: 50 * time.Millisecond})
		waitFor(t, time.Minute, "every row completed", func() bool { return s.Stats().Succeeded == rows })
		stop(t, s)
		n := begins() - before
		t.Logf("handler uses the transaction: %v; %d rows, %d transactions begun", useTx, rows, n)
		if !useTx && n > rows/4 {
			t.Errorf("%d transactions begun for %d rows: commits did not chain", n, rows)
		}
		if useTx && n < rows {
			t.Errorf("%d transactions begun for %d rows whose handlers used their transaction, want one each", n, rows)
		}
	}
}

// TestRowLockPrepared: the row-lock form prepares its claim and completion
// once per connection (core.RowLockSQL.Prepare) and executes them for every
// row: a drain of one handler prepares a few statements and executes two
// per row.
func TestRowLockPrepared(t *testing.T) {
	const rows = 100
	db := openDB(t, testDSN(t))
	b := openBroker(t, db)
	status := func(name string) int {
		var n int
		if err := db.QueryRow("SHOW GLOBAL STATUS LIKE '"+name+"'").Scan(&name, &n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	tbl := newTable(t, b, sqlxbroker.Table{}, payload...)
	msgs := make([]msg, rows)
	for i := range msgs {
		msgs[i] = msg{N: int64(i)}
	}
	publish(t, b, tbl, msgs...)
	prep, exec := status("Com_stmt_prepare"), status("Com_stmt_execute")
	s := subscribe(t, b, tbl, func(ctx context.Context, d *sqlxbroker.Delivery) error { return nil },
		sqlxbroker.SubscribeParams{Concurrency: 1, PollInterval: 50 * time.Millisecond})
	waitFor(t, time.Minute, "every row completed", func() bool { return s.Stats().Succeeded == rows })
	stop(t, s)
	prep, exec = status("Com_stmt_prepare")-prep, status("Com_stmt_execute")-exec
	t.Logf("%d rows: %d statements prepared, %d executed", rows, prep, exec)
	if exec < 2*rows {
		t.Errorf("%d prepared statements executed for %d rows, want at least 2 per row", exec, rows)
	}
	if prep > 10 {
		t.Errorf("%d statements prepared for %d rows: not reused", prep, rows)
	}
}
