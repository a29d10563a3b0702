package forms_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/sqlxbroker/sqlxbroker/conformance/provision"
	_ "github.com/sqlxbroker/sqlxbroker/dialects/mysql"
	_ "github.com/sqlxbroker/sqlxbroker/dialects/postgres"
	"github.com/sqlxbroker/sqlxbroker/dialects/sqlite"

	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/conformance"
	"github.com/sqlxbroker/sqlxbroker/core"
	"github.com/sqlxbroker/sqlxbroker/forms"
)

// TestClaimCursor: claims start from the last row claimed, so a row made
// claimable again behind it (a retry at once) waits for the next full
// scan: the periodic one, or the one a claim makes when nothing is ahead of
// the cursor. It is never left behind.
func TestClaimCursor(t *testing.T) {
	t.Cleanup(func() { forms.SetFullScanEvery(100 * time.Millisecond) })
	forms.SetFullScanEvery(time.Hour)
	ctx := context.Background()
	db, b, tb := leaseTable(t, time.Minute)
	for range 5 {
		if err := b.Publish(ctx, db, tb, map[string]any{"account": "a"}); err != nil {
			t.Fatal(err)
		}
	}
	f := conformance.StartForm(t, b, tb)
	held := map[string]core.Claim{}
	claim := func(want string) {
		t.Helper()
		cs, err := f.Claim(ctx, 1)
		if err != nil || len(cs) != 1 {
			t.Fatalf("claim: %d claims, %v; want row %s", len(cs), err, want)
		}
		got := fmt.Sprint(sqlxbroker.NewDelivery(cs[0]).ID())
		if got != want {
			t.Fatalf("claimed row %s, want %s", got, want)
		}
		held[got] = cs[0]
	}
	retry := func(id string) {
		t.Helper()
		if err := conformance.Complete(ctx, held[id], sqlxbroker.Outcome{Kind: sqlxbroker.Retry}); err != nil {
			t.Fatal(err)
		}
	}
	claim("1")
	claim("2")
	retry("1")
	claim("3") // from the cursor: row 1 waits
	forms.SetFullScanEvery(0)
	claim("1") // the periodic full scan finds it
	forms.SetFullScanEvery(time.Hour)
	claim("4")
	claim("5")
	retry("2")
	claim("2") // nothing ahead of the cursor: a full scan at once
	if cs, err := f.Claim(ctx, 1); err != nil || len(cs) != 0 {
		t.Fatalf("claim with every row held: %d claims, %v", len(cs), err)
	}
}

// TestAdvisoryCursorSkipsCounted: an advisory claim from the cursor reads
// only rows no claim has counted, so rows ahead of it that another
// subscription took (their attempt counted) are not read and tried in
// vain; a counted row that is claimable (a retry, a row published with its
// attempt counted) is found by the next full scan, never left behind.
func TestAdvisoryCursorSkipsCounted(t *testing.T) {
	ctx := context.Background()
	for _, c := range cursorTables(t, "fx_counted", sqlxbroker.Advisory) {
		t.Run(c.name, func(t *testing.T) {
			publishRows(t, c, 4, func(i int, m map[string]any) {
				m[c.tb.AttemptColumn()] = 1
				if i == 3 {
					m[c.tb.AttemptColumn()] = 2 // counted once: taken before, now claimable again
				}
			})
			f := conformance.StartForm(t, c.b, c.tb)
			claim := claimOne(t, f)
			claim("1") // the first claim scans from the first row
			claim("2") // from the cursor
			claim("4") // from the cursor: row 3 is counted, not read
			claim("3") // nothing uncounted ahead: a full scan at once
			if cs, err := f.Claim(ctx, 1); err != nil || len(cs) != 0 {
				t.Fatalf("claim with every row held: %d claims, %v", len(cs), err)
			}
		})
	}
}

// TestAdvisoryClaimEndsWithEnough: an advisory claim reads no further page
// once a page has brought it a quarter of the rows it asked for, and 64 at
// least (the rows it took hold their keys until it ends), and the next
// claim reads on from the cursor.
func TestAdvisoryClaimEndsWithEnough(t *testing.T) {
	ctx := context.Background()
	for _, c := range cursorTables(t, "fx_enough", sqlxbroker.Advisory) {
		t.Run(c.name, func(t *testing.T) {
			// Row 1 holds key x once claimed. A claim of 256 from the
			// cursor reads a first page of 321 rows (2-322): rows 2-65
			// have free keys, rows 66-322 key x. Rows 323-700 are free.
			publishRows(t, c, 700, func(i int, m map[string]any) {
				if i == 1 || i >= 66 && i <= 322 {
					m["account"] = "x"
				}
			})
			f := conformance.StartForm(t, c.b, c.tb)
			var held []core.Claim
			t.Cleanup(func() {
				for _, c := range held {
					_ = conformance.Complete(ctx, c, sqlxbroker.Outcome{Kind: sqlxbroker.Released})
				}
			})
			claim := func(n int) []int {
				t.Helper()
				cs, err := f.Claim(ctx, n)
				if err != nil {
					t.Fatalf("claim of %d: %v", n, err)
				}
				var ids []int
				for _, c := range cs {
					held = append(held, c)
					id, err := strconv.Atoi(fmt.Sprint(sqlxbroker.NewDelivery(c).ID()))
					if err != nil {
						t.Fatal(err)
					}
					ids = append(ids, id)
				}
				slices.Sort(ids)
				return ids
			}
			span := func(from, to int) []int {
				var out []int
				for i := from; i <= to; i++ {
					out = append(out, i)
				}
				return out
			}
			if got := claim(1); !slices.Equal(got, []int{1}) {
				t.Fatalf("first claim took rows %v, want row 1", got)
			}
			if got := claim(256); !slices.Equal(got, span(2, 65)) {
				t.Fatalf("claim of 256 took %d rows %v, want rows 2-65 from its first page alone", len(got), got)
			}
			if got := claim(8); !slices.Equal(got, span(323, 330)) {
				t.Fatalf("next claim of 8 took rows %v, want 323-330: on from the cursor", got)
			}
		})
	}
}

// TestLeaseCursorTakesTouchedRows: a lease claim from the cursor may pass
// over a ready row whose version another transaction touched (PostgreSQL
// passes over one an update that rolled back left its mark on,
// core.LeaseClaimParams.Cursor); the claim from the first row that follows
// when nothing is left ahead of the cursor takes it. Every row is claimed
// once, whatever the database.
func TestLeaseCursorTakesTouchedRows(t *testing.T) {
	for _, c := range cursorTables(t, "fx_touched", sqlxbroker.Lease) {
		t.Run(c.name, func(t *testing.T) {
			publishRows(t, c, 4, nil)
			tx := c.db.MustBegin()
			tx.MustExec("UPDATE " + c.b.Dialect().QuoteIdent(c.tb.Name) + " SET account = 'b' WHERE id = 2")
			if err := tx.Rollback(); err != nil {
				t.Fatal(err)
			}
			claim := claimHeld(t, conformance.StartForm(t, c.b, c.tb))
			var got []string
			for range 5 {
				got = append(got, claim()...)
			}
			t.Logf("claimed in the order %v", got)
			slices.Sort(got)
			if !slices.Equal(got, []string{"1", "2", "3", "4"}) {
				t.Fatalf("five claims of one row took %v, want each of rows 1-4 once", got)
			}
		})
	}
}

// cursorTables returns the tables of prioTables in form f, with a full scan
// from the first row, while t runs, only when a claim from the cursor
// finds nothing.
func cursorTables(t *testing.T, name string, f sqlxbroker.Form) []prioTable {
	t.Helper()
	t.Cleanup(func() { forms.SetFullScanEvery(100 * time.Millisecond) })
	forms.SetFullScanEvery(time.Hour)
	var out []prioTable
	for _, c := range prioTables(t, name) {
		if c.tb.Form() == f {
			out = append(out, c)
		}
	}
	return out
}

// claimOne returns a function that claims one row of f and fails t unless
// it is row want; the rows claimed are released when t ends.
func claimOne(t *testing.T, f core.ClaimForm) func(want string) {
	claim := claimHeld(t, f)
	return func(want string) {
		t.Helper()
		if got := claim(); len(got) != 1 || got[0] != want {
			t.Fatalf("claimed rows %v, want row %s", got, want)
		}
	}
}

// claimHeld returns a function that claims up to one row of f and returns
// the IDs it took, failing t on an error; the rows claimed are released
// when t ends.
func claimHeld(t *testing.T, f core.ClaimForm) func() []string {
	ctx := context.Background()
	var held []core.Claim
	t.Cleanup(func() {
		for _, c := range held {
			_ = conformance.Complete(ctx, c, sqlxbroker.Outcome{Kind: sqlxbroker.Released})
		}
	})
	return func() []string {
		t.Helper()
		cs, err := f.Claim(ctx, 1)
		if err != nil {
			t.Fatalf("claim: %v", err)
		}
		var ids []string
		for _, c := range cs {
			held = append(held, c)
			ids = append(ids, fmt.Sprint(sqlxbroker.NewDelivery(c).ID()))
		}
		return ids
	}
}

// publishRows publishes n rows of priority 0 into c's table in one call,
// row i (from 1) with account "a<i>" and whatever set adds to it (the same
// columns to every row, as one Publish takes them).
func publishRows(t *testing.T, c prioTable, n int, set func(i int, m map[string]any)) {
	t.Helper()
	msgs := make([]any, 0, n)
	for i := 1; i <= n; i++ {
		m := map[string]any{"account": fmt.Sprint("a", i), "prio": 0}
		if set != nil {
			set(i, m)
		}
		msgs = append(msgs, m)
	}
	if err := c.b.Publish(context.Background(), c.db, c.tb, msgs...); err != nil {
		t.Fatal(err)
	}
}

// TestRescanOnWake: in a table ordered by more than its ID, a row
// published with a higher priority sorts before the claim cursor. A
// wake-up (core.Rescanner) makes the next claim scan from the first row,
// so it is claimed next, and leaves the cursor where it was: the claim
// after it goes on from the cursor. A table ordered by its ID has no
// Rescanner.
func TestRescanOnWake(t *testing.T) {
	t.Cleanup(func() { forms.SetFullScanEvery(100 * time.Millisecond) })
	forms.SetFullScanEvery(time.Hour)
	for _, c := range prioTables(t, "fx_rescan") {
		t.Run(c.name, func(t *testing.T) {
			claim, r := c.claimedTwo(t)
			c.publish(t, "a5", 1)
			claim("3") // from the cursor: row 6 sorts before it
			r.Rescan()
			claim("6") // the wake-up's full scan
			claim("4") // the cursor stayed at row 3; row 6 came before it,
			// so this claim rescanned too, and finds row 4 first
			claim("5")
		})
	}
	_, b, tb := leaseTable(t, time.Minute)
	if r := core.RescannerOf(conformance.StartForm(t, b, tb)); r != nil {
		t.Errorf("a table ordered by its ID has a Rescanner %T", r)
	}
}

// TestWakeDuringRescan: a wake-up told while a rescan's claim runs may
// stand for a row committed after that claim's snapshot, so the rescan
// goes on: the next claim scans from the first row again and takes the
// row, though the claim that ran found a row at the cursor, which ends a
// rescan. Without it the row would wait for the next full scan behind
// the whole backlog (the periodic one is set to an hour here).
func TestWakeDuringRescan(t *testing.T) {
	t.Cleanup(func() { forms.SetFullScanEvery(100 * time.Millisecond) })
	forms.SetFullScanEvery(time.Hour)
	ctx := context.Background()
	for _, c := range prioTables(t, "fx_wakerescan") {
		t.Run(c.name, func(t *testing.T) {
			claim, r := c.claimedTwo(t)
			c.publish(t, "a5", 1)
			r.Rescan()
			claim("6") // the wake-up's full scan: row 6 sorts first
			// Row 7 is published while row 3's claim runs, after its
			// statement: in a goroutine, as SQLite's one writer may
			// still be in the claim's transaction.
			var published chan error
			forms.SetRescannedHook(t, func() {
				if published == nil {
					published = make(chan error, 1)
					r.Rescan()
					go func() {
						published <- c.b.Publish(ctx, c.db, c.tb, map[string]any{"account": "a6", "prio": 1})
					}()
				}
			})
			claim("3") // the rescan finds nothing more before the cursor
			if published == nil {
				t.Fatal("the claim of row 3 was not a rescan")
			}
			if err := <-published; err != nil {
				t.Fatal(err)
			}
			claim("7") // the wake-up told while row 3's claim ran
			claim("4")
		})
	}
}

// TestPriorityJumpsBacklog: a subscription to a table ordered by priority,
// busy with a backlog, claims a row published with a higher priority next
// (the publish's in-process wake-up makes its next claim a full scan),
// not after the backlog: the periodic full scan is set to an hour here.
func TestPriorityJumpsBacklog(t *testing.T) {
	t.Cleanup(func() { forms.SetFullScanEvery(100 * time.Millisecond) })
	forms.SetFullScanEvery(time.Hour)
	ctx := context.Background()
	for _, c := range prioTables(t, "fx_jump") {
		t.Run(c.name, func(t *testing.T) {
			b, tb := c.b, c.tb
			const backlog = 50
			for i := range backlog {
				c.publish(t, fmt.Sprint("backlog-", i), 0)
			}
			order := make(chan string, backlog+1)
			first := make(chan struct{})
			release := make(chan struct{})
			var once bool
			s, err := b.Subscribe(ctx, tb, func(_ context.Context, d *sqlxbroker.Delivery) error {
				var m struct {
					Account string `db:"account"`
				}
				if err := d.Scan(&m); err != nil {
					return err
				}
				order <- strings.TrimRight(m.Account, "-0123456789")
				if !once { // the first delivery holds the only handler
					once = true
					close(first)
					<-release
				}
				return nil
			}, sqlxbroker.SubscribeParams{Concurrency: 1, PollInterval: time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Stop(ctx)
			<-first
			c.publish(t, "urgent", 1)
			close(release)
			deadline := time.After(30 * time.Second)
			for i := 1; i <= backlog+1; i++ {
				select {
				case a := <-order:
					if a == "urgent" {
						// The wake-up reaches the form through a goroutine
						// of its own: a few claims may start before it (more
						// on a loaded machine). Without it the urgent row
						// comes last.
						if i > backlog/2 {
							t.Fatalf("the urgent row was delivery %d of %d, want one of the first %d", i, backlog+1, backlog/2)
						}
						return
					}
				case <-deadline:
					t.Fatalf("%d deliveries in 30 s, the urgent row not among them", i-1)
				}
			}
			t.Fatal("the urgent row was not delivered")
		})
	}
}

// prioTable is a table ordered "prio DESC, id" on one database, in one
// form.
type prioTable struct {
	name string
	db   *sqlx.DB
	b    *sqlxbroker.Broker
	tb   sqlxbroker.Table
}

// publish publishes one row of account at prio to c's table.
func (c prioTable) publish(t *testing.T, account string, prio int) {
	t.Helper()
	if err := c.b.Publish(context.Background(), c.db, c.tb, map[string]any{"account": account, "prio": prio}); err != nil {
		t.Fatal(err)
	}
}

// claimedTwo publishes rows 1 to 5 at prio 0 to c's table, starts its
// form, claims rows 1 and 2 (the cursor is then at row 2), and returns
// the claim function (claimOne) and the form's Rescanner.
func (c prioTable) claimedTwo(t *testing.T) (func(want string), core.Rescanner) {
	t.Helper()
	for i := range 5 {
		c.publish(t, fmt.Sprint("a", i), 0)
	}
	f := conformance.StartForm(t, c.b, c.tb)
	r := core.RescannerOf(f)
	if r == nil {
		t.Fatal("no Rescanner for a table ordered by prio")
	}
	claim := claimOne(t, f)
	claim("1")
	claim("2")
	return claim, r
}

// prioTables makes a table named name, ordered by priority, for each form
// of SQLite (a new file) and of the servers the environment names
// (provision's rules: a skip that names the variable, a failure under
// SQLXBROKER_REQUIRE_DB=1).
func prioTables(t *testing.T, name string) []prioTable {
	t.Helper()
	return formTables(t, []sqlxbroker.Table{
		{Name: name + "_lease", LockedUntil: "locked_until", Lease: time.Minute, Order: "prio DESC, id"},
		{Name: name + "_rowlock", Order: "prio DESC, id"},
		{Name: name + "_adv", AdvisoryLock: "acct-{account}", Order: "prio DESC, id"},
	}, [2]string{"account", "text"}, [2]string{"prio", "bigint"})
}

// formTables creates each of tables whose form the database offers, with
// the payload columns cols, on SQLite and on the servers the environment
// names.
func formTables(t *testing.T, tables []sqlxbroker.Table, cols ...[2]string) []prioTable {
	t.Helper()
	dbs := map[string]*sqlx.DB{}
	db, err := sqlite.Open(filepath.Join(t.TempDir(), "jobs.db"))
	if err != nil {
		t.Fatal(err)
	}
	dbs["sqlite"] = db
	for _, s := range []struct {
		name, driver string
		p            provision.Database
	}{{"postgres", "postgres", provision.Postgres}, {"mysql", "mysql", provision.MariaDB}} {
		if os.Getenv(s.p.Env) == "" && os.Getenv(provision.Require) != "1" {
			continue
		}
		db, err := sqlx.Open(s.driver, s.p.Get(t))
		if err != nil {
			t.Fatal(err)
		}
		dbs[s.name] = db
	}
	var out []prioTable
	for _, dbName := range []string{"sqlite", "postgres", "mysql"} {
		db := dbs[dbName]
		if db == nil {
			continue
		}
		t.Cleanup(func() { db.Close() })
		b, err := sqlxbroker.Open(db)
		if err != nil {
			t.Fatal(err)
		}
		for _, tb := range tables {
			if !core.CapabilitiesOf(b.Dialect()).Offers(tb.Form()) {
				continue
			}
			q := b.Dialect().QuoteIdent(tb.Name)
			_, _ = db.Exec("DROP TABLE IF EXISTS " + q)
			if err := b.CreateTable(context.Background(), tb, cols...); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _, _ = db.Exec("DROP TABLE IF EXISTS " + q) })
			out = append(out, prioTable{name: dbName + "/" + tb.Form().String(), db: db, b: b, tb: tb})
		}
	}
	return out
}

// TestFloor: in a table that keeps its finished rows, full scans start
// from the first unfinished row as last read (the floor), not the first
// row: a dead row requeued behind the floor waits for the floor to be read
// again, and is then claimed. It is never left behind.
func TestFloor(t *testing.T) {
	t.Cleanup(func() {
		forms.SetFullScanEvery(100 * time.Millisecond)
		forms.SetFloorEvery(time.Second)
	})
	ctx := context.Background()
	for _, c := range formTables(t, []sqlxbroker.Table{
		{Name: "fx_floor_lease", LockedUntil: "locked_until", Lease: time.Minute, DoneAt: "done_at", DeadAt: "dead_at"},
		{Name: "fx_floor_rowlock", DoneAt: "done_at", DeadAt: "dead_at"},
		{Name: "fx_floor_adv", AdvisoryLock: "acct-{account}", DoneAt: "done_at", DeadAt: "dead_at"},
	}, [2]string{"account", "text"}) {
		t.Run(c.name, func(t *testing.T) {
			forms.SetFullScanEvery(0) // every claim is a full scan
			forms.SetFloorEvery(0)    // and reads the floor first
			db, b, tb := c.db, c.b, c.tb
			for i := range 4 {
				if err := b.Publish(ctx, db, tb, map[string]any{"account": fmt.Sprint("a", i)}); err != nil {
					t.Fatal(err)
				}
			}
			f := conformance.StartForm(t, b, tb)
			claim := func(want string) core.Claim {
				t.Helper()
				return claimRow(t, f, want)
			}
			finish := func(c core.Claim, k sqlxbroker.OutcomeKind) {
				t.Helper()
				if err := conformance.Complete(ctx, c, sqlxbroker.Outcome{Kind: k, Err: fmt.Errorf("outcome %v", k)}); err != nil {
					t.Fatal(err)
				}
			}
			finish(claim("1"), sqlxbroker.Dead)
			finish(claim("2"), sqlxbroker.Succeeded) // the floor read before it: row 2
			forms.SetFloorEvery(time.Hour)
			claim("3")
			if n, err := b.Requeue(ctx, tb, sqlxbroker.Select{IDs: []any{int64(1)}}); err != nil || n != 1 {
				t.Fatalf("requeue row 1: %d, %v", n, err)
			}
			claim("4") // from the floor: row 1 is behind it
			claim("")  // nothing from the floor
			forms.SetFloorEvery(0)
			claim("1") // the floor read again: row 1 is the first unfinished row
		})
	}
}

// TestHalfBatches: the lease and advisory forms halve large batches
// (core.Traits.HalfBatches) on the servers, which write claims and
// completions side by side, and not on SQLite, which writes one
// transaction at a time and drains faster with claims of every free
// handler's row.
func TestHalfBatches(t *testing.T) {
	for _, c := range prioTables(t, "fx_halves") {
		if c.tb.Form() == sqlxbroker.RowLock {
			continue
		}
		t.Run(c.name, func(t *testing.T) {
			f := conformance.StartForm(t, c.b, c.tb)
			want := !strings.HasPrefix(c.name, "sqlite/")
			if got := f.Traits().HalfBatches; got != want {
				t.Errorf("Traits().HalfBatches = %v, want %v", got, want)
			}
		})
	}
}

// TestRowLockByID: where the dialect asks for it (core.RowLockSQL.ByID),
// row-lock claims from the cursor lock their rows by ID among candidates
// read without locks. A candidate locked elsewhere is passed over, as a
// range claim passes over it, and once free it is claimed by the next full
// scan (here the one a claim makes when nothing is ahead of the cursor).
func TestRowLockByID(t *testing.T) {
	t.Cleanup(func() { forms.SetFullScanEvery(100 * time.Millisecond) })
	ctx := context.Background()
	for _, c := range formTables(t, []sqlxbroker.Table{{Name: "fx_byid_rowlock"}}, [2]string{"account", "text"}) {
		t.Run(c.name, func(t *testing.T) {
			forms.SetFullScanEvery(time.Hour)
			var byID atomic.Int64
			forms.SetByIDHook(t, func() { byID.Add(1) })
			db, b, tb := c.db, c.b, c.tb
			pool := core.NewPool(db, b.Dialect())
			defer pool.Close()
			rl, err := core.CapabilitiesOf(b.Dialect()).RowLocker.RowLock(ctx, pool)
			if err != nil {
				t.Fatal(err)
			}
			for i := range 6 {
				if err := b.Publish(ctx, db, tb, map[string]any{"account": fmt.Sprint("a", i)}); err != nil {
					t.Fatal(err)
				}
			}
			f := conformance.StartForm(t, b, tb)
			var held []core.Claim
			t.Cleanup(func() {
				for _, c := range held {
					_ = conformance.Complete(ctx, c, sqlxbroker.Outcome{Kind: sqlxbroker.Released})
				}
			})
			claim := func(want string) {
				t.Helper()
				if c := claimRow(t, f, want); c != nil {
					held = append(held, c)
				}
			}
			claim("1") // the first claim scans from the first row
			other, err := db.BeginTxx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer other.Rollback()
			q := b.Dialect().QuoteIdent(tb.Name)
			if _, err := other.ExecContext(ctx, db.Rebind("SELECT id FROM "+q+" WHERE id = ? FOR UPDATE"), 3); err != nil {
				t.Fatal(err)
			}
			for _, want := range []string{"2", "4", "5", "6"} {
				claim(want)
			}
			if got := byID.Load(); rl.ByID && got != 4 || !rl.ByID && got != 0 {
				t.Errorf("%d rows claimed by ID, the dialect's RowLockSQL.ByID %v: want 4 with it, 0 without", got, rl.ByID)
			}
			if err := other.Rollback(); err != nil {
				t.Fatal(err)
			}
			claim("3") // nothing ahead of the cursor: from the first row
			claim("")
		})
	}
}

// claimRow claims one row with f and fails t unless it is the row of ID
// want ("": none); it returns the claim, nil for none.
func claimRow(t *testing.T, f core.ClaimForm, want string) core.Claim {
	t.Helper()
	cs, err := f.Claim(context.Background(), 1)
	if err != nil {
		t.Fatal(err)
	}
	var got string
	if len(cs) == 1 {
		got = fmt.Sprint(sqlxbroker.NewDelivery(cs[0]).ID())
	}
	if len(cs) > 1 || got != want {
		t.Fatalf("claimed %d rows (%q), want row %q", len(cs), got, want)
	}
	if len(cs) == 0 {
		return nil
	}
	return cs[0]
}
