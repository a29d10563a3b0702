package sqlxbroker_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/dialects/sqlite"
)

// exampleTable opens a fresh SQLite database with a lease table that keeps
// failures: ready, dead and last-error columns and three attempts.
func exampleTable(name string) (*sqlxbroker.Broker, sqlxbroker.Table, func()) {
	dir, _ := os.MkdirTemp("", "sqlxbroker-example-")
	db, err := sqlite.Open(filepath.Join(dir, "app.db"))
	if err != nil {
		panic(err)
	}
	b, _ := sqlxbroker.Open(db)
	t := sqlxbroker.Table{Name: name, LockedUntil: "locked_until", ReadyAt: "ready_at",
		DeadAt: "dead_at", LastError: "last_error", MaxAttempts: 3}
	if err := b.CreateTable(context.Background(), t, [2]string{"to_addr", "text"}); err != nil {
		panic(err)
	}
	return b, t, func() { db.Close(); os.RemoveAll(dir) }
}

// A handler that knows a row can never succeed sends it dead at once with
// Permanent: the row is kept, with its attempt and the error.
func ExamplePermanent() {
	b, emails, done := exampleTable("emails")
	defer done()
	ctx := context.Background()
	_ = b.Publish(ctx, b.DB(), emails, email{To: "not an address"})

	dead := make(chan struct{})
	sub, _ := b.Subscribe(ctx, emails, func(ctx context.Context, d *sqlxbroker.Delivery) error {
		var e email
		_ = d.Scan(&e)
		return sqlxbroker.Permanent(fmt.Errorf("bad address %q", e.To))
	}, sqlxbroker.SubscribeParams{Concurrency: 1, OnOutcome: func(d *sqlxbroker.Delivery, o sqlxbroker.Outcome, err error) {
		if o.Kind == sqlxbroker.Dead {
			close(dead)
		}
	}})
	<-dead
	_ = sub.Stop(ctx)

	var attempt int
	var lastErr string
	_ = b.DB().QueryRow(`SELECT attempt, last_error FROM emails WHERE dead_at IS NOT NULL`).Scan(&attempt, &lastErr)
	fmt.Println(attempt-1, "delivery;", lastErr)
	// Output:
	// 1 delivery; permanent failure: bad address "not an address"
}

// A handler that learns when to try again returns RetryAfter: a failure
// (it counts an attempt) retried no earlier than asked.
func ExampleRetryAfter() {
	b, emails, done := exampleTable("emails")
	defer done()
	ctx := context.Background()
	_ = b.Publish(ctx, b.DB(), emails, email{To: "ada@example.com"})

	var failedAt time.Time
	came := make(chan time.Duration, 1)
	sub, _ := b.Subscribe(ctx, emails, func(ctx context.Context, d *sqlxbroker.Delivery) error {
		if d.Attempt() == 1 {
			failedAt = time.Now()
			return sqlxbroker.RetryAfter(200*time.Millisecond, errors.New("mail server says 421: try later"))
		}
		came <- time.Since(failedAt)
		return nil
	}, sqlxbroker.SubscribeParams{Concurrency: 1, MinPollInterval: time.Millisecond, PollInterval: 10 * time.Millisecond})
	fmt.Println("back after 200ms or more:", <-came >= 200*time.Millisecond)
	_ = sub.Stop(ctx)
	// Output:
	// back after 200ms or more: true
}

// A handler that is not ready for a row yet snoozes it: not a failure, so
// no attempt is used however often it snoozes.
func ExampleSnooze() {
	b, emails, done := exampleTable("emails")
	defer done()
	ctx := context.Background()
	_ = b.Publish(ctx, b.DB(), emails, email{To: "ada@example.com"})

	seen := make(chan int, 10)
	snoozes := 0
	sub, _ := b.Subscribe(ctx, emails, func(ctx context.Context, d *sqlxbroker.Delivery) error {
		seen <- d.Attempt()
		if snoozes < 5 { // say, waiting for the account to be verified
			snoozes++
			return sqlxbroker.Snooze(time.Millisecond)
		}
		return nil
	}, sqlxbroker.SubscribeParams{Concurrency: 1, MinPollInterval: time.Millisecond, PollInterval: 10 * time.Millisecond})
	for i := range 6 {
		if i > 0 {
			fmt.Print(" ")
		}
		fmt.Print(<-seen)
	}
	_ = sub.Stop(ctx)
	fmt.Println()
	fmt.Println(sub.Stats().Snoozed, "snoozed,", sub.Stats().Succeeded, "completed")
	// Output:
	// 1 1 1 1 1 1
	// 5 snoozed, 1 completed
}
