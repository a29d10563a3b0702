package sqlxbroker_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/dialects/sqlite"
)

type invoice struct {
	Number string `db:"number"`
}

// Publish later, and skip messages whose unique number is already queued.
func ExampleBroker_PublishWith() {
	dir, _ := os.MkdirTemp("", "sqlxbroker-publish-")
	defer os.RemoveAll(dir)
	db, err := sqlite.Open(filepath.Join(dir, "app.db"))
	if err != nil {
		panic(err)
	}
	defer db.Close()
	ctx := context.Background()
	b, _ := sqlxbroker.Open(db)
	defer b.Close(ctx)

	invoices := sqlxbroker.Table{Name: "invoices", LockedUntil: "locked_until", ReadyAt: "ready_at"}
	if err := b.CreateTable(ctx, invoices, [2]string{"number", "text"}); err != nil {
		panic(err)
	}
	db.MustExec(`CREATE UNIQUE INDEX invoices_number ON invoices (number)`)

	n, err := b.PublishWith(ctx, db, invoices, sqlxbroker.PublishParams{Delay: time.Hour, SkipDuplicates: "number"},
		invoice{"A-1"}, invoice{"A-2"})
	fmt.Println(n, err)
	n, err = b.PublishWith(ctx, db, invoices, sqlxbroker.PublishParams{Delay: time.Hour, SkipDuplicates: "number"},
		invoice{"A-2"}, invoice{"A-3"}, invoice{"A-3"})
	fmt.Println(n, err)

	c, _ := b.Counts(ctx, invoices)
	fmt.Println(c.Scheduled, "scheduled,", c.Ready, "ready")

	_, err = b.PublishWith(ctx, db, invoices, sqlxbroker.PublishParams{Delay: time.Hour, ReadyAt: time.Now()}, invoice{"A-4"})
	fmt.Println(err)
	// Output:
	// 2 <nil>
	// 1 <nil>
	// 3 scheduled, 0 ready
	// sqlxbroker: publish to invoices: PublishParams.Delay and PublishParams.ReadyAt are both set; give one
}

type traceKey struct{}

// Carry a text from each publisher to the handlers in the Metadata column:
// package otelbroker stores the trace context so.
func ExampleBroker_SetMetadataFunc() {
	dir, _ := os.MkdirTemp("", "sqlxbroker-metadata-")
	defer os.RemoveAll(dir)
	db, err := sqlite.Open(filepath.Join(dir, "app.db"))
	if err != nil {
		panic(err)
	}
	defer db.Close()
	ctx := context.Background()
	b, _ := sqlxbroker.Open(db)
	defer b.Close(ctx)

	jobs := sqlxbroker.Table{Name: "jobs", LockedUntil: "locked_until", Metadata: "meta"}
	if err := b.CreateTable(ctx, jobs, [2]string{"number", "text"}); err != nil {
		panic(err)
	}
	b.SetMetadataFunc(func(ctx context.Context) string {
		s, _ := ctx.Value(traceKey{}).(string)
		return s
	})
	if err := b.Publish(context.WithValue(ctx, traceKey{}, "request 42"), db, jobs, invoice{"A-1"}); err != nil {
		panic(err)
	}
	got := make(chan string, 1)
	sub, err := b.Subscribe(ctx, jobs, func(ctx context.Context, d *sqlxbroker.Delivery) error {
		got <- d.Metadata()
		return nil
	}, sqlxbroker.SubscribeParams{})
	if err != nil {
		panic(err)
	}
	fmt.Println(<-got)
	_ = sub.Stop(ctx)
	// Output:
	// request 42
}
