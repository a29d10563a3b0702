package main

// The soak test with faults: several worker processes (this binary again,
// in worker mode: soak_worker.go) publish to and consume from one table per
// claim form on one database (done rows kept, so completions stay visible;
// and a lease table that deletes them, whose completions take the batched,
// fenced delete path), while the harness below kills workers with
// SIGKILL, terminates their database sessions from the server side and
// restarts the server once. Then it stops the faults, checks that every
// live worker still completes work in every form (the calm phase), lets the
// workers drain the tables, stops them, and audits the ledgers
// (soak_audit.go).
//
// Phases and what each proves:
//
//  1. faults (--duration): worker 0 is the witness and is never killed; the
//     other workers are killed at random (mean --kill-every) and restarted
//     at once. Where the dialect offers wake-ups (PostgreSQL), the witness
//     publishes nothing and polls once an hour, so it keeps claiming only
//     while its wake-ups work (a pq.Listener through postgres.Open; the
//     other workers' pools read notifications on a pooled connection).
//     Worker sessions are terminated at random (mean --session-kill-every): PostgreSQL pg_terminate_backend on backends
//     whose application_name names this run's workers; MySQL/MariaDB KILL
//     CONNECTION of the connections of the soak's database and user, the
//     harness's own connection excluded (it holds only one during the run).
//     Use a database of its own for the soak: every other connection to it
//     by the same user counts as a worker's. --restart-cmd runs once, at
//     --restart-at of the duration.
//  2. calm (at most --calm): publishing goes on without faults until every
//     live worker has recorded an outcome in every form it subscribes to:
//     subscriptions that lived through the faults (the witness's lived
//     through every session termination and the restart) must have resumed.
//  3. drain (at most --drain-timeout): publishing stops (SIGUSR1), and the
//     same workers finish every row; then SIGTERM stops them gracefully,
//     and each must exit cleanly.
//  4. audit: see soak_audit.go.
//
// SQLite: its advisory keys live in one process per database file, and a
// second process is refused with sqlxbroker.ErrAdvisoryConflict by design, so
// exactly one worker (worker 1 when there are two or more, so that it is
// killed too) subscribes to the advisory table; every worker publishes to
// it. SQLite has no server: no session terminations, no restart.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"
	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/conformance"
	"github.com/sqlxbroker/sqlxbroker/core"
	"github.com/sqlxbroker/sqlxbroker/dialects/sqlite"
	"github.com/sqlxbroker/sqlxbroker/forms"
)

// soakConfig is one soak run.
type soakConfig struct {
	Driver, DSN string
	Duration    time.Duration // the fault phase
	Workers     int
	Forms       []sqlxbroker.Form // the forms soaked; empty: every form the dialect offers
	Concurrency int               // per worker and form
	Rate        float64           // messages per second, per worker and form
	Lease       time.Duration
	MaxAttempts int
	FailPct     float64 // handler runs that fail
	SlowPct     float64 // handler runs that take 0.2 to 1.6 leases
	PoisonPct   float64 // messages whose every run fails (they end dead)

	KillEvery        time.Duration // mean time between worker kills; 0: none
	SessionKillEvery time.Duration // mean time between session terminations; 0: none
	RestartCmd       string        // shell command restarting the server; "": none
	RestartAt        float64       // fraction of Duration at which it runs
	NetFaultEvery    time.Duration // mean time between network faults (a stall or a cut); 0: none

	Calm         time.Duration // longest calm phase
	DrainTimeout time.Duration
	Prefix       string // table name prefix
	Keep         bool   // keep the tables after the run
	LogDir       string // worker logs; "": a new temporary directory
	RunID        string // names this run's worker sessions; "": random
	WorkerArgs   []string
	Out          io.Writer // progress
}

func (c *soakConfig) defaults() error {
	if c.Driver == "" || c.DSN == "" {
		return errors.New("soak: --driver and --dsn are required")
	}
	if c.Workers < 1 || c.Concurrency < 1 || c.Rate <= 0 || c.Duration <= 0 {
		return errors.New("soak: --workers, --concurrency, --rate and --duration must be positive")
	}
	if c.Lease < time.Second || c.Lease%time.Second != 0 {
		return errors.New("soak: --lease must be whole seconds")
	}
	if c.Prefix == "" {
		c.Prefix = "soak"
	}
	if err := core.CheckIdent(c.Prefix); err != nil {
		return fmt.Errorf("soak: --prefix: %w", err)
	}
	if c.RunID == "" {
		c.RunID = fmt.Sprintf("%x", rand.Uint32())
	}
	if c.Out == nil {
		c.Out = io.Discard
	}
	if c.Driver == "sqlite" && !strings.HasPrefix(c.DSN, "file:") {
		c.DSN = sqlite.DSN(c.DSN)
	}
	return nil
}

func soakCmd(args []string) error {
	fs := flag.NewFlagSet("soak", flag.ExitOnError)
	c := soakConfig{WorkerArgs: []string{"soak-worker"}, Out: os.Stderr}
	fs.StringVar(&c.Driver, "driver", "", "database/sql driver name: "+drivers())
	fs.StringVar(&c.DSN, "dsn", "", "data source name (sqlite: a file path); use a database of the soak's own")
	fs.DurationVar(&c.Duration, "duration", 5*time.Minute, "how long faults run while workers publish and consume")
	fs.IntVar(&c.Workers, "workers", 3, "worker processes")
	fs.IntVar(&c.Concurrency, "concurrency", 8, "handlers per worker and form")
	fs.Float64Var(&c.Rate, "rate", 5, "messages published per second, per worker and form")
	fs.DurationVar(&c.Lease, "lease", 3*time.Second, "lease of the lease table (whole seconds)")
	fs.IntVar(&c.MaxAttempts, "max-attempts", 4, "deliveries a row gets before it is kept dead")
	fs.Float64Var(&c.FailPct, "fail", 10, "percent of handler runs that fail")
	fs.Float64Var(&c.SlowPct, "slow", 10, "percent of handler runs that take 0.2 to 1.6 leases (half of them ignore their context)")
	fs.Float64Var(&c.PoisonPct, "poison", 1, "percent of messages that fail every run")
	fs.DurationVar(&c.KillEvery, "kill-every", 10*time.Second, "mean time between SIGKILLs of a worker (0: none)")
	fs.DurationVar(&c.SessionKillEvery, "session-kill-every", 20*time.Second, "mean time between terminations of worker sessions from the server (0: none)")
	fs.StringVar(&c.RestartCmd, "restart-cmd", "", "shell command that restarts the database server, run once mid-run")
	fs.Float64Var(&c.RestartAt, "restart-at", 0.5, "when the restart runs, as a fraction of --duration")
	fs.DurationVar(&c.NetFaultEvery, "net-fault-every", 15*time.Second, "mean time between network faults on the workers' connections, through a loopback proxy: a stall of 0.25 to 1.5 leases or a cut of every connection (0: none; not for sqlite)")
	fs.DurationVar(&c.Calm, "calm", 60*time.Second, "longest wait, after the faults, for every worker to record work in every form")
	fs.DurationVar(&c.DrainTimeout, "drain-timeout", 3*time.Minute, "longest wait for the tables to drain")
	fs.StringVar(&c.Prefix, "prefix", "soak", "prefix of the soak's table names (they are dropped and created)")
	fs.BoolVar(&c.Keep, "keep", true, "keep the tables after the run (for inspection)")
	fs.StringVar(&c.LogDir, "log-dir", "", "directory for worker logs (default: a new temporary directory)")
	formList := fs.String("forms", "", "claim forms to soak, comma-separated: row-lock, lease, advisory (default: every form the dialect offers)")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	jsonOut := fs.String("json-out", "", "also write the report as JSON to this file")
	_ = fs.Parse(args)
	var err error
	if c.Forms, err = sqlxbroker.ParseForms(*formList); err != nil {
		return fmt.Errorf("soak: --forms: %w", err)
	}
	if err := c.defaults(); err != nil {
		return err
	}
	rep, err := runSoak(context.Background(), c)
	if err != nil {
		return err
	}
	js, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	if *jsonOut != "" {
		if err := os.WriteFile(*jsonOut, append(js, '\n'), 0o644); err != nil {
			return err
		}
	}
	if *asJSON {
		fmt.Println(string(js))
	} else {
		rep.print(os.Stdout)
	}
	if n := len(rep.Violations); n > 0 {
		return fmt.Errorf("soak: %d violation(s)", n)
	}
	return nil
}

// workerEnv carries a worker's configuration (JSON workerConfig).
const workerEnv = "SQLXBROKER_SOAK_WORKER"

// workerConfig is what one worker process does.
type workerConfig struct {
	Index       int
	Driver, DSN string
	Prefix      string
	Subscribe   []string // variants whose table this worker consumes
	Publish     []string // variants whose table this worker publishes to
	Concurrency int
	Rate        float64
	Lease       time.Duration
	MaxAttempts int
	FailPct     float64
	SlowPct     float64
	PoisonPct   float64
	// WakeOnly: subscriptions poll once an hour, so they claim when woken
	// (the dialect's Waker, their own completions); a PostgreSQL pool is
	// opened with postgres.Open, whose wake-ups come through a pq.Listener.
	WakeOnly bool
}

// soakVariant is one table of the soak: a claim form, and whether done rows
// are kept (DoneAt, so completions stay visible) or deleted (the default in
// the library, whose lease completions take another path: batched,
// fenced deletes).
type soakVariant struct {
	Name   string // names the table and its messages in the ledgers
	Form   sqlxbroker.Form
	Delete bool
}

func (v soakVariant) String() string { return v.Name }

// soakVariants are the tables for forms: one per form keeping done rows,
// and for the lease form one that deletes them.
func soakVariants(forms []sqlxbroker.Form) []soakVariant {
	var out []soakVariant
	for _, f := range forms {
		out = append(out, soakVariant{Name: f.String(), Form: f})
	}
	for _, f := range forms {
		if f == sqlxbroker.Lease {
			out = append(out, soakVariant{Name: "lease-delete", Form: f, Delete: true})
		}
	}
	return out
}

// variantNamed finds a variant by name among every form's.
func variantNamed(name string) (soakVariant, bool) {
	for _, v := range soakVariants(core.Forms) {
		if v.Name == name {
			return v, true
		}
	}
	return soakVariant{}, false
}

// soakTable is the description of v's table: failed rows retry (ReadyAt),
// rows failing MaxAttempts times are kept dead, done rows are kept (DoneAt)
// unless v deletes them.
func soakTable(prefix string, v soakVariant, lease time.Duration, maxAttempts int) sqlxbroker.Table {
	t := sqlxbroker.Table{Name: prefix + "_" + strings.NewReplacer("-", "").Replace(v.Name),
		ReadyAt: "ready_at", DeadAt: "dead_at", MaxAttempts: maxAttempts}
	if !v.Delete {
		t.DoneAt = "done_at"
	}
	switch v.Form {
	case sqlxbroker.Lease:
		t.LockedUntil, t.Lease = "locked_until", lease
	case sqlxbroker.Advisory:
		t.AdvisoryLock = "acct-{account}"
	}
	return t
}

// soakPayload are the message columns beside the broker's.
var soakPayload = [][2]string{{"msg", "text"}, {"account", "text"}, {"poison", "int"}}

// ledgers are the soak's own tables: committed publishes, handler runs,
// handler writes through the row-lock delivery transaction, and recorded
// finishing outcomes.
func ledgers(prefix string) (published, runs, effects, outcomes string) {
	return prefix + "_published", prefix + "_runs", prefix + "_effects", prefix + "_outcomes"
}

// ledgerDDL creates the ledgers; text is the key-friendly text type. An
// outcome's rec names the OnOutcome call that wrote it, so a record written
// twice by a retried insert (a commit whose reply was lost) counts once.
func ledgerDDL(driver, prefix string) []string {
	text := "TEXT"
	if driver == "mysql" {
		text = "VARCHAR(100)"
	}
	pub, runs, eff, out := ledgers(prefix)
	return []string{
		"CREATE TABLE " + pub + " (msg " + text + " PRIMARY KEY, form " + text + " NOT NULL)",
		"CREATE TABLE " + runs + " (form " + text + " NOT NULL, msg " + text + " NOT NULL, worker INT, pid INT, attempt INT, ok INT NOT NULL)",
		"CREATE TABLE " + eff + " (form " + text + " NOT NULL, msg " + text + " NOT NULL, worker INT, pid INT)",
		"CREATE TABLE " + out + " (form " + text + " NOT NULL, msg " + text + " NOT NULL, kind " + text + " NOT NULL, rec " + text + " NOT NULL, worker INT, pid INT)",
	}
}

// openSoakDB opens a pool; SQLite pools keep many idle connections, as
// advisory deliveries each hold one.
func openSoakDB(driver, dsn string) (*sqlx.DB, error) {
	db, err := sqlx.Open(driver, dsn)
	if err != nil {
		return nil, err
	}
	db.SetMaxIdleConns(64)
	return db, nil
}

// sessionDSN tags dsn so the server can tell whose sessions they are:
// PostgreSQL's application_name. Other drivers' DSNs are returned as they
// are (MySQL sessions are told apart by database; SQLite has none).
func sessionDSN(driver, dsn, name string) string {
	if driver != "postgres" {
		return dsn
	}
	if u, err := url.Parse(dsn); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		q := u.Query()
		q.Set("application_name", name)
		u.RawQuery = q.Encode()
		return u.String()
	}
	return dsn + " application_name=" + name
}

// sessionKiller terminates worker sessions from the server side; nil for a
// database without server sessions. It runs on the harness's one-connection
// pool and never terminates that connection.
type sessionKiller func(ctx context.Context, db *sqlx.DB, pick func([]int64) []int64) (int, error)

func killerFor(driver, runID string) sessionKiller {
	terminate := func(list, kill string, args ...any) sessionKiller {
		return func(ctx context.Context, db *sqlx.DB, pick func([]int64) []int64) (int, error) {
			var ids []int64
			if err := db.SelectContext(ctx, &ids, list, args...); err != nil {
				return 0, err
			}
			return conformance.KillSessions(ctx, db, kill, pick(ids))
		}
	}
	switch driver {
	case "postgres":
		return terminate(`SELECT pid FROM pg_stat_activity WHERE datname = current_database()
AND application_name LIKE $1 AND pid <> pg_backend_pid()`, "SELECT pg_terminate_backend(%d)", workerAppName(runID, -1)+"%")
	case "mysql":
		return terminate(`SELECT ID FROM information_schema.PROCESSLIST WHERE DB = DATABASE()
AND USER = SUBSTRING_INDEX(CURRENT_USER(), '@', 1) AND ID <> CONNECTION_ID()`, "KILL CONNECTION %d")
	}
	return nil
}

// workerAppName names worker i's sessions (i < 0: the common prefix).
func workerAppName(runID string, i int) string {
	if i < 0 {
		return "sqlxbroker-soak-" + runID + "-w"
	}
	return fmt.Sprintf("sqlxbroker-soak-%s-w%d", runID, i)
}

// workerStats is the line a worker prints on stdout every half second.
type workerStats struct {
	W          int                         `json:"w"`
	Pid        int                         `json:"pid"`
	Subscribed map[string]bool             `json:"subscribed"`
	Forms      map[string]sqlxbroker.Stats `json:"forms"`
	Published  map[string]int64            `json:"published"`
	Final      bool                        `json:"final,omitempty"`
}

// worker is one worker slot; its process is replaced when killed.
type worker struct {
	idx  int
	cfg  workerConfig
	args []string
	logf *os.File

	mu          sync.Mutex
	cmd         *exec.Cmd
	exited      chan struct{}
	exitErr     error
	stats       workerStats
	statsAt     time.Time
	killed      bool // the harness killed the current process
	incarnation int
}

func (w *worker) start() error {
	spec, _ := json.Marshal(w.cfg)
	cmd := exec.Command(os.Args[0], w.args...)
	cmd.Env = append(os.Environ(), workerEnv+"="+string(spec))
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	w.mu.Lock()
	w.incarnation++
	fmt.Fprintf(w.logf, "==== worker %d, incarnation %d, %s\n", w.idx, w.incarnation, time.Now().Format(time.RFC3339Nano))
	w.mu.Unlock()
	cmd.Stderr = w.logf
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start worker %d: %w", w.idx, err)
	}
	exited := make(chan struct{})
	w.mu.Lock()
	w.cmd, w.exited, w.killed, w.exitErr = cmd, exited, false, nil
	w.stats, w.statsAt = workerStats{}, time.Time{}
	w.mu.Unlock()
	read := make(chan struct{})
	go func() {
		defer close(read)
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			var st workerStats
			if json.Unmarshal(sc.Bytes(), &st) == nil {
				w.mu.Lock()
				if w.cmd == cmd {
					w.stats, w.statsAt = st, time.Now()
				}
				w.mu.Unlock()
			}
		}
	}()
	go func() {
		<-read
		err := cmd.Wait()
		w.mu.Lock()
		w.exitErr = err
		w.mu.Unlock()
		close(exited)
	}()
	return nil
}

// signal sends sig to the current process.
func (w *worker) signal(sig os.Signal) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.cmd != nil && w.cmd.Process != nil {
		_ = w.cmd.Process.Signal(sig)
	}
}

// kill SIGKILLs the current process and waits for it.
func (w *worker) kill() {
	w.mu.Lock()
	w.killed = true
	exited := w.exited
	w.mu.Unlock()
	w.signal(syscall.SIGKILL)
	<-exited
}

func (w *worker) snapshot() (workerStats, time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.stats, w.statsAt
}

// soakFaults counts the faults injected.
type soakFaults struct {
	Kills          int      `json:"worker_kills"`
	SessionEvents  int      `json:"session_termination_events"`
	SessionsKilled int      `json:"sessions_terminated"`
	Restarts       int      `json:"server_restarts"`
	NetStalls      int      `json:"network_stalls"`
	NetCuts        int      `json:"network_cuts"`
	ConnsCut       int      `json:"connections_cut"`
	RestartTook    string   `json:"server_restart_took,omitempty"`
	Crashes        []string `json:"unexpected_worker_exits,omitempty"`
}

// runSoak runs the phases and returns the audit. An error means the soak
// could not run; violations are in the report.
func runSoak(ctx context.Context, c soakConfig) (*soakReport, error) {
	if err := c.defaults(); err != nil {
		return nil, err
	}
	started := time.Now()
	logf := func(format string, args ...any) {
		fmt.Fprintf(c.Out, "soak [%6.1fs] %s\n", time.Since(started).Seconds(), fmt.Sprintf(format, args...))
	}
	if c.LogDir == "" {
		d, err := os.MkdirTemp("", "sqlxbroker-soak-")
		if err != nil {
			return nil, err
		}
		c.LogDir = d
	} else if err := os.MkdirAll(c.LogDir, 0o755); err != nil {
		return nil, err
	}

	// Set-up on a pool that is closed before the faults start.
	setup, err := openSoakDB(c.Driver, sessionDSN(c.Driver, c.DSN, "sqlxbroker-soak-"+c.RunID+"-setup"))
	if err != nil {
		return nil, err
	}
	b, err := sqlxbroker.Open(setup)
	if err != nil {
		setup.Close()
		return nil, err
	}
	offered := core.FormsOf(b.Dialect())
	if len(c.Forms) > 0 {
		var missing []string
		for _, f := range c.Forms {
			if !slices.Contains(offered, f) {
				missing = append(missing, f.String())
			}
		}
		if len(missing) > 0 {
			setup.Close()
			return nil, fmt.Errorf("soak: --forms: the %s dialect offers no %s form (it offers %v)", c.Driver, strings.Join(missing, " or "), offered)
		}
		offered = slices.DeleteFunc(slices.Clone(offered), func(f sqlxbroker.Form) bool { return !slices.Contains(c.Forms, f) })
	}
	forms := soakVariants(offered)
	caps := core.CapabilitiesOf(b.Dialect())
	if err := checkSoakConnections(ctx, setup, c, forms); err != nil {
		setup.Close()
		return nil, err
	}
	if err := createSoakTables(ctx, b, c, forms); err != nil {
		setup.Close()
		return nil, err
	}
	var server string
	_ = setup.QueryRowContext(ctx, serverVersionQuery(c.Driver)).Scan(&server)
	setup.Close()

	// Workers reach the server through the faulty network, if any.
	workerBase := c.DSN
	var proxy *soakProxy
	if c.NetFaultEvery > 0 && c.Driver != "sqlite" {
		_, upstream, err := proxyDSN(c.Driver, c.DSN, "")
		if err != nil {
			return nil, err
		}
		if proxy, err = startSoakProxy(upstream); err != nil {
			return nil, err
		}
		defer proxy.close()
		workerBase, _, _ = proxyDSN(c.Driver, c.DSN, proxy.addr())
	}

	names := make([]string, len(forms))
	for i, f := range forms {
		names[i] = f.String()
	}
	workers := make([]*worker, c.Workers)
	for i := range workers {
		sub := slices.Clone(names)
		if c.Driver == "sqlite" {
			// SQLite keeps advisory keys in the process: one process per
			// database file may hold them (others get ErrAdvisoryConflict).
			advisoryWorker := min(1, c.Workers-1)
			if i != advisoryWorker {
				sub = slices.DeleteFunc(sub, func(s string) bool { v, _ := variantNamed(s); return v.Form == sqlxbroker.Advisory })
			}
		}
		lf, err := os.OpenFile(filepath.Join(c.LogDir, fmt.Sprintf("worker-%d.log", i)), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return nil, err
		}
		defer lf.Close()
		pub, wakeOnly := names, false
		if i == 0 && caps.Waker != nil && c.Workers > 1 {
			// The witness relies on wake-ups: it publishes nothing (no
			// in-process wake-up) and polls once an hour, so it claims
			// after the restart only if its listener came back.
			pub, wakeOnly = nil, true
		}
		workers[i] = &worker{idx: i, args: c.WorkerArgs, logf: lf, cfg: workerConfig{
			Index: i, Driver: c.Driver, DSN: sessionDSN(c.Driver, workerBase, workerAppName(c.RunID, i)), Prefix: c.Prefix,
			Subscribe: sub, Publish: pub, Concurrency: c.Concurrency, Rate: c.Rate, Lease: c.Lease,
			MaxAttempts: c.MaxAttempts, FailPct: c.FailPct, SlowPct: c.SlowPct, PoisonPct: c.PoisonPct,
			WakeOnly: wakeOnly,
		}}
	}
	// The harness's one connection during the run: it never terminates it.
	mon, err := openSoakDB(c.Driver, sessionDSN(c.Driver, c.DSN, "sqlxbroker-soak-"+c.RunID+"-harness"))
	if err != nil {
		return nil, err
	}
	mon.SetMaxOpenConns(1)
	defer mon.Close()
	defer func() {
		for _, w := range workers {
			w.mu.Lock()
			cmd, exited := w.cmd, w.exited
			w.mu.Unlock()
			if cmd != nil {
				select {
				case <-exited:
				default:
					w.kill()
				}
			}
		}
	}()

	rep := &soakReport{Driver: c.Driver, Server: server, Workers: c.Workers, Concurrency: c.Concurrency,
		Duration: c.Duration.String(), LogDir: c.LogDir}
	var (
		mu     sync.Mutex
		faults soakFaults
		viol   []string
	)
	violation := func(format string, args ...any) {
		mu.Lock()
		viol = append(viol, fmt.Sprintf(format, args...))
		mu.Unlock()
	}
	logf("%s %s: %d workers x concurrency %d, forms %v, faults for %v; logs in %s", c.Driver, server, c.Workers, c.Concurrency, names, c.Duration, c.LogDir)
	for _, w := range workers {
		if err := w.start(); err != nil {
			return nil, err
		}
	}

	// Faults.
	faultCtx, stopFaults := context.WithTimeout(ctx, c.Duration)
	defer stopFaults()
	var wg sync.WaitGroup
	every := func(mean time.Duration, fn func()) {
		if mean <= 0 {
			return
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				d := time.Duration((0.25 + 1.5*rand.Float64()) * float64(mean))
				select {
				case <-faultCtx.Done():
					return
				case <-time.After(d):
				}
				fn()
			}
		}()
	}
	if c.Workers > 1 {
		every(c.KillEvery, func() {
			w := workers[1+rand.IntN(c.Workers-1)] // never worker 0, the witness
			w.kill()
			mu.Lock()
			faults.Kills++
			mu.Unlock()
			if err := w.start(); err != nil {
				violation("restart worker %d: %v", w.idx, err)
			}
		})
	}
	if kill := killerFor(c.Driver, c.RunID); kill != nil {
		every(c.SessionKillEvery, func() {
			kctx, cancel := context.WithTimeout(faultCtx, 10*time.Second)
			defer cancel()
			n, err := kill(kctx, mon, func(ids []int64) []int64 {
				rand.Shuffle(len(ids), func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })
				return ids[:(len(ids)+1)/2]
			})
			if err != nil {
				logf("session termination failed: %v", err)
				return
			}
			mu.Lock()
			faults.SessionEvents++
			faults.SessionsKilled += n
			mu.Unlock()
			logf("terminated %d worker sessions", n)
		})
	}
	if proxy != nil {
		every(c.NetFaultEvery, func() {
			if rand.IntN(2) == 0 {
				n := proxy.net.Cut()
				mu.Lock()
				faults.NetCuts++
				faults.ConnsCut += n
				mu.Unlock()
				logf("network cut: %d connections", n)
				return
			}
			d := time.Duration((0.25 + 1.25*rand.Float64()) * float64(c.Lease))
			proxy.net.Stall()
			select {
			case <-faultCtx.Done():
			case <-time.After(d):
			}
			proxy.net.Resume()
			mu.Lock()
			faults.NetStalls++
			mu.Unlock()
			logf("network stalled for %v", d.Round(time.Millisecond))
		})
	}
	if c.RestartCmd != "" {
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case <-faultCtx.Done():
				return
			case <-time.After(time.Duration(c.RestartAt * float64(c.Duration))):
			}
			logf("restarting the server: %s", c.RestartCmd)
			t0 := time.Now()
			rctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(rctx, "sh", "-c", c.RestartCmd)
			out, err := cmd.CombinedOutput()
			_ = os.WriteFile(filepath.Join(c.LogDir, "restart.log"), out, 0o644)
			if err != nil {
				violation("the restart command failed: %v: %s", err, strings.TrimSpace(string(out)))
				return
			}
			mu.Lock()
			faults.Restarts++
			faults.RestartTook = time.Since(t0).Round(10 * time.Millisecond).String()
			mu.Unlock()
			logf("server restarted in %v", time.Since(t0).Round(10*time.Millisecond))
		}()
	}
	// Workers that exit on their own are a finding; they are restarted.
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		report := time.Now()
		for {
			select {
			case <-faultCtx.Done():
				return
			case <-tick.C:
			}
			for _, w := range workers {
				w.mu.Lock()
				exited, killed, err := w.exited, w.killed, w.exitErr
				w.mu.Unlock()
				select {
				case <-exited:
					if !killed {
						mu.Lock()
						faults.Crashes = append(faults.Crashes, fmt.Sprintf("worker %d: %v", w.idx, err))
						mu.Unlock()
						violation("worker %d exited on its own: %v (see %s)", w.idx, err, w.logf.Name())
						_ = w.start()
					}
				default:
				}
			}
			if time.Since(report) >= 15*time.Second {
				report = time.Now()
				mu.Lock()
				f := faults
				mu.Unlock()
				logf("kills %d, session terminations %d (%d sessions), restarts %d, network stalls %d, cuts %d; %s", f.Kills, f.SessionEvents, f.SessionsKilled, f.Restarts, f.NetStalls, f.NetCuts, progress(faultCtx, mon, c, forms))
			}
		}
	}()
	<-faultCtx.Done()
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	mu.Lock()
	rep.Faults = faults
	mu.Unlock()
	logf("faults stopped: %d kills, %d session terminations (%d sessions), %d server restarts, %d network stalls, %d network cuts (%d connections)",
		faults.Kills, faults.SessionEvents, faults.SessionsKilled, faults.Restarts, faults.NetStalls, faults.NetCuts, faults.ConnsCut)

	// Calm: every live worker must record outcomes in each of its forms.
	calmStart := time.Now()
	base := map[int]map[string]int64{}
	for _, w := range workers {
		base[w.idx] = map[string]int64{}
	}
	outcomes := func(st sqlxbroker.Stats) int64 { return st.Succeeded + st.Retried + st.Dead }
	waiting := func() []string {
		var out []string
		for _, w := range workers {
			st, at := w.snapshot()
			for _, f := range w.cfg.Subscribe {
				if at.Before(calmStart) || !st.Subscribed[f] {
					out = append(out, fmt.Sprintf("worker %d %s", w.idx, f))
					continue
				}
				if _, ok := base[w.idx][f]; !ok {
					base[w.idx][f] = outcomes(st.Forms[f])
				}
				if outcomes(st.Forms[f]) <= base[w.idx][f] {
					out = append(out, fmt.Sprintf("worker %d %s", w.idx, f))
				}
			}
		}
		return out
	}
	for said := time.Now(); ; {
		left := waiting()
		if len(left) > 0 && time.Since(said) >= 5*time.Second {
			said = time.Now()
			logf("calm: waiting for %s", strings.Join(left, ", "))
		}
		if len(left) == 0 {
			logf("calm: every worker recorded outcomes in every form it subscribes to (%v)", time.Since(calmStart).Round(time.Millisecond))
			break
		}
		if time.Since(calmStart) > c.Calm {
			violation("no outcome recorded within %v after the faults (subscription stuck?): %s", c.Calm, strings.Join(left, ", "))
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	rep.Calm = time.Since(calmStart).Round(time.Millisecond).String()

	// Drain with the same workers.
	for _, w := range workers {
		w.signal(syscall.SIGUSR1)
	}
	drainStart := time.Now()
	for {
		n, err := pendingRows(ctx, mon, c, forms)
		if err == nil && n == 0 {
			logf("drained in %v", time.Since(drainStart).Round(time.Millisecond))
			break
		}
		if time.Since(drainStart) > c.DrainTimeout {
			violation("not drained after %v: %d rows unfinished (err %v)", c.DrainTimeout, n, err)
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	rep.Drain = time.Since(drainStart).Round(time.Millisecond).String()
	for _, w := range workers {
		w.signal(syscall.SIGTERM)
	}
	for _, w := range workers {
		w.mu.Lock()
		exited := w.exited
		w.mu.Unlock()
		select {
		case <-exited:
			w.mu.Lock()
			err := w.exitErr
			w.mu.Unlock()
			if err != nil {
				violation("worker %d did not stop cleanly: %v (see %s)", w.idx, err, w.logf.Name())
			}
		case <-time.After(90 * time.Second):
			violation("worker %d did not stop within 90s of SIGTERM (see %s)", w.idx, w.logf.Name())
			w.kill()
		}
	}
	mon.Close()

	adb, err := openSoakDB(c.Driver, c.DSN)
	if err != nil {
		return nil, err
	}
	defer adb.Close()
	if err := auditSoak(ctx, adb, b.Dialect(), c, forms, rep); err != nil {
		return nil, err
	}
	rep.Violations = append(viol, rep.Violations...)
	rep.Took = time.Since(started).Round(time.Second).String()
	if !c.Keep {
		dropSoakTables(context.Background(), adb, c, forms)
	}
	return rep, nil
}

// soakConnections is how many connections the workers may hold at once,
// the harness's included: every row-lock handler holds one while it runs
// (a soak's handlers are slow at times, so at times all of them do), and
// every lease and advisory subscription its form's pool. Publishers and
// the handlers' ledger writes take more, but briefly. rowLock is the
// row-lock handlers' part.
func soakConnections(c soakConfig, variants []soakVariant) (all, rowLock int) {
	for _, v := range variants {
		switch v.Form {
		case sqlxbroker.RowLock:
			rowLock += c.Workers * c.Concurrency
		case sqlxbroker.Lease:
			all += c.Workers * forms.LeaseConnections
		case sqlxbroker.Advisory:
			all += c.Workers * forms.AdvisoryConnections
		}
	}
	return all + rowLock + 1, rowLock
}

// checkSoakConnections fails, before anything starts, a soak whose
// workers may hold more connections than the server accepts (its limit
// less the connections open now): their claims would fail for want of
// connections, and the audit would report rows left pending. A server
// that does not say (SQLite has none) is not checked.
func checkSoakConnections(ctx context.Context, db *sqlx.DB, c soakConfig, variants []soakVariant) error {
	q := connectionsLeftQuery(c.Driver)
	if q == "" {
		return nil
	}
	var left int
	if err := db.QueryRowContext(ctx, q).Scan(&left); err != nil {
		fmt.Fprintf(c.Out, "soak: the server's connection limit is unknown (%v); not checked\n", err)
		return nil
	}
	need, rowLock := soakConnections(c, variants)
	if need <= left {
		return nil
	}
	return fmt.Errorf("soak: %d workers may hold %d connections at once (%d for %d row-lock handlers each, one per handler while it runs; %d for the lease and advisory forms' pools and the harness), and the server accepts %d more: lower --workers or --concurrency, leave the row lock out (--forms lease,advisory), or raise the server's connection limit",
		c.Workers, need, rowLock, c.Concurrency, need-rowLock, left)
}

// connectionsLeftQuery reads how many more client connections driver's
// server accepts: its limit (PostgreSQL's less the slots reserved for
// superusers, unless the user is one) less the connections open now; ""
// where there is no server.
func connectionsLeftQuery(driver string) string {
	switch driver {
	case "postgres":
		return `SELECT current_setting('max_connections')::int
	- CASE WHEN (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) THEN 0 ELSE current_setting('superuser_reserved_connections')::int END
	- (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')::int`
	case "mysql":
		return "SELECT @@max_connections - (SELECT COUNT(*) FROM information_schema.PROCESSLIST)"
	}
	return ""
}

func serverVersionQuery(driver string) string {
	switch driver {
	case "postgres":
		return "SELECT 'PostgreSQL ' || current_setting('server_version')"
	case "mysql":
		return "SELECT VERSION()"
	case "sqlite":
		return "SELECT 'SQLite ' || sqlite_version()"
	}
	return "SELECT 'unknown'"
}

func soakTables(c soakConfig, forms []soakVariant) []string {
	var out []string
	for _, f := range forms {
		out = append(out, soakTable(c.Prefix, f, c.Lease, c.MaxAttempts).Name)
	}
	pub, runs, eff, outc := ledgers(c.Prefix)
	return append(out, pub, runs, eff, outc)
}

func dropSoakTables(ctx context.Context, db *sqlx.DB, c soakConfig, forms []soakVariant) {
	for _, t := range soakTables(c, forms) {
		_, _ = db.ExecContext(ctx, "DROP TABLE IF EXISTS "+t)
	}
}

// createSoakTables drops and creates the message tables and ledgers.
func createSoakTables(ctx context.Context, b *sqlxbroker.Broker, c soakConfig, forms []soakVariant) error {
	dropSoakTables(ctx, b.DB(), c, forms)
	for _, f := range forms {
		if err := b.CreateTable(ctx, soakTable(c.Prefix, f, c.Lease, c.MaxAttempts), soakPayload...); err != nil {
			return err
		}
	}
	for _, s := range ledgerDDL(c.Driver, c.Prefix) {
		if _, err := b.DB().ExecContext(ctx, s); err != nil {
			return fmt.Errorf("soak: %s: %w", s, err)
		}
	}
	return nil
}

// pendingRows counts rows neither done nor dead in every form's table.
func pendingRows(ctx context.Context, db *sqlx.DB, c soakConfig, forms []soakVariant) (int, error) {
	qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	total := 0
	for _, f := range forms {
		var n int
		t := soakTable(c.Prefix, f, c.Lease, c.MaxAttempts)
		if err := db.QueryRowContext(qctx, "SELECT COUNT(*) FROM "+t.Name+" WHERE "+unfinished(t)).Scan(&n); err != nil {
			return -1, err
		}
		total += n
	}
	return total, nil
}

// progress summarises the tables for the progress line.
func progress(ctx context.Context, db *sqlx.DB, c soakConfig, forms []soakVariant) string {
	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var parts []string
	for _, f := range forms {
		var all, unf, dead int
		t := soakTable(c.Prefix, f, c.Lease, c.MaxAttempts)
		err := db.QueryRowContext(qctx, "SELECT COUNT(*), COUNT(dead_at), COALESCE(SUM(CASE WHEN "+unfinished(t)+" THEN 1 ELSE 0 END), 0) FROM "+t.Name).Scan(&all, &dead, &unf)
		if err != nil {
			return "database unavailable: " + strings.SplitN(err.Error(), "\n", 2)[0]
		}
		parts = append(parts, fmt.Sprintf("%s %d rows %d unfinished %d dead", f, all, unf, dead))
	}
	return strings.Join(parts, " | ")
}

// unfinished is the condition that a row of t is neither done nor dead.
func unfinished(t sqlxbroker.Table) string {
	if t.DoneAt == "" {
		return "dead_at IS NULL"
	}
	return "done_at IS NULL AND dead_at IS NULL"
}

// soakDatabase returns a DSN for a fresh database named name on dsn's MySQL
// server, created with the pool on dsn, and a function that drops it. The
// tests use it so that session terminations, which go by database, stay
// within the soak.
func soakDatabase(ctx context.Context, dsn, name string) (string, func(), error) {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return "", nil, err
	}
	db, err := sqlx.Open("mysql", dsn)
	if err != nil {
		return "", nil, err
	}
	if _, err := db.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
		db.Close()
		return "", nil, err
	}
	cfg.DBName = name
	return cfg.FormatDSN(), func() {
		_, _ = db.ExecContext(context.Background(), "DROP DATABASE IF EXISTS "+name)
		db.Close()
	}, nil
}
