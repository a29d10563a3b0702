package sqlxbrokertest_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/jmoiron/sqlx"
	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/dialects/sqlite"
	"github.com/sqlxbroker/sqlxbroker/sqlxbrokertest"
)

// Signup is the application's message: a row of its signups table.
type Signup struct {
	ID    int64  `db:"id"`
	Email string `db:"email"`
	Plan  string `db:"plan"`
}

// welcome is the application's handler under test.
func welcome(ctx context.Context, d *sqlxbroker.Delivery) error {
	var s Signup
	if err := d.Scan(&s); err != nil {
		return err
	}
	if !strings.Contains(s.Email, "@") {
		return sqlxbroker.Permanent(fmt.Errorf("signup %d: bad address %q", s.ID, s.Email))
	}
	fmt.Printf("welcome %s to the %s plan (attempt %d)\n", s.Email, s.Plan, d.Attempt())
	return nil
}

// A handler called directly with a delivery built from a struct: no
// database needed.
func ExampleNewDelivery() {
	test(func(t sqlxbrokertest.TB) {
		d := sqlxbrokertest.NewDelivery(t, sqlxbrokertest.DeliveryParams{
			Row:     Signup{ID: 7, Email: "ada@example.com", Plan: "pro"},
			Attempt: 2,
		})
		fmt.Println(welcome(context.Background(), d))

		d = sqlxbrokertest.NewDelivery(t, sqlxbrokertest.DeliveryParams{Row: Signup{ID: 8, Email: "nobody"}})
		err := welcome(context.Background(), d)
		var perm *sqlxbroker.PermanentError
		fmt.Println(errors.As(err, &perm), err)
	})
	// Output:
	// welcome ada@example.com to the pro plan (attempt 2)
	// <nil>
	// true permanent failure: signup 8: bad address "nobody"
}

// Drain publishes, runs the handler until nothing is claimable, and says
// what happened.
func ExampleDrain() {
	test(func(t sqlxbrokertest.TB) {
		b, signups := testDB(t)
		res, err := sqlxbrokertest.Drain(context.Background(), t, sqlxbrokertest.DrainParams{
			Broker: b, Table: signups, Handler: welcome,
			Messages: []any{Signup{Email: "ada@example.com", Plan: "pro"}, Signup{Email: "nobody", Plan: "free"}},
			// One at a time, so the lines print in order.
			Subscribe: sqlxbroker.SubscribeParams{Concurrency: 1},
		})
		if err != nil {
			t.Fatalf("%v", err)
		}
		fmt.Println("succeeded", res.Stats.Succeeded, "dead", res.Stats.Dead, "dead IDs", res.IDs(sqlxbroker.Dead))
		fmt.Println("left: ready", res.Left.Ready, "dead", res.Left.Dead)
	})
	// Output:
	// welcome ada@example.com to the pro plan (attempt 1)
	// succeeded 1 dead 1 dead IDs [2]
	// left: ready 0 dead 1
}

// signUp is the application's code under test: it writes in the caller's
// transaction and publishes a welcome job in the same one.
func signUp(ctx context.Context, b *sqlxbroker.Broker, tx *sqlx.Tx, signups sqlxbroker.Table, email, plan string) error {
	return b.Publish(ctx, tx, signups, Signup{Email: email, Plan: plan})
}

// What code under test published in its transaction, checked before the
// transaction rolls back.
func ExampleRequirePublished() {
	test(func(t sqlxbrokertest.TB) {
		ctx := context.Background()
		b, signups := testDB(t)
		tx := b.DB().MustBeginTx(ctx, nil)
		defer tx.Rollback()
		if err := signUp(ctx, b, tx, signups, "ada@example.com", "pro"); err != nil {
			t.Fatalf("%v", err)
		}
		sqlxbrokertest.RequirePublished(t, tx, signups, Signup{Email: "ada@example.com", Plan: "pro"})
		fmt.Printf("%+v\n", sqlxbrokertest.Published[Signup](t, tx, signups))

		// A wrong expectation fails the test, saying what differs.
		sqlxbrokertest.RequirePublished(t, tx, signups, Signup{Email: "ada@example.com", Plan: "free"})
	})
	// Output:
	// [{ID:1 Email:ada@example.com Plan:pro}]
	// FAIL: sqlxbrokertest: RequirePublished: table signups holds 1 row, 1 wanted; missing (-): 1, not wanted (+): 1
	//   - want[0] {email="ada@example.com", plan="free", attempt=1}
	//       closest row id=1 differs in plan: want "free", got "pro"
	//   + row {id=1, email="ada@example.com", plan="pro", attempt=1}
}

// A row-lock delivery on the test database: the handler's writes through
// Tx commit with Succeed. (PostgreSQL or MySQL: SQLite has no row-lock
// form; so this example is compiled, not run.)
func ExampleNewRowLockDelivery() {
	test(func(t sqlxbrokertest.TB) {
		ctx := context.Background()
		db, err := sqlx.Open("postgres", os.Getenv("SQLXBROKER_POSTGRES_DSN"))
		if err != nil {
			t.Fatalf("%v", err)
		}
		b, _ := sqlxbroker.Open(db)
		jobs := sqlxbroker.Table{Name: "signups"} // no LockedUntil, no AdvisoryLock: row lock
		d := sqlxbrokertest.NewRowLockDelivery(t, b, jobs, 1)
		tx, _ := d.Tx() // the claim transaction, row 1 locked in it
		if _, err := tx.ExecContext(ctx, "INSERT INTO audit (job) VALUES ($1)", d.ID()); err != nil {
			t.Fatalf("%v", err)
		}
		d.Succeed() // the audit row commits with the job's completion (Fail: it rolls back)
	})
}

// test runs body as a test body would run, with a TB that prints failures
// (FAIL: ...) and ends body at Fatalf, then runs its cleanups. In your own
// tests, pass the *testing.T.
func test(body func(t sqlxbrokertest.TB)) {
	t := &exampleT{}
	done := make(chan struct{})
	go func() { defer close(done); body(t) }()
	<-done
	for i := len(t.cleanups) - 1; i >= 0; i-- {
		t.cleanups[i]()
	}
}

type exampleT struct{ cleanups []func() }

func (t *exampleT) Helper()                   {}
func (t *exampleT) Cleanup(f func())          { t.cleanups = append(t.cleanups, f) }
func (t *exampleT) Logf(string, ...any)       {}
func (t *exampleT) Errorf(f string, a ...any) { fmt.Printf("FAIL: "+f+"\n", a...) }
func (t *exampleT) Fatalf(f string, a ...any) { fmt.Printf("FAIL: "+f+"\n", a...); runtime.Goexit() }

// testDB opens a broker on a new SQLite database with a signups table
// (lease form, dead rows kept), removed when the test ends.
func testDB(t sqlxbrokertest.TB) (*sqlxbroker.Broker, sqlxbroker.Table) {
	dir, err := os.MkdirTemp("", "sqlxbrokertest-example-")
	if err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	db, err := sqlite.Open(filepath.Join(dir, "app.db"))
	if err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(func() { db.Close() })
	b, err := sqlxbroker.Open(db)
	if err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(func() { b.Close(context.Background()) })
	signups := sqlxbroker.Table{Name: "signups", LockedUntil: "locked_until", DeadAt: "dead_at"}
	if err := b.CreateTable(context.Background(), signups, [2]string{"email", "text"}, [2]string{"plan", "text"}); err != nil {
		t.Fatalf("%v", err)
	}
	return b, signups
}
