// Command quickstart is the README's quick start, kept whole so that it
// compiles and runs in the tests: it creates a job table, publishes two
// jobs in one transaction, runs a subscription until SIGINT or SIGTERM, and
// stops gracefully, finishing the jobs in work.
//
//	go run ./examples/quickstart                      # SQLite, no set-up
//	go run ./examples/quickstart -driver postgres -dsn 'postgres://root@127.0.0.1:5432/test?sslmode=disable'
//	go run ./examples/quickstart -driver mysql -dsn 'root@tcp(127.0.0.1:3306)/test'
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/sqlxbroker/sqlxbroker"
	_ "github.com/sqlxbroker/sqlxbroker/dialects/mysql"
	"github.com/sqlxbroker/sqlxbroker/dialects/postgres"
	"github.com/sqlxbroker/sqlxbroker/dialects/sqlite"
)

// Job is one row of the jobs table: its `db` tags name the columns.
type Job struct {
	Email string `db:"email"`
}

func main() {
	driver := flag.String("driver", "sqlite", "postgres, mysql or sqlite")
	dsn := flag.String("dsn", "", "data source name (default: an SQLite file in a new temporary directory)")
	flag.Parse()

	// Run until SIGINT (Ctrl-C) or SIGTERM.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *driver, *dsn); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, driver, dsn string) error {
	db, err := open(driver, dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	b, err := sqlxbroker.Open(db) // the dialect from db.DriverName()
	if err != nil {
		return err
	}
	defer b.Close(context.Background())

	jobs := sqlxbroker.Table{
		Name:        "quickstart_jobs",
		LockedUntil: "locked_until", // the lease form; leave it out for the row-lock form
		ReadyAt:     "ready_at",     // failed rows are retried later
		DeadAt:      "dead_at",      // rows are kept here after their last attempt
		MaxAttempts: 5,
	}
	// Or b.TableDDL to print the statements for a migration tool.
	if err := b.CreateTable(ctx, jobs, [2]string{"email", "text"}); err != nil {
		return err
	}

	// Publish inside your own transaction: the jobs exist if and only if
	// the rest of the transaction commits (a transactional outbox).
	tx, err := db.BeginTxx(ctx, nil)
	if err != nil {
		return err
	}
	if err := b.Publish(ctx, tx, jobs, Job{Email: "a@example.com"}, Job{Email: "b@example.com"}); err != nil {
		tx.Rollback()
		return err
	}
	if err := tx.Commit(); err != nil {
		return err
	}

	fmt.Println("running; Ctrl-C to stop")
	sub, err := b.Subscribe(ctx, jobs, func(ctx context.Context, d *sqlxbroker.Delivery) error {
		var j Job
		if err := d.Scan(&j); err != nil {
			return err
		}
		// nil: the row is deleted. An error or a panic: the row is retried
		// after a delay, and kept dead after MaxAttempts.
		return send(ctx, j.Email)
	}, sqlxbroker.SubscribeParams{Concurrency: 10})
	if err != nil {
		return err
	}

	<-ctx.Done()
	// Stop claiming and wait for the handlers in work, at most 30 s; a row
	// whose handler is cut short goes back to the table, nothing is lost.
	stopCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := sub.Stop(stopCtx); err != nil {
		return err
	}
	fmt.Println("stopped")
	return nil
}

// send stands for the application's work.
func send(ctx context.Context, email string) error {
	fmt.Println("sent to", email)
	return nil
}

func open(driver, dsn string) (*sqlx.DB, error) {
	switch driver {
	case "postgres":
		return postgres.Open(dsn) // wake-ups the moment a publish commits
	case "sqlite":
		if dsn == "" {
			dir, err := os.MkdirTemp("", "sqlxbroker-quickstart-")
			if err != nil {
				return nil, err
			}
			dsn = filepath.Join(dir, "jobs.db")
		}
		return sqlite.Open(dsn)
	default:
		return sqlx.Open(driver, dsn)
	}
}
