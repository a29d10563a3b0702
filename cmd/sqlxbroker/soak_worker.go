package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/dialects/postgres"
)

// soakMsg is a soak message's payload: msg names it everywhere (ledgers
// included), account is the advisory key's column, poison marks a message
// whose every run fails.
type soakMsg struct {
	Msg     string `db:"msg"`
	Account string `db:"account"`
	Poison  int    `db:"poison"`
}

// soakWorker is worker mode: publish to every table named in the
// configuration (each publish commits with its ledger rows), consume the
// tables it subscribes to, print stats lines on stdout. SIGUSR1 stops
// publishing; SIGTERM stops gracefully; the harness's SIGKILL stops it
// anywhere.
func soakWorker() error {
	var cfg workerConfig
	if err := json.Unmarshal([]byte(os.Getenv(workerEnv)), &cfg); err != nil {
		return fmt.Errorf("soak worker: bad %s: %w", workerEnv, err)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})).With("worker", cfg.Index, "pid", os.Getpid())
	open := openSoakDB
	if cfg.WakeOnly && cfg.Driver == "postgres" {
		open = func(_, dsn string) (*sqlx.DB, error) {
			db, err := postgres.Open(dsn)
			if err == nil {
				db.SetMaxIdleConns(64)
			}
			return db, err
		}
	}
	db, err := open(cfg.Driver, cfg.DSN)
	if err != nil {
		return err
	}
	defer db.Close()
	b, err := sqlxbroker.Open(db)
	if err != nil {
		return err
	}
	w := &soakWorkerState{cfg: cfg, db: db, b: b, log: log, pid: os.Getpid(),
		subs: map[string]*sqlxbroker.Subscription{}, published: map[string]*atomic.Int64{}}
	incarnation := fmt.Sprintf("%d-%d-%x", cfg.Index, os.Getpid(), time.Now().UnixNano()&0xffffffff)

	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGUSR1, syscall.SIGTERM, syscall.SIGINT)
	stopPub := make(chan struct{})
	stopAll := make(chan struct{})
	var stopPubOnce sync.Once
	var pubs, starts sync.WaitGroup
	for _, name := range cfg.Publish {
		f, _ := variantNamed(name)
		w.published[name] = &atomic.Int64{}
		pubs.Add(1)
		go func() { defer pubs.Done(); w.publisher(f, incarnation, stopPub) }()
	}
	for _, name := range cfg.Subscribe {
		f, _ := variantNamed(name)
		starts.Add(1)
		go func() { defer starts.Done(); w.subscribe(f, stopAll) }()
	}
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
			w.printStats(false)
			continue
		case sig := <-sigs:
			if sig == syscall.SIGUSR1 {
				stopPubOnce.Do(func() { close(stopPub) })
				log.Info("soak worker: publishing stopped")
				continue
			}
		}
		break
	}
	log.Info("soak worker: stopping")
	stopPubOnce.Do(func() { close(stopPub) })
	close(stopAll)
	pubs.Wait()
	starts.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var errs []error
	w.mu.Lock()
	subs := w.subs
	w.mu.Unlock()
	for name, s := range subs {
		if err := s.Stop(ctx); err != nil {
			errs = append(errs, fmt.Errorf("stop %s: %w", name, err))
		}
	}
	w.printStats(true)
	return errors.Join(errs...)
}

type soakWorkerState struct {
	cfg workerConfig
	db  *sqlx.DB
	b   *sqlxbroker.Broker
	log *slog.Logger
	pid int

	mu        sync.Mutex
	subs      map[string]*sqlxbroker.Subscription
	published map[string]*atomic.Int64
}

func (w *soakWorkerState) table(f soakVariant) sqlxbroker.Table {
	return soakTable(w.cfg.Prefix, f, w.cfg.Lease, w.cfg.MaxAttempts)
}

func (w *soakWorkerState) printStats(final bool) {
	st := workerStats{W: w.cfg.Index, Pid: w.pid, Subscribed: map[string]bool{}, Forms: map[string]sqlxbroker.Stats{},
		Published: map[string]int64{}, Final: final}
	w.mu.Lock()
	for name, s := range w.subs {
		st.Subscribed[name] = true
		st.Forms[name] = s.Stats()
	}
	w.mu.Unlock()
	for name, n := range w.published {
		st.Published[name] = n.Load()
	}
	line, _ := json.Marshal(st)
	fmt.Println(string(line))
}

// publisher publishes batches of 1 to 4 messages at about cfg.Rate
// messages per second, each batch in one transaction with its rows in the
// published ledger: only committed publishes count.
func (w *soakWorkerState) publisher(f soakVariant, incarnation string, stop <-chan struct{}) {
	t := w.table(f)
	pub, _, _, _ := ledgers(w.cfg.Prefix)
	seq := 0
	for {
		n := 1 + rand.IntN(4)
		wait := time.Duration(rand.ExpFloat64() * float64(n) / w.cfg.Rate * float64(time.Second))
		select {
		case <-stop:
			return
		case <-time.After(wait):
		}
		msgs := make([]any, n)
		var args []any
		for i := range msgs {
			seq++
			m := soakMsg{Msg: fmt.Sprintf("%s-%s-%d", f, incarnation, seq), Account: fmt.Sprint("a", rand.IntN(40))}
			if rand.Float64()*100 < w.cfg.PoisonPct {
				m.Poison = 1
			}
			msgs[i] = m
			args = append(args, m.Msg, f.String())
		}
		err := func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			tx, err := w.db.BeginTxx(ctx, nil)
			if err != nil {
				return err
			}
			defer tx.Rollback() //nolint:errcheck // no-op after Commit
			if err := w.b.Publish(ctx, tx, t, msgs...); err != nil {
				return err
			}
			q := "INSERT INTO " + pub + " (msg, form) VALUES (?, ?)" + strings.Repeat(", (?, ?)", n-1)
			if _, err := tx.ExecContext(ctx, tx.Rebind(q), args...); err != nil {
				return err
			}
			return tx.Commit()
		}()
		if err != nil {
			w.log.Warn("soak worker: publish failed", "form", f.String(), "err", err)
			time.Sleep(200 * time.Millisecond)
			continue
		}
		w.published[f.String()].Add(int64(n))
	}
}

// subscribe subscribes to f's table, retrying while the database refuses
// (a server restarting), until it succeeds or stop closes.
func (w *soakWorkerState) subscribe(f soakVariant, stop <-chan struct{}) {
	t := w.table(f)
	p := sqlxbroker.SubscribeParams{
		Concurrency:     w.cfg.Concurrency,
		PollInterval:    w.pollInterval(),
		MinPollInterval: 10 * time.Millisecond,
		RetryDelay:      func(attempt int, _ error) time.Duration { return time.Duration(attempt) * 100 * time.Millisecond },
		OnOutcome:       w.onOutcome(f),
		Logger:          w.log.With("form", f.String()),
	}
	for {
		s, err := w.b.Subscribe(context.Background(), t, w.handler(f), p)
		if err == nil {
			w.mu.Lock()
			w.subs[f.String()] = s
			w.mu.Unlock()
			w.log.Info("soak worker: subscribed", "form", f.String())
			return
		}
		w.log.Warn("soak worker: subscribe failed, retrying", "form", f.String(), "err", err)
		select {
		case <-stop:
			return
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func (w *soakWorkerState) pollInterval() time.Duration {
	if w.cfg.WakeOnly {
		return time.Hour
	}
	return 500 * time.Millisecond
}

// handler fails cfg.FailPct of its runs (and every run of a poison
// message) and is slow in cfg.SlowPct of them, half of those ignoring its
// context. Every run is recorded in the runs ledger (ok = 1 only for a run
// about to return nil: the record is written before the handler returns).
// In the row-lock form a successful run first writes its effect through the
// delivery's transaction, which commits with the completion or not at all.
func (w *soakWorkerState) handler(f soakVariant) sqlxbroker.Handler {
	_, runs, effects, _ := ledgers(w.cfg.Prefix)
	record := func(ctx context.Context, m *soakMsg, attempt, ok int) error {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Second)
		defer cancel()
		_, err := w.db.ExecContext(ctx, w.db.Rebind("INSERT INTO "+runs+" (form, msg, worker, pid, attempt, ok) VALUES (?, ?, ?, ?, ?, ?)"),
			f.String(), m.Msg, w.cfg.Index, w.pid, attempt, ok)
		return err
	}
	return func(ctx context.Context, d *sqlxbroker.Delivery) error {
		var m soakMsg
		if err := d.Scan(&m); err != nil {
			return err
		}
		fail := m.Poison == 1 || rand.Float64()*100 < w.cfg.FailPct
		if rand.Float64()*100 < w.cfg.SlowPct {
			dur := time.Duration((0.2 + 1.4*rand.Float64()) * float64(w.cfg.Lease))
			if rand.IntN(2) == 0 {
				time.Sleep(dur) // a handler that does not watch its context
			} else {
				select {
				case <-time.After(dur):
				case <-ctx.Done():
					_ = record(ctx, &m, d.Attempt(), 0)
					return fmt.Errorf("soak: %s: %w", m.Msg, ctx.Err())
				}
			}
		} else {
			time.Sleep(time.Duration(2+rand.IntN(30)) * time.Millisecond)
		}
		if fail {
			_ = record(ctx, &m, d.Attempt(), 0)
			return fmt.Errorf("soak: %s: simulated failure on attempt %d", m.Msg, d.Attempt())
		}
		if f.Form == sqlxbroker.RowLock {
			tx, err := d.Tx()
			if err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, tx.Rebind("INSERT INTO "+effects+" (form, msg, worker, pid) VALUES (?, ?, ?, ?)"),
				f.String(), m.Msg, w.cfg.Index, w.pid); err != nil {
				return fmt.Errorf("soak: %s: effect: %w", m.Msg, err)
			}
		}
		if err := record(ctx, &m, d.Attempt(), 1); err != nil {
			return fmt.Errorf("soak: %s: record run: %w", m.Msg, err)
		}
		return nil
	}
}

// onOutcome records every finishing outcome (succeeded, dead) the library
// reports as recorded (nil error) in the outcomes ledger; a message
// recorded twice was finished twice. The record is retried for a while: a
// worker killed or a database away before it lands leaves the completion
// unrecorded (counted, not a violation). Each record carries a rec unique
// to the call, so a retry after a lost commit reply is not a second outcome.
func (w *soakWorkerState) onOutcome(f soakVariant) func(*sqlxbroker.Delivery, sqlxbroker.Outcome, error) {
	_, _, _, outcomes := ledgers(w.cfg.Prefix)
	q := w.db.Rebind("INSERT INTO " + outcomes + " (form, msg, kind, rec, worker, pid) VALUES (?, ?, ?, ?, ?, ?)")
	var recs atomic.Int64
	return func(d *sqlxbroker.Delivery, o sqlxbroker.Outcome, err error) {
		if err != nil || (o.Kind != sqlxbroker.Succeeded && o.Kind != sqlxbroker.Dead) {
			return
		}
		var m soakMsg
		if d.Scan(&m) != nil {
			return
		}
		rec := fmt.Sprintf("%d-%d-%s-%d", w.cfg.Index, w.pid, f, recs.Add(1))
		deadline := time.Now().Add(30 * time.Second)
		for time.Now().Before(deadline) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_, err := w.db.ExecContext(ctx, q, f.String(), m.Msg, o.Kind.String(), rec, w.cfg.Index, w.pid)
			cancel()
			if err == nil {
				return
			}
			time.Sleep(200 * time.Millisecond)
		}
		w.log.Warn("soak worker: outcome not recorded", "form", f.String(), "msg", m.Msg, "kind", o.Kind.String())
	}
}
