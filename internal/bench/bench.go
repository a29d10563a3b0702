// Package bench measures sqlxbroker on a real database: it fills a table
// and drains it with K handlers that do nothing (drain mode), or publishes
// at a fixed rate and measures publish-to-handler latency (steady mode). In
// the same run it measures the database's raw commit rate over as many
// connections as the run used (BEGIN, a single-row UPDATE, COMMIT), so a
// result can be read as a ratio that carries across
// machines: deliveries per second over commits per second.
//
// The sqlxbroker command's bench subcommand and the go test benchmarks of
// this package both drive Run.
package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/core"
)

// Modes of a run.
const (
	Drain  = "drain"
	Steady = "steady"
)

// Config is one benchmark run.
type Config struct {
	Driver string // database/sql driver name
	DSN    string
	// Dialect is the dialect under test; nil: the one registered for
	// Driver.
	Dialect core.Dialect
	Form    sqlxbroker.Form
	Mode    string // Drain (default) or Steady

	// Rows is the backlog a drain starts with; default 10,000.
	Rows int
	// Concurrency is the most handlers running at once (K); default 10.
	Concurrency int
	// BatchSize is the most rows one claim takes; 0: the engine's default.
	BatchSize int
	// Keys is the number of distinct advisory keys rows spread over;
	// default 1,000.
	Keys int

	// Rate is the steady mode's messages per second; default 200.
	Rate int
	// Duration is how long the steady mode publishes; default 10s.
	Duration time.Duration
	// Interval, in steady mode, samples the run every interval
	// (Result.Samples): the window's deliveries and latency, the table's
	// size and dead rows, the process's memory; 0: no samples.
	Interval time.Duration
	// Backlog, in steady mode, fills the table with this many older rows
	// before publishing starts; they drain while the steady messages are
	// published, and only the steady messages' latency is measured.
	Backlog int
	// Prioritized orders the table "prio DESC, id" and publishes the
	// steady messages at a higher prio than the backlog, so they are
	// claimed ahead of it (as an application keeps live work ahead of a
	// bulk load); without it a steady message waits behind the backlog.
	Prioritized bool
	// DoneAt gives the table a DoneAt column: a success marks the row
	// done instead of deleting it. PruneEvery > 0 then runs Broker.Prune
	// of the rows done longer ago than PruneAge (default 10s) every
	// PruneEvery, as an application prunes with the operations API.
	DoneAt     bool
	PruneEvery time.Duration
	PruneAge   time.Duration
	// Setup are statements run once the table is created, "{table}"
	// standing for its quoted name: per-table storage settings such as
	// PostgreSQL's "ALTER TABLE {table} SET (autovacuum_vacuum_scale_factor
	// = 0, autovacuum_vacuum_threshold = 10000)".
	Setup []string
	// Label names the run in Result.Label (charts over time).
	Label string
	// HoldTx, in steady mode, keeps a transaction open on its own
	// connection for the whole steady phase (PostgreSQL: one with a
	// transaction id; MariaDB: a consistent snapshot), holding back the
	// server's cleanup of dead row versions, as a forgotten transaction
	// of an application would.
	HoldTx bool

	// CommitDuration is how long the raw commit loop runs; default 3s,
	// negative to skip it.
	CommitDuration time.Duration

	// Floor, for a drain, also drains a table with the form's statements
	// alone: RowLockFloor over the commit loop's connections, LeaseFloor,
	// AdvisoryFloor.
	Floor bool
	// WorkerMaxProcs, for RunProcs, sets each worker process's GOMAXPROCS
	// (0: Go's default, every CPU of the machine). Processes that share
	// a machine share its CPUs, as their hosts' or containers' CPU
	// limits would divide them.
	WorkerMaxProcs int
	// Apart, for RunProcs, gives each worker process a table of its own
	// (the table's name with "_N" added; c.Rows and c.Keys divided among
	// them, each table's advisory keys named apart): the same processes,
	// handlers and keys in all, with no claim ever meeting another
	// process's, what the processes would drain if the table were not
	// shared.
	Apart bool
	// WorkerProfile, for RunProcs, makes each worker process write a CPU
	// profile of its drain to this path with ".N" added (N its index).
	WorkerProfile string
	// FloorFirst runs the floor before the drain rather than after it, so
	// that rounds of a comparison can alternate which side runs first. The
	// row-lock floor then uses c.Concurrency connections (the commit loop,
	// which it otherwise follows, has not counted the drain's peak yet).
	FloorFirst bool

	// Table names the table to (re)create; default "sqlxbroker_bench".
	Table string
	// Logf, when set, reports progress.
	Logf func(format string, args ...any)
	// Profile, when set, receives a CPU profile of the drain or steady
	// phase alone (the fill left out).
	Profile io.Writer
	// MemProfileBase and MemProfile, when set, receive the process's
	// allocation profile ("allocs") as the drain or steady phase starts
	// and as it ends: the phase's own allocations are the difference
	// (go tool pprof -sample_index=alloc_space -base BASE PROFILE).
	MemProfileBase, MemProfile io.Writer

	// Traced gives the table a ReadyAt and a Metadata column (the
	// publisher's trace context), as an instrumented application's table
	// has: a comparison with and without Adapter runs both on such a
	// table.
	Traced bool
	// Adapter, when set, instruments the run (an observability adapter
	// such as otelbroker's), so its cost can be measured.
	Adapter *Adapter
}

// Adapter is what an observability adapter does to a run. The package
// imports none: the command supplies it.
type Adapter struct {
	Name string // reported as Result.Adapter
	// Broker is called with the broker that publishes (the fill's, the
	// steady mode's), before it publishes: to set its MetadataFunc.
	Broker func(*sqlxbroker.Broker)
	// PublishContext returns the context a publish runs in (a span of its
	// own) and the function that ends it.
	PublishContext func(context.Context) (context.Context, func())
	// Wrap wraps the subscription's handler and params.
	Wrap func(sqlxbroker.Table, sqlxbroker.Handler, sqlxbroker.SubscribeParams) (sqlxbroker.Handler, sqlxbroker.SubscribeParams)
}

// publishCtx is the context of one publish: the adapter's, or ctx.
func (c *Config) publishCtx(ctx context.Context) (context.Context, func()) {
	if c.Adapter == nil || c.Adapter.PublishContext == nil {
		return ctx, func() {}
	}
	return c.Adapter.PublishContext(ctx)
}

// wrap is the adapter's Wrap, or h and p as they are.
func (c *Config) wrap(t sqlxbroker.Table, h sqlxbroker.Handler, p sqlxbroker.SubscribeParams) (sqlxbroker.Handler, sqlxbroker.SubscribeParams) {
	if c.Adapter == nil || c.Adapter.Wrap == nil {
		return h, p
	}
	return c.Adapter.Wrap(t, h, p)
}

// Result is what a run measured. Latency is publish-to-handler in steady
// mode and handler-start-to-completion in drain mode.
type Result struct {
	Dialect       string  `json:"dialect"`
	Server        string  `json:"server,omitempty"`
	Form          string  `json:"form"`
	Mode          string  `json:"mode"`
	Rows          int     `json:"rows"`
	Concurrency   int     `json:"concurrency"`
	BatchSize     int     `json:"batch_size"`
	Deliveries    int64   `json:"deliveries"`
	Seconds       float64 `json:"seconds"`
	PerSecond     float64 `json:"deliveries_per_sec"`
	P50Ms         float64 `json:"p50_ms"`
	P99Ms         float64 `json:"p99_ms"`
	PeakConns     int     `json:"peak_conns"`
	PeakRSSMB     float64 `json:"peak_rss_mb"`
	CPUMicros     float64 `json:"cpu_us_per_delivery"`    // this process's CPU time (user and system) per delivery
	CommitConns   int     `json:"commit_conns,omitempty"` // connections of the commit loop
	CommitsPerSec float64 `json:"commits_per_sec,omitempty"`
	CommitCPU     float64 `json:"cpu_us_per_commit,omitempty"` // this process's CPU per raw commit
	Ratio         float64 `json:"ratio,omitempty"`             // PerSecond / CommitsPerSec
	FloorPerSec   float64 `json:"floor_per_sec,omitempty"`     // the form's statements alone (RowLockFloor, LeaseFloor, AdvisoryFloor)
	FloorConns    int     `json:"floor_conns,omitempty"`       // connections of the floor
	FloorRatio    float64 `json:"floor_ratio,omitempty"`       // FloorPerSec / CommitsPerSec
	FloorCPU      float64 `json:"cpu_us_per_floor,omitempty"`  // this process's CPU per row of the floor, the fill left out
	OfFloor       float64 `json:"of_floor,omitempty"`          // PerSecond / FloorPerSec
	FloorFirst    bool    `json:"floor_first,omitempty"`       // the floor ran before the drain (Config.FloorFirst)
	Errors        int64   `json:"errors"`                      // claim and completion errors, lost leases
	Traced        bool    `json:"traced,omitempty"`            // the table had ReadyAt and Metadata columns (Config.Traced)
	Adapter       string  `json:"adapter,omitempty"`           // the adapter that instrumented the run (Config.Adapter)

	Label string   `json:"label,omitempty"` // Config.Label
	Setup []string `json:"setup,omitempty"` // Config.Setup
	// Steady mode with Config.Interval: one sample per interval, and the
	// first and last five minutes (or fifths of the run, if shorter).
	Samples []Sample `json:"samples,omitempty"`
	First   *Window  `json:"first,omitempty"`
	Last    *Window  `json:"last,omitempty"`
	// Steady mode with Config.Backlog: the backlog's rows and when the
	// last of them was handled (seconds from the steady phase's start).
	BacklogRows    int     `json:"backlog_rows,omitempty"`
	BacklogDrained float64 `json:"backlog_drained_s,omitempty"`
	// SubscribeMs, in steady mode, is how long Subscribe took (the form's
	// checks and start); the steady messages are due from its return.
	SubscribeMs float64 `json:"subscribe_ms,omitempty"`
	Pruned      int64   `json:"pruned,omitempty"`     // rows Broker.Prune deleted (Config.PruneEvery)
	Autovacuum  string  `json:"autovacuum,omitempty"` // PostgreSQL's autovacuum setting during a steady run
}

func (c *Config) defaults() error {
	if c.Driver == "" || c.DSN == "" {
		return errors.New("bench: driver and DSN are required")
	}
	if c.Dialect == nil {
		d, err := sqlxbroker.Lookup(c.Driver)
		if err != nil {
			return err
		}
		c.Dialect = d
	}
	if c.Form == 0 {
		c.Form = sqlxbroker.Lease
	}
	if !core.CapabilitiesOf(c.Dialect).Offers(c.Form) {
		return &sqlxbroker.FormError{Dialect: c.Dialect.Name(), Form: c.Form, Reason: "the dialect does not implement it"}
	}
	if c.Mode == "" {
		c.Mode = Drain
	}
	if c.Mode != Drain && c.Mode != Steady {
		return fmt.Errorf("bench: unknown mode %q (drain or steady)", c.Mode)
	}
	if c.Rows < 0 || c.Concurrency < 0 || c.BatchSize < 0 || c.Keys < 0 || c.Rate < 0 || c.Duration < 0 {
		return errors.New("bench: negative rows, concurrency, batch size, keys, rate or duration")
	}
	if c.Interval < 0 || c.Backlog < 0 || c.PruneEvery < 0 || c.PruneAge < 0 {
		return errors.New("bench: negative interval, backlog, prune interval or prune age")
	}
	if c.Mode != Steady && (c.Interval > 0 || c.Backlog > 0 || c.HoldTx || c.PruneEvery > 0) {
		return errors.New("bench: interval, backlog, prune and held transaction are for the steady mode")
	}
	if c.PruneEvery > 0 && !c.DoneAt {
		return errors.New("bench: pruning needs the DoneAt table (done-at)")
	}
	if c.PruneAge == 0 {
		c.PruneAge = 10 * time.Second
	}
	if c.Rows == 0 {
		c.Rows = 10_000
	}
	if c.Concurrency == 0 {
		c.Concurrency = 10
	}
	if c.Keys == 0 {
		c.Keys = 1000
	}
	if c.Rate == 0 {
		c.Rate = 200
	}
	if c.Duration == 0 {
		c.Duration = 10 * time.Second
	}
	if c.CommitDuration == 0 {
		c.CommitDuration = 3 * time.Second
	}
	if c.Table == "" {
		c.Table = "sqlxbroker_bench"
	}
	if c.Logf == nil {
		c.Logf = func(string, ...any) {}
	}
	return core.CheckIdent(c.Table)
}

// Table returns the description of the benchmark table for form f.
func Table(name string, f sqlxbroker.Form) sqlxbroker.Table {
	t := sqlxbroker.Table{Name: name}
	switch f {
	case sqlxbroker.Lease:
		t.LockedUntil = "locked_until"
	case sqlxbroker.Advisory:
		t.AdvisoryLock = "acct-{acct}"
	}
	return t
}

// payload are the benchmark table's columns beyond the broker's own.
var payload = [][2]string{{"acct", "text"}, {"pub_ns", "bigint"}}

type message struct {
	Acct  string `db:"acct"`
	PubNS int64  `db:"pub_ns"`
}

// UndeliveredError is a steady run's messages (or backlog rows) not
// handled within 30 s of the last publish: the load was more than the
// subscription kept up with. Run returns it with the run's Result.
type UndeliveredError struct {
	What        string // "published messages" or "backlog rows"
	Left, Total int64
}

func (e *UndeliveredError) Error() string {
	return fmt.Sprintf("bench: %d of %d %s were not delivered within 30s", e.Left, e.Total, e.What)
}

// Run runs one benchmark. A steady run that fell behind returns its
// Result with an *UndeliveredError.
func Run(ctx context.Context, c Config) (*Result, error) {
	if err := c.defaults(); err != nil {
		return nil, err
	}
	db, err := open(c)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	b := sqlxbroker.OpenDialect(db, c.Dialect)
	t := Table(c.Table, c.Form)
	if c.Traced {
		t.ReadyAt, t.Metadata = "ready_at", "meta"
	}
	cols := payload
	if c.Prioritized {
		t.Order = "prio DESC, id"
		cols = append(slices.Clip(cols), [2]string{"prio", "bigint"})
	}
	if c.DoneAt {
		t.DoneAt = "done_at"
	}
	if err := recreateWith(ctx, b, t, cols); err != nil {
		return nil, err
	}
	for _, q := range c.Setup {
		q = strings.ReplaceAll(q, "{table}", c.Dialect.QuoteIdent(t.Name))
		if _, err := db.ExecContext(ctx, q); err != nil {
			drop(b, t.Name)
			return nil, fmt.Errorf("bench: setup %q: %w", q, err)
		}
	}
	defer drop(b, t.Name)
	r := &Result{Dialect: c.Dialect.Name(), Server: serverVersion(ctx, db), Form: c.Form.String(), Mode: c.Mode,
		Concurrency: c.Concurrency, BatchSize: c.BatchSize, Traced: c.Traced, Label: c.Label, Setup: c.Setup}
	if c.Adapter != nil {
		r.Adapter = c.Adapter.Name
		if c.Adapter.Broker != nil {
			c.Adapter.Broker(b)
		}
	}

	switch c.Mode {
	case Drain:
		if c.Floor && c.FloorFirst {
			r.FloorFirst = true
			if err := runFloor(ctx, c, db, r); err != nil {
				return nil, err
			}
		}
		err = drain(ctx, c, b, t, r)
	case Steady:
		err = steady(ctx, c, b, t, r)
		var late *UndeliveredError
		if errors.As(err, &late) {
			return r, err // what was measured, for the record
		}
	}
	if err != nil {
		return nil, err
	}
	if c.CommitDuration > 0 {
		// As many connections as the run used: K for the row-lock and
		// advisory forms, the lease form's few whatever K. The rate is
		// the mean of two loops of half the time each, on a fresh table.
		r.CommitConns = max(1, r.PeakConns)
		c.Logf("raw commit loop over %d connections for %v", r.CommitConns, c.CommitDuration)
		half := c
		half.CommitDuration = c.CommitDuration / 2
		before := cpuTime()
		var rates float64
		for range 2 {
			rate, err := CommitRate(ctx, half, db, r.CommitConns)
			if err != nil {
				return nil, err
			}
			rates += rate
		}
		r.CommitsPerSec = rates / 2
		if commits := r.CommitsPerSec * c.CommitDuration.Seconds(); commits > 0 {
			r.CommitCPU = float64((cpuTime() - before).Microseconds()) / commits
		}
	}
	if c.Floor && c.Mode == Drain && !c.FloorFirst {
		if err := runFloor(ctx, c, db, r); err != nil {
			return nil, err
		}
	}
	if r.FloorPerSec > 0 {
		r.OfFloor = r.PerSecond / r.FloorPerSec
	}
	if r.CommitsPerSec > 0 {
		r.Ratio = r.PerSecond / r.CommitsPerSec
		r.FloorRatio = r.FloorPerSec / r.CommitsPerSec
	}
	return r, nil
}

// runFloor drains a table of its own with the form's statements alone
// and records the rate in r.
func runFloor(ctx context.Context, c Config, db *sqlx.DB, r *Result) error {
	var cpu time.Duration
	var err error
	switch c.Form {
	case sqlxbroker.RowLock:
		r.FloorConns = max(r.CommitConns, c.Concurrency)
		c.Logf("row-lock floor: the form's statements alone over %d connections", r.FloorConns)
		r.FloorPerSec, cpu, err = RowLockFloor(ctx, c, db, r.FloorConns)
	case sqlxbroker.Lease:
		c.Logf("lease floor: the form's statements alone, claims of %d rows", floorClaimSize(c))
		r.FloorPerSec, r.FloorConns, cpu, err = LeaseFloor(ctx, c, db)
	case sqlxbroker.Advisory:
		c.Logf("advisory floor: the form's statements alone, claims of %d rows", floorClaimSize(c))
		r.FloorPerSec, r.FloorConns, cpu, err = AdvisoryFloor(ctx, c, db)
	}
	if err != nil {
		return err
	}
	r.FloorCPU = float64(cpu.Microseconds()) / float64(c.Rows)
	return nil
}

// open opens a pool that keeps as many idle connections as a run can use:
// the row-lock and advisory forms hold one per delivery in work.
func open(c Config) (*sqlx.DB, error) {
	db, err := sqlx.Open(c.Driver, c.DSN)
	if err != nil {
		return nil, fmt.Errorf("bench: open %s: %w", c.Driver, err)
	}
	db.SetMaxIdleConns(c.Concurrency + 8)
	if err := db.Ping(); err != nil {
		db.Close()
		return nil, fmt.Errorf("bench: reach the %s database: %w", c.Driver, err)
	}
	return db, nil
}

func recreate(ctx context.Context, b *sqlxbroker.Broker, t sqlxbroker.Table) error {
	return recreateWith(ctx, b, t, payload)
}

// recreateWith drops t and creates it with the payload columns cols.
func recreateWith(ctx context.Context, b *sqlxbroker.Broker, t sqlxbroker.Table, cols [][2]string) error {
	drop(b, t.Name)
	if err := b.CreateTable(ctx, t, cols...); err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	return nil
}

func drop(b *sqlxbroker.Broker, name string) {
	_, _ = b.DB().Exec("DROP TABLE IF EXISTS " + b.Dialect().QuoteIdent(name))
}

// serverVersion reads the server's version where a common statement has it.
func serverVersion(ctx context.Context, db *sqlx.DB) string {
	for _, q := range []string{"SELECT version()", "SELECT 'SQLite ' || sqlite_version()"} {
		var v string
		if err := db.QueryRowContext(ctx, q).Scan(&v); err == nil {
			if i := strings.Index(v, " on "); i > 0 {
				v = v[:i]
			}
			return v
		}
	}
	return ""
}

// fill publishes c.Rows rows in transactions of 10,000, each with pub_ns
// set to now and its key among c.Keys; each transaction in the adapter's
// publish context.
func fill(ctx context.Context, c *Config, b *sqlxbroker.Broker, t sqlxbroker.Table) error {
	return fillRows(ctx, c, b, t, c.Rows, true)
}

// fillRows publishes n rows in transactions of 10,000, their pub_ns the
// time of their transaction (stamped) or 0 (a steady run's backlog, whose
// latency is not measured).
func fillRows(ctx context.Context, c *Config, b *sqlxbroker.Broker, t sqlxbroker.Table, n int, stamped bool) error {
	keys := c.Keys
	const chunk = 10_000
	msgs := make([]any, 0, chunk)
	for start := 0; start < n; start += chunk {
		msgs = msgs[:0]
		var now int64
		if stamped {
			now = time.Now().UnixNano()
		}
		for i := start; i < min(start+chunk, n); i++ {
			if c.Prioritized {
				msgs = append(msgs, steadyMessage{Acct: strconv.Itoa(i % keys), PubNS: now})
			} else {
				msgs = append(msgs, message{Acct: strconv.Itoa(i % keys), PubNS: now})
			}
		}
		tx, err := b.DB().BeginTxx(ctx, nil)
		if err != nil {
			return err
		}
		pctx, end := c.publishCtx(ctx)
		err = b.Publish(pctx, tx, t, msgs...)
		end()
		if err != nil {
			tx.Rollback()
			return err
		}
		if err := tx.Commit(); err != nil {
			return err
		}
	}
	// Fresh statistics, as autovacuum would have them on a live queue.
	q := b.Dialect().QuoteIdent(t.Name)
	if _, err := b.DB().ExecContext(ctx, "ANALYZE "+q); err != nil {
		_, _ = b.DB().ExecContext(ctx, "ANALYZE TABLE "+q)
	}
	return nil
}

// watch samples the pool's open connections and the process's peak RSS
// while a run lasts. The pool keeps its idle connections (open), so a
// connection once opened stays counted until the run ends: a poll every
// watchEvery, and one at the end, sees the peak without waking the process
// a thousand times a second beside the subscription it measures.
type watch struct {
	db      *sqlx.DB
	cpu     time.Duration // the process's CPU time at the start
	profile io.Writer     // a CPU profile in progress
	mem     io.Writer     // receives the allocation profile at the end
	peak    atomic.Int64
	stop    chan struct{}
	ended   chan struct{}
}

func startWatch(db *sqlx.DB, c Config) *watch {
	runtime.GC()
	debug.FreeOSMemory()
	resetPeakRSS()
	profile := c.Profile
	if c.MemProfileBase != nil {
		writeAllocs(c.MemProfileBase)
	}
	w := &watch{db: db, cpu: cpuTime(), stop: make(chan struct{}), ended: make(chan struct{}), profile: profile, mem: c.MemProfile}
	if profile != nil {
		if err := pprof.StartCPUProfile(profile); err != nil {
			w.profile = nil
		}
	}
	go func() {
		defer close(w.ended)
		t := time.NewTicker(watchEvery)
		defer t.Stop()
		for {
			w.sample()
			select {
			case <-w.stop:
				return
			case <-t.C:
			}
		}
	}()
	return w
}

// writeAllocs writes the allocation profile to w in one Write.
func writeAllocs(w io.Writer) {
	var b bytes.Buffer
	if pprof.Lookup("allocs").WriteTo(&b, 0) == nil {
		_, _ = w.Write(b.Bytes())
	}
}

// watchEvery is how often a watch reads the pool's open connections.
const watchEvery = 10 * time.Millisecond

func (w *watch) sample() {
	if n := int64(w.db.Stats().OpenConnections); n > w.peak.Load() {
		w.peak.Store(n)
	}
}

func (w *watch) end(r *Result) {
	if w.profile != nil {
		pprof.StopCPUProfile()
	}
	close(w.stop)
	<-w.ended
	w.sample()
	if w.mem != nil {
		writeAllocs(w.mem)
	}
	r.PeakConns = int(w.peak.Load())
	r.PeakRSSMB = float64(peakRSS()) / (1 << 20)
	w.cpu = cpuTime() - w.cpu
}

// perDelivery sets r.CPUMicros from the CPU time the watch saw.
func (w *watch) perDelivery(r *Result) {
	if r.Deliveries > 0 {
		r.CPUMicros = float64(w.cpu.Microseconds()) / float64(r.Deliveries)
	}
}

// cpuTime is the process's CPU time so far, user and system.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// resetPeakRSS restarts the kernel's peak RSS count (Linux; elsewhere the
// peak covers the whole process).
func resetPeakRSS() { _ = os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) }

// peakRSS returns the process's peak resident set in bytes (VmHWM), 0 where
// the kernel does not say.
func peakRSS() int64 { return procStatusKB("VmHWM:") << 10 }

// procStatusKB reads a field of /proc/self/status in kB ("VmHWM:",
// "VmRSS:"), 0 where the kernel does not say.
func procStatusKB(field string) int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == field {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb
		}
	}
	return 0
}

func quiet() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
}

// probe is a drain's handler, which does nothing, and its OnOutcome
// part: it times one delivery in sample, handler start to completion, and
// counts the successes.
type probe struct {
	lat    hist
	starts sync.Map // *sqlxbroker.Delivery -> time.Time
	done   atomic.Int64
}

func (pb *probe) handle(ctx context.Context, d *sqlxbroker.Delivery) error {
	if sampled(d) {
		pb.starts.Store(d, time.Now())
	}
	return nil
}

// outcome records one completion and returns the successes so far, or 0
// for a completion that was not one.
func (pb *probe) outcome(d *sqlxbroker.Delivery, o sqlxbroker.Outcome, err error) int64 {
	if sampled(d) {
		if v, ok := pb.starts.LoadAndDelete(d); ok {
			pb.lat.Record(time.Since(v.(time.Time)))
		}
	}
	if err != nil || o.Kind != sqlxbroker.Succeeded {
		return 0
	}
	return pb.done.Add(1)
}

// sampled reports whether a drain times d: one id in sample, so that the
// other deliveries' outcomes need no lookup (an id that is not an integer
// is always timed).
func sampled(d *sqlxbroker.Delivery) bool {
	id, ok := d.ID().(int64)
	return !ok || id%sample == 0
}

// sample: a drain times one delivery in sample, so that timing costs the
// run little.
const sample = 8

// drain fills the table with c.Rows rows and times K no-op handlers
// draining it.
func drain(ctx context.Context, c Config, b *sqlxbroker.Broker, t sqlxbroker.Table, r *Result) error {
	c.Logf("filling %d rows", c.Rows)
	if err := fill(ctx, &c, b, t); err != nil {
		return fmt.Errorf("bench: fill: %w", err)
	}
	r.Rows = c.Rows
	// A fresh pool, so the peak counts what the drain opens.
	db, err := open(c)
	if err != nil {
		return err
	}
	defer db.Close()
	sb := sqlxbroker.OpenDialect(db, c.Dialect)

	var pb probe
	finished := make(chan struct{})
	n := int64(c.Rows)
	p := sqlxbroker.SubscribeParams{Concurrency: c.Concurrency, BatchSize: c.BatchSize, Logger: quiet(),
		PollInterval: 100 * time.Millisecond,
		OnOutcome: func(d *sqlxbroker.Delivery, o sqlxbroker.Outcome, err error) {
			if pb.outcome(d, o, err) == n {
				close(finished)
			}
		}}
	h := sqlxbroker.Handler(pb.handle)
	h, p = c.wrap(t, h, p)
	c.Logf("draining with concurrency %d", c.Concurrency)
	w := startWatch(db, c)
	begin := time.Now()
	s, err := sb.Subscribe(ctx, t, h, p)
	if err != nil {
		w.end(r)
		return err
	}
	var last time.Time
	timeout := time.NewTimer(10*time.Minute + time.Duration(c.Rows)*time.Millisecond)
	defer timeout.Stop()
	select {
	case <-finished:
		last = time.Now()
	case <-timeout.C:
	case <-ctx.Done():
	}
	_ = s.Stop(context.Background())
	w.end(r)
	fillResult(r, s.Stats(), &pb.lat)
	if last.IsZero() {
		return fmt.Errorf("bench: drain stopped after %d of %d deliveries (%v)", pb.done.Load(), n, ctx.Err())
	}
	r.Deliveries = pb.done.Load()
	r.Seconds = last.Sub(begin).Seconds()
	r.PerSecond = float64(r.Deliveries) / r.Seconds
	w.perDelivery(r)
	return nil
}

func fillResult(r *Result, st sqlxbroker.Stats, lat *hist) {
	r.Errors = st.ClaimErrors + st.CompleteErrors + st.LeaseLost
	r.P50Ms = lat.Quantile(0.50).Seconds() * 1000
	r.P99Ms = lat.Quantile(0.99).Seconds() * 1000
}

// CommitRate measures the database's raw commit rate: conns connections
// each run transactions of one statement, "UPDATE .. SET n = n + 1 WHERE
// id = <its own row>", then COMMIT, for c.CommitDuration; the result is
// commits per second over all of them. A delivery is such a transaction
// with one more statement (row lock) or two short ones (advisory, lease
// batches aside), so the ratio of the two rates is what the broker adds.
func CommitRate(ctx context.Context, c Config, db *sqlx.DB, conns int) (float64, error) {
	d := c.Dialect
	name := d.QuoteIdent(c.Table + "_commit")
	_, _ = db.ExecContext(ctx, "DROP TABLE IF EXISTS "+name)
	if _, err := db.ExecContext(ctx, "CREATE TABLE "+name+" (id INTEGER PRIMARY KEY, n INTEGER NOT NULL)"); err != nil {
		return 0, fmt.Errorf("bench: commit table: %w", err)
	}
	defer db.Exec("DROP TABLE IF EXISTS " + name)
	ins := sqlx.Rebind(d.BindType(), "INSERT INTO "+name+" (id, n) VALUES (?, 0)")
	for i := 0; i < conns; i++ {
		if _, err := db.ExecContext(ctx, ins, i); err != nil {
			return 0, fmt.Errorf("bench: commit table: %w", err)
		}
	}
	upd := sqlx.Rebind(d.BindType(), "UPDATE "+name+" SET n = n + 1 WHERE id = ?")
	var total atomic.Int64
	var i atomic.Int64
	elapsed, _, err := onConns(ctx, db, conns, func(conn *sqlx.Conn) error {
		id := i.Add(1) - 1
		end := time.Now().Add(c.CommitDuration)
		for time.Now().Before(end) {
			tx, err := conn.BeginTxx(ctx, nil)
			if err == nil {
				if _, err = tx.ExecContext(ctx, upd, id); err == nil {
					err = tx.Commit()
				} else {
					_ = tx.Rollback()
				}
			}
			if err != nil {
				return err
			}
			total.Add(1)
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("bench: commit loop: %w", err)
	}
	return float64(total.Load()) / elapsed.Seconds(), nil
}

// onConns runs loop on conns connections of db at once: each takes its
// connection first, and every loop starts when all have one. It returns
// the time from the start to the last loop's end, the process's CPU time
// over it, and the first loop's error.
func onConns(ctx context.Context, db *sqlx.DB, conns int, loop func(*sqlx.Conn) error) (time.Duration, time.Duration, error) {
	var wg, ready sync.WaitGroup
	errc := make(chan error, conns)
	start := make(chan struct{})
	for range conns {
		wg.Add(1)
		ready.Add(1)
		go func() {
			defer wg.Done()
			conn, err := db.Connx(ctx)
			ready.Done()
			if err != nil {
				errc <- err
				return
			}
			defer conn.Close()
			<-start
			if err := loop(conn); err != nil {
				errc <- err
			}
		}()
	}
	ready.Wait()
	cpu := cpuTime()
	began := time.Now()
	close(start)
	wg.Wait()
	elapsed, cpu := time.Since(began), cpuTime()-cpu
	select {
	case err := <-errc:
		return 0, 0, err
	default:
		return elapsed, cpu, nil
	}
}
