package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"hash/fnv"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/dialects/sqlite"
)

type demoMsg struct {
	Account string `db:"account"`
	Grp     string `db:"grp"`
	Body    string `db:"body"`
}

type tally struct {
	mu        sync.Mutex
	attempts  map[int]int
	delivered int
	first     time.Time
	last      time.Time
}

const demoUsage = `usage: sqlxbroker demo [--driver NAME --dsn DSN] [flags]

Publishes --messages messages to three tables, one per way of claiming
them (the lease form; the advisory form with a key per account; the lease
form with FIFO groups), drains them with 32 handlers per table of which
--fail percent fail on each attempt, and prints the progress and a summary:
every message completed, or kept dead after its third attempt, none lost.

Without --driver it runs on an SQLite file in a new temporary directory
(or in --dir), with no set-up. With --driver postgres or mysql and --dsn it
runs on that database, in tables named demo_lease_jobs, demo_account_jobs
and demo_fifo_jobs, which it drops first and at the end.

flags:
`

func demo(args []string) error {
	fs := flag.NewFlagSet("demo", flag.ExitOnError)
	fs.Usage = func() { fmt.Fprint(os.Stderr, demoUsage); fs.PrintDefaults() }
	driver := fs.String("driver", "sqlite", "database/sql driver name: "+drivers())
	dsn := fs.String("dsn", "", "data source name; for sqlite a file path (default: demo.db in --dir)")
	n := fs.Int("messages", 12000, "messages to publish in all")
	failRate := fs.Int("fail", 20, "percent of deliveries whose handler fails")
	dir := fs.String("dir", "", "sqlite without --dsn: directory for the file (default: a new temporary directory)")
	_ = fs.Parse(args)
	if fs.NArg() > 0 {
		return fmt.Errorf("demo: unexpected argument %q (see sqlxbroker demo -h)", fs.Arg(0))
	}
	if *n < 3 || *failRate < 0 || *failRate > 100 {
		return errors.New("demo: --messages must be at least 3 and --fail between 0 and 100")
	}
	db, where, cleanup, err := demoDB(*driver, *dsn, *dir)
	if err != nil {
		return err
	}
	defer cleanup()
	defer db.Close()
	b, err := sqlxbroker.Open(db)
	if err != nil {
		return err
	}
	defer b.Close(context.Background())
	ctx := context.Background()
	common := func(t sqlxbroker.Table) sqlxbroker.Table {
		t.ReadyAt, t.DeadAt, t.MaxAttempts = "ready_at", "dead_at", 3
		return t
	}
	tables := []struct {
		t     sqlxbroker.Table
		share int // of n, in sixths
		about string
	}{
		{common(sqlxbroker.Table{Name: "demo_lease_jobs", LockedUntil: "locked_until", Lease: 10 * time.Second}), 4, "lease form"},
		{common(sqlxbroker.Table{Name: "demo_account_jobs", AdvisoryLock: "account-{account}"}), 1, "advisory form, key account-{account}"},
		{common(sqlxbroker.Table{Name: "demo_fifo_jobs", LockedUntil: "locked_until", Group: "grp"}), 1, "lease form, FIFO by grp"},
	}
	payload := [][2]string{{"account", "text"}, {"grp", "text"}, {"body", "text"}}
	fmt.Printf("sqlxbroker demo: %s\n", where)
	total := 0
	for _, tb := range tables {
		drop := "DROP TABLE IF EXISTS " + tb.t.Name
		if _, err := db.ExecContext(ctx, drop); err != nil {
			return fmt.Errorf("demo: %s: %w", drop, err)
		}
		defer db.Exec(drop)
	}
	for i, tb := range tables {
		if err := b.CreateTable(ctx, tb.t, payload...); err != nil {
			return err
		}
		count := *n * tb.share / 6
		if i == len(tables)-1 {
			count = *n - total
		}
		total += count
		msgs := make([]any, count)
		for j := range msgs {
			msgs[j] = demoMsg{Account: fmt.Sprint("acct", j%200), Grp: fmt.Sprint("g", j%40), Body: fmt.Sprint(j)}
		}
		tx, err := db.BeginTxx(ctx, nil)
		if err != nil {
			return err
		}
		if err := b.Publish(ctx, tx, tb.t, msgs...); err != nil {
			tx.Rollback()
			return err
		}
		if err := tx.Commit(); err != nil {
			return err
		}
		fmt.Printf("  published %5d to %-17s (%s)\n", count, tb.t.Name, tb.about)
	}

	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	tallies := make([]*tally, len(tables))
	subs := make([]*sqlxbroker.Subscription, len(tables))
	start := time.Now()
	for i, tb := range tables {
		tl := &tally{attempts: map[int]int{}}
		tallies[i] = tl
		h := func(ctx context.Context, d *sqlxbroker.Delivery) error {
			var m demoMsg
			if err := d.Scan(&m); err != nil {
				return err
			}
			tl.mu.Lock()
			tl.attempts[d.Attempt()]++
			tl.delivered++
			if tl.first.IsZero() {
				tl.first = time.Now()
			}
			tl.last = time.Now()
			tl.mu.Unlock()
			if fails(m.Body, d.Attempt(), *failRate) {
				return fmt.Errorf("message %s: simulated failure on attempt %d", m.Body, d.Attempt())
			}
			return nil
		}
		s, err := b.Subscribe(ctx, tb.t, h, sqlxbroker.SubscribeParams{
			Concurrency: 32, MinPollInterval: 2 * time.Millisecond, PollInterval: 100 * time.Millisecond,
			RetryDelay: func(int, error) time.Duration { return 50 * time.Millisecond }, Logger: log,
			FailureLevel: slog.LevelDebug, // the failures are the demo's own: counted below, not logged
		})
		if err != nil {
			return err
		}
		subs[i] = s
	}
	finished := func(i int) bool {
		st := subs[i].Stats()
		return st.Succeeded+st.Dead >= int64(countOf(tables[i].share, i, len(tables), *n))
	}
	deadline := time.Now().Add(50 * time.Second)
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		all := true
		var line []string
		for i := range tables {
			st := subs[i].Stats()
			line = append(line, fmt.Sprintf("%s %d done %d retried %d dead", tables[i].t.Name, st.Succeeded, st.Retried, st.Dead))
			all = all && finished(i)
		}
		fmt.Printf("  [%5.1fs] %s\n", time.Since(start).Seconds(), strings.Join(line, " | "))
		if all {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("demo: not drained after %v", time.Since(start).Round(time.Second))
		}
		<-tick.C
	}
	for _, s := range subs {
		if err := s.Stop(ctx); err != nil {
			return err
		}
	}
	fmt.Printf("\nsummary after %.1fs\n", time.Since(start).Seconds())
	fmt.Printf("%-17s %10s %9s %8s %5s %10s %12s  %s\n", "table", "deliveries", "completed", "retried", "dead", "left", "deliveries/s", "attempts histogram")
	for i, tb := range tables {
		st := subs[i].Stats()
		tl := tallies[i]
		var left, dead int
		_ = db.Get(&left, "SELECT COUNT(*) FROM "+tb.t.Name+" WHERE dead_at IS NULL")
		_ = db.Get(&dead, "SELECT COUNT(*) FROM "+tb.t.Name+" WHERE dead_at IS NOT NULL")
		var keys []int
		for k := range tl.attempts {
			keys = append(keys, k)
		}
		sort.Ints(keys)
		var hist []string
		for _, k := range keys {
			hist = append(hist, fmt.Sprintf("%d:%d", k, tl.attempts[k]))
		}
		rate := float64(tl.delivered) / tl.last.Sub(start).Seconds()
		fmt.Printf("%-17s %10d %9d %8d %5d %10d %12.0f  %s\n", tb.t.Name, st.Claimed, st.Succeeded, st.Retried, dead, left, rate, strings.Join(hist, " "))
		if left != 0 || int64(dead) != st.Dead || st.LeaseLost != 0 || st.CompleteErrors != 0 {
			return fmt.Errorf("demo: %s: %d rows left, %d dead rows for %d dead outcomes, %d leases lost, %d completion errors",
				tb.t.Name, left, dead, st.Dead, st.LeaseLost, st.CompleteErrors)
		}
	}
	fmt.Println("\nevery message was completed or kept dead after 3 attempts; none lost.")
	return nil
}

func countOf(share, i, tables, n int) int {
	if i < tables-1 {
		return n * share / 6
	}
	c := n
	for j := 0; j < tables-1; j++ {
		c -= n * []int{4, 1, 1}[j] / 6
	}
	return c
}

// fails decides, repeatably, which deliveries the demo handler fails.
func fails(body string, attempt, rate int) bool {
	h := fnv.New32a()
	fmt.Fprintf(h, "attempt %d of message %s", attempt, body)
	return int(h.Sum32()%100) < rate
}

// demoDB opens the demo's database: an SQLite file (in dir, or a new
// temporary directory removed by cleanup) unless driver and dsn name
// another.
func demoDB(driver, dsn, dir string) (db *sqlx.DB, where string, cleanup func(), err error) {
	cleanup = func() {}
	if driver != "sqlite" {
		if dsn == "" {
			return nil, "", nil, fmt.Errorf("demo: --driver %s needs --dsn", driver)
		}
		if _, err := sqlxbroker.Lookup(driver); err != nil {
			return nil, "", nil, fmt.Errorf("demo: --driver: %w", err)
		}
		db, err := sqlx.Open(driver, dsn)
		if err == nil {
			err = db.Ping()
		}
		if err != nil {
			return nil, "", nil, fmt.Errorf("demo: open %s: %w", driver, err)
		}
		return db, driver + " database", cleanup, nil
	}
	path := dsn
	if path == "" {
		if dir == "" {
			d, err := os.MkdirTemp("", "sqlxbroker-demo-")
			if err != nil {
				return nil, "", nil, err
			}
			cleanup = func() { os.RemoveAll(d) }
			dir = d
		}
		path = filepath.Join(dir, "demo.db")
	}
	db, err = sqlite.Open(path)
	if err != nil {
		cleanup()
		return nil, "", nil, fmt.Errorf("demo: open %s: %w", path, err)
	}
	return db, "SQLite file " + path, cleanup, nil
}
