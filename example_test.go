package sqlxbroker_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/dialects/sqlite"
)

type email struct {
	ID int64  `db:"id"`
	To string `db:"to_addr"`
}

// A lease table on SQLite: publish in the caller's transaction, then drain.
func Example() {
	dir, _ := os.MkdirTemp("", "sqlxbroker-example-")
	defer os.RemoveAll(dir)
	db, err := sqlite.Open(filepath.Join(dir, "app.db"))
	if err != nil {
		panic(err)
	}
	defer db.Close()
	ctx := context.Background()

	b, _ := sqlxbroker.Open(db) // the dialect comes from db.DriverName()
	emails := sqlxbroker.Table{Name: "emails", LockedUntil: "locked_until"}
	if err := b.CreateTable(ctx, emails, [2]string{"to_addr", "text"}); err != nil {
		panic(err)
	}

	tx := db.MustBegin() // a transactional outbox: the rows commit with tx
	if err := b.Publish(ctx, tx, emails, email{To: "ada@example.com"}, email{To: "alan@example.com"}); err != nil {
		panic(err)
	}
	_ = tx.Commit()

	got := make(chan string, 2)
	sub, err := b.Subscribe(ctx, emails, func(ctx context.Context, d *sqlxbroker.Delivery) error {
		var e email
		if err := d.Scan(&e); err != nil {
			return err
		}
		got <- fmt.Sprintf("%s (attempt %d)", e.To, d.Attempt())
		return nil
	}, sqlxbroker.SubscribeParams{Concurrency: 1})
	if err != nil {
		panic(err)
	}
	fmt.Println(<-got)
	fmt.Println(<-got)
	_ = sub.Stop(ctx)
	fmt.Println(sub.Stats().Succeeded, "completed")
	// Output:
	// ada@example.com (attempt 1)
	// alan@example.com (attempt 1)
	// 2 completed
}

// TableDDL prints the recommended table for a description.
func ExampleBroker_TableDDL() {
	db, _ := sqlite.Open(filepath.Join(os.TempDir(), "sqlxbroker-ddl-example.db"))
	defer db.Close()
	b, _ := sqlxbroker.Open(db)
	stmts, _ := b.TableDDL(sqlxbroker.Table{Name: "orders", AdvisoryLock: "account-{account}"}, [2]string{"total", "bigint"})
	fmt.Println(stmts[0])
	// Output:
	// CREATE TABLE IF NOT EXISTS "orders" (
	//   "id" INTEGER PRIMARY KEY,
	//   "attempt" INTEGER NOT NULL DEFAULT 1,
	//   "total" INTEGER,
	//   "account" TEXT
	// )
}

// Form names as a configuration file or a flag gives them.
func ExampleParseForms() {
	fl, err := sqlxbroker.ParseForms("lease, advisory")
	fmt.Println(fl, err)
	_, err = sqlxbroker.ParseForms("lease,rowlock")
	fmt.Println(err)
	// Output:
	// [lease advisory] <nil>
	// sqlxbroker: unknown form "rowlock" (row-lock, lease or advisory)
}
