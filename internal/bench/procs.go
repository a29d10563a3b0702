package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/sqlxbroker/sqlxbroker"
)

// WorkerEnv carries a drain worker's configuration (JSON) to the process
// RunProcs starts.
const WorkerEnv = "SQLXBROKER_BENCH_WORKER"

// workerSpec is what a worker process needs of a Config; the dialect is
// the one registered for Driver, rebuilt by the worker.
type workerSpec struct {
	Index       int    `json:"index"`
	Driver      string `json:"driver"`
	DSN         string `json:"dsn"`
	Form        string `json:"form"`
	Rows        int    `json:"rows"`
	Concurrency int    `json:"concurrency"`
	BatchSize   int    `json:"batch_size"`
	Table       string `json:"table"`
	Profile     string `json:"profile,omitempty"` // a CPU profile of the drain, to this path
	Apart       bool   `json:"apart,omitempty"`   // the table is this worker's alone (Config.Apart)
}

// ProcResult is one worker process's part of a multi-process drain. Times
// are Unix nanoseconds of the machine's clock, which every process shares.
type ProcResult struct {
	Index      int     `json:"index"`
	Pid        int     `json:"pid"`
	Deliveries int64   `json:"deliveries"`
	BeginNS    int64   `json:"begin_ns"` // its Subscribe call
	LastNS     int64   `json:"last_ns"`  // its last completion
	PerSecond  float64 `json:"deliveries_per_sec"`
	P50Ms      float64 `json:"p50_ms"`
	P99Ms      float64 `json:"p99_ms"`
	PeakConns  int     `json:"peak_conns"`
	PeakRSSMB  float64 `json:"peak_rss_mb"`
	CPUMicros  float64 `json:"cpu_us_per_delivery"`
	Errors     int64   `json:"errors"`
	MaxProcs   int     `json:"gomaxprocs"` // the worker's runtime.GOMAXPROCS
}

// Contention is what the database said about the claim statements while a
// multi-process drain ran. PostgreSQL: pg_stat_activity sampled every
// SampleEvery (the statements of the run's table and the advisory key
// statements, active ones only), and the table's pg_stat_user_tables
// counters over the drain. MariaDB: the server's global InnoDB counters
// before and after (the whole server's, so they count other sessions'
// work too), and its Threads_running sampled every SampleEvery.
type Contention struct {
	Samples int `json:"samples,omitempty"`
	// Per sample, on average: statements running, and of them waiting on
	// a heavyweight lock (row, tuple, transaction id: wait_event_type
	// Lock), on a lightweight lock (LWLock: buffers, WAL insertion), or
	// on I/O (IO: WAL flush at commit, reads).
	Active     float64            `json:"active_per_sample,omitempty"`
	LockWaits  float64            `json:"lock_waits_per_sample,omitempty"`
	LWLock     float64            `json:"lwlock_waits_per_sample,omitempty"`
	IO         float64            `json:"io_waits_per_sample,omitempty"`
	WaitEvents map[string]float64 `json:"wait_events_per_sample,omitempty"` // type:event -> per sample
	// IndexReadPerDelivery: index entries the table's scans read per row
	// delivered (PostgreSQL idx_tup_read): 1 plus the entries of rows
	// stepped over (locked, leased, deleted and not yet vacuumed) and the
	// completions' lookups. HeapFetchPerDelivery: heap rows fetched
	// through them (idx_tup_fetch).
	IndexReadPerDelivery float64 `json:"index_read_per_delivery,omitempty"`
	HeapFetchPerDelivery float64 `json:"heap_fetch_per_delivery,omitempty"`
	// CommitsPerDelivery: transactions committed in the database per row
	// delivered (PostgreSQL xact_commit; MariaDB Com_commit plus the
	// statements that commit by themselves are not told apart, so there
	// it is Com_commit alone). Whole-database counters.
	CommitsPerDelivery float64 `json:"commits_per_delivery,omitempty"`
	// StatementsPerDelivery (MariaDB): SELECT, UPDATE and DELETE
	// statements per row delivered (Com_select, Com_update, Com_delete).
	StatementsPerDelivery map[string]float64 `json:"statements_per_delivery,omitempty"`
	// MariaDB and MySQL: row lock waits over the drain
	// (Innodb_row_lock_waits) and their total time (Innodb_row_lock_time,
	// ms); per delivery, the rows the server read (Rows_read on MariaDB,
	// Innodb_rows_read on MySQL), the index lookups (Handler_read_key:
	// claims' seeks and completions' lookups) and the index entries read
	// after one (Handler_read_next: rows stepped over by range claims).
	// PageReadsPerDelivery: InnoDB's page reads from its buffer pool
	// (Innodb_buffer_pool_read_requests), which count the records a locking
	// read passes over inside InnoDB (held by another transaction, or
	// deleted and not yet purged) that the handler counters never see.
	RowLockWaits          int64   `json:"row_lock_waits,omitempty"`
	RowLockTimeMs         int64   `json:"row_lock_time_ms,omitempty"`
	RowsReadPerDelivery   float64 `json:"rows_read_per_delivery,omitempty"`
	ReadKeyPerDelivery    float64 `json:"read_key_per_delivery,omitempty"`
	ReadNextPerDelivery   float64 `json:"read_next_per_delivery,omitempty"`
	PageReadsPerDelivery  float64 `json:"page_reads_per_delivery,omitempty"`
	ServerCountersChecked bool    `json:"server_counters,omitempty"` // the MariaDB/MySQL counters were read
	// MariaDB and MySQL: the server's threads running a statement
	// (Threads_running, the sampling statement left out), sampled every
	// SampleEvery: their mean and most over ThreadSamples samples, and the
	// server's thread_handling ("one-thread-per-connection" runs every
	// session's statement on a thread of its own; "pool-of-threads" runs
	// at most about one per CPU at once; "" where the server has no such
	// setting). More threads running than the server has CPUs means
	// statements wait for each other's latches and for a CPU inside the
	// server.
	ThreadSamples     int     `json:"thread_samples,omitempty"`
	ThreadsRunning    float64 `json:"threads_running_per_sample,omitempty"`
	ThreadsRunningMax int64   `json:"threads_running_max,omitempty"`
	ThreadHandling    string  `json:"thread_handling,omitempty"`
}

// ProcsResult is a multi-process drain: the aggregate is from the first
// worker's Subscribe to the last completion in any of them.
type ProcsResult struct {
	Dialect     string       `json:"dialect"`
	Server      string       `json:"server,omitempty"`
	Form        string       `json:"form"`
	Procs       int          `json:"procs"`
	Concurrency int          `json:"concurrency"` // handlers per process
	Rows        int          `json:"rows"`
	Apart       bool         `json:"apart,omitempty"` // each process drained a table of its own (Config.Apart)
	Deliveries  int64        `json:"deliveries"`
	Seconds     float64      `json:"seconds"`
	PerSecond   float64      `json:"deliveries_per_sec"`
	P99Ms       float64      `json:"p99_ms"`              // the largest of the processes'
	PeakConns   int          `json:"peak_conns"`          // the processes' peaks added up
	CPUMicros   float64      `json:"cpu_us_per_delivery"` // the workers' CPU time over all deliveries
	Errors      int64        `json:"errors"`
	Contention  Contention   `json:"contention"`
	PerProcess  []ProcResult `json:"per_process"`
}

// SampleEvery is how often RunProcs samples PostgreSQL's pg_stat_activity
// and MariaDB's Threads_running.
const SampleEvery = 50 * time.Millisecond

// RunProcs fills c.Table once with c.Rows rows and drains it with procs
// worker processes of c.Concurrency handlers each. command returns the
// command that runs one worker (this program again, in the mode that calls
// Worker); RunProcs adds WorkerEnv to its environment and talks to it over
// its standard input and output. The workers open their pools and say so;
// once all have, each is told to start at once (the start barrier), and
// each reports its deliveries as they go; when they add up to c.Rows every
// worker stops and reports its result. With c.Apart each worker drains a
// table of its own instead (see Config.Apart).
func RunProcs(ctx context.Context, c Config, procs int, command func() *exec.Cmd) (*ProcsResult, error) {
	if err := c.defaults(); err != nil {
		return nil, err
	}
	if procs < 1 {
		return nil, errors.New("bench: procs must be at least 1")
	}
	if c.Mode != Drain {
		return nil, errors.New("bench: worker processes run drains only")
	}
	db, err := open(c)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	b := sqlxbroker.OpenDialect(db, c.Dialect)
	tables := procTables(c, procs)
	fc := c
	if len(tables) > 1 {
		// The keys are divided as the rows are: as many keys in all, so
		// a key is as often held when its next row is tried.
		fc.Keys = max(1, c.Keys/len(tables))
	}
	for i, name := range tables {
		t := Table(name, c.Form)
		if err := recreate(ctx, b, t); err != nil {
			return nil, err
		}
		defer drop(b, t.Name)
		n := procRows(c.Rows, len(tables), i)
		c.Logf("filling %d rows into %s", n, name)
		if err := fillRows(ctx, &fc, b, t, n, true); err != nil {
			return nil, fmt.Errorf("bench: fill: %w", err)
		}
	}
	r := &ProcsResult{Dialect: c.Dialect.Name(), Server: serverVersion(ctx, db), Form: c.Form.String(),
		Procs: procs, Concurrency: c.Concurrency, Rows: c.Rows, Apart: c.Apart}

	ws := make([]*workerProc, procs)
	defer func() {
		for _, w := range ws {
			if w != nil {
				w.kill()
			}
		}
	}()
	for i := range ws {
		spec, _ := json.Marshal(workerSpec{Index: i, Driver: c.Driver, DSN: c.DSN, Form: c.Form.String(), Rows: c.Rows,
			Concurrency: c.Concurrency, BatchSize: c.BatchSize, Table: tables[i%len(tables)], Profile: workerProfile(c.WorkerProfile, i), Apart: c.Apart})
		cmd := command()
		cmd.Env = append(os.Environ(), WorkerEnv+"="+string(spec))
		if c.WorkerMaxProcs > 0 {
			cmd.Env = append(cmd.Env, "GOMAXPROCS="+strconv.Itoa(c.WorkerMaxProcs))
		}
		if ws[i], err = startWorker(cmd); err != nil {
			return nil, fmt.Errorf("bench: worker %d: %w", i, err)
		}
	}
	for i, w := range ws {
		if err := w.waitReady(); err != nil {
			return nil, fmt.Errorf("bench: worker %d: %w", i, err)
		}
	}
	c.Logf("draining with %d processes x %d handlers", procs, c.Concurrency)
	probe, err := startContention(ctx, c, db, tables)
	if err != nil {
		return nil, err
	}
	for _, w := range ws {
		w.send("go")
	}
	// Wait for the deliveries to add up, a worker to fail, or the deadline.
	deadline := time.Now().Add(10*time.Minute + time.Duration(c.Rows)*time.Millisecond)
	tick := time.NewTicker(5 * time.Millisecond)
	var total int64
	var failed error
	for failed == nil && time.Now().Before(deadline) && ctx.Err() == nil {
		total = 0
		for i, w := range ws {
			total += w.done.Load()
			if err := w.failed(); err != nil {
				failed = fmt.Errorf("bench: worker %d: %w", i, err)
			}
		}
		if total >= int64(c.Rows) {
			break
		}
		<-tick.C
	}
	tick.Stop()
	for _, w := range ws {
		w.send("stop")
	}
	if failed != nil {
		probe.stop(ctx, r)
		return nil, failed
	}
	var errs []error
	for i, w := range ws {
		pr, err := w.result()
		if err != nil {
			errs = append(errs, fmt.Errorf("bench: worker %d: %w", i, err))
			continue
		}
		r.PerProcess = append(r.PerProcess, *pr)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	ws = nil
	if total < int64(c.Rows) {
		return nil, fmt.Errorf("bench: drain stopped after %d of %d deliveries (%v)", total, c.Rows, ctx.Err())
	}
	for _, p := range r.PerProcess {
		r.Deliveries += p.Deliveries
	}
	probe.stop(ctx, r)
	var begin, last int64
	var cpu float64
	for i, p := range r.PerProcess {
		cpu += p.CPUMicros * float64(p.Deliveries)
		if i == 0 || p.BeginNS < begin {
			begin = p.BeginNS
		}
		last = max(last, p.LastNS)
		r.P99Ms = max(r.P99Ms, p.P99Ms)
		r.PeakConns += p.PeakConns
		r.Errors += p.Errors
	}
	r.CPUMicros = cpu / float64(r.Deliveries)
	r.Seconds = float64(last-begin) / 1e9
	if r.Seconds > 0 {
		r.PerSecond = float64(r.Deliveries) / r.Seconds
	}
	return r, nil
}

// procTables names the tables of a multi-process drain: c.Table, or with
// c.Apart one per process.
func procTables(c Config, procs int) []string {
	if !c.Apart {
		return []string{c.Table}
	}
	out := make([]string, procs)
	for i := range out {
		out[i] = c.Table + "_" + strconv.Itoa(i)
	}
	return out
}

// procRows is table i's share of rows over n tables: the first tables
// take the remainder.
func procRows(rows, n, i int) int {
	share := rows / n
	if i < rows%n {
		share++
	}
	return share
}

// workerProc is a running worker process, seen from RunProcs.
type workerProc struct {
	cmd   *exec.Cmd
	in    io.WriteCloser
	ready chan struct{}
	done  atomic.Int64 // deliveries so far

	mu    sync.Mutex
	err   error // the worker's own report of failure, or its output ending early
	final *ProcResult
	ended chan struct{} // its output is read to the end
	tail  *tailBuffer   // the end of its standard error
}

// workerLine is one line a worker prints.
type workerLine struct {
	Ready bool        `json:"ready,omitempty"`
	Done  int64       `json:"done,omitempty"`
	Error string      `json:"error,omitempty"`
	Final *ProcResult `json:"final,omitempty"`
}

func startWorker(cmd *exec.Cmd) (*workerProc, error) {
	w := &workerProc{cmd: cmd, ready: make(chan struct{}), ended: make(chan struct{}), tail: &tailBuffer{max: 4096}}
	var err error
	if w.in, err = cmd.StdinPipe(); err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = w.tail
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go w.read(out)
	return w, nil
}

func (w *workerProc) read(out io.Reader) {
	defer close(w.ended)
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	readyOnce := sync.OnceFunc(func() { close(w.ready) })
	defer readyOnce()
	for sc.Scan() {
		var l workerLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			continue // not a report line
		}
		switch {
		case l.Ready:
			readyOnce()
		case l.Error != "":
			w.setErr(errors.New(l.Error))
		case l.Final != nil:
			w.mu.Lock()
			w.final = l.Final
			w.mu.Unlock()
			w.done.Store(l.Final.Deliveries)
		case l.Done > 0:
			w.done.Store(l.Done)
		}
	}
	w.mu.Lock()
	if w.final == nil && w.err == nil {
		w.err = errors.New("exited before its result")
	}
	w.mu.Unlock()
}

func (w *workerProc) setErr(err error) {
	w.mu.Lock()
	if w.err == nil {
		w.err = err
	}
	w.mu.Unlock()
}

func (w *workerProc) failed() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil && w.final == nil {
		return w.withTail(w.err)
	}
	return nil
}

func (w *workerProc) withTail(err error) error {
	if s := strings.TrimSpace(w.tail.String()); s != "" {
		return fmt.Errorf("%w; its stderr ends: %s", err, s)
	}
	return err
}

// waitReady waits for the worker's pool to be open (a minute at most).
func (w *workerProc) waitReady() error {
	select {
	case <-w.ready:
	case <-time.After(time.Minute):
		return errors.New("not ready after a minute")
	}
	return w.failed()
}

func (w *workerProc) send(line string) { _, _ = io.WriteString(w.in, line+"\n") }

// result waits for the worker's result and its exit.
func (w *workerProc) result() (*ProcResult, error) {
	select {
	case <-w.ended:
	case <-time.After(2 * time.Minute):
		return nil, errors.New("no result two minutes after stop")
	}
	werr := w.cmd.Wait()
	w.in.Close()
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.final == nil {
		return nil, w.withTail(errors.Join(w.err, werr))
	}
	return w.final, nil
}

func (w *workerProc) kill() {
	if w.cmd.Process != nil && w.cmd.ProcessState == nil {
		_ = w.cmd.Process.Kill()
		_ = w.cmd.Wait()
	}
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = t.b[len(t.b)-t.max:]
	}
	t.mu.Unlock()
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}

// WorkerConfig reads a worker's configuration from WorkerEnv; the caller
// sets its Dialect (nil: the driver's registered one).
func WorkerConfig() (Config, int, error) {
	var s workerSpec
	if err := json.Unmarshal([]byte(os.Getenv(WorkerEnv)), &s); err != nil {
		return Config{}, 0, fmt.Errorf("bench worker: bad %s: %w", WorkerEnv, err)
	}
	fl, err := sqlxbroker.ParseForms(s.Form)
	if err != nil || len(fl) != 1 {
		return Config{}, 0, fmt.Errorf("bench worker: form %q: %v", s.Form, err)
	}
	return Config{Driver: s.Driver, DSN: s.DSN, Form: fl[0], Rows: s.Rows, Concurrency: s.Concurrency,
		BatchSize: s.BatchSize, Table: s.Table, CommitDuration: -1, WorkerProfile: s.Profile, Apart: s.Apart}, s.Index, nil
}

// workerProfile is worker i's CPU profile path: base with ".i" added, or
// none.
func workerProfile(base string, i int) string {
	if base == "" {
		return ""
	}
	return base + "." + strconv.Itoa(i)
}

// Worker is a worker process of RunProcs: it opens its pool, prints that
// it is ready, subscribes to c.Table when a line "go" arrives on in with
// c.Concurrency no-op handlers, prints its deliveries so far on out as
// they change (every few milliseconds), and on "stop" (or the end of in)
// stops the subscription and prints its result.
func Worker(ctx context.Context, c Config, index int, in io.Reader, out io.Writer) error {
	var outMu sync.Mutex
	emit := func(l workerLine) {
		line, _ := json.Marshal(l)
		outMu.Lock()
		fmt.Fprintln(out, string(line))
		outMu.Unlock()
	}
	err := worker(ctx, c, index, in, emit)
	if err != nil {
		emit(workerLine{Error: err.Error()})
	}
	return err
}

func worker(ctx context.Context, c Config, index int, in io.Reader, emit func(workerLine)) error {
	if err := c.defaults(); err != nil {
		return err
	}
	db, err := open(c)
	if err != nil {
		return err
	}
	defer db.Close()
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(in)
		for sc.Scan() {
			lines <- strings.TrimSpace(sc.Text())
		}
	}()
	emit(workerLine{Ready: true})
	if l, ok := <-lines; !ok || l != "go" {
		return fmt.Errorf("bench worker: told %q before go", l)
	}
	sb := sqlxbroker.OpenDialect(db, c.Dialect)
	t := Table(c.Table, c.Form)
	if c.Apart && t.AdvisoryLock != "" {
		// Advisory keys are the database's, not a table's: a table of
		// its own has keys of its own too.
		t.AdvisoryLock = c.Table + "-" + t.AdvisoryLock
	}
	var pb probe
	var lastNS atomic.Int64
	h := sqlxbroker.Handler(pb.handle)
	p := sqlxbroker.SubscribeParams{Concurrency: c.Concurrency, BatchSize: c.BatchSize, Logger: quiet(),
		PollInterval: 100 * time.Millisecond,
		OnOutcome: func(d *sqlxbroker.Delivery, o sqlxbroker.Outcome, err error) {
			if pb.outcome(d, o, err) > 0 {
				lastNS.Store(time.Now().UnixNano())
			}
		}}
	var wc Config
	if c.WorkerProfile != "" {
		f, err := os.Create(c.WorkerProfile)
		if err != nil {
			return fmt.Errorf("bench worker: %w", err)
		}
		defer f.Close()
		wc.Profile = f
	}
	w := startWatch(db, wc)
	begin := time.Now()
	s, err := sb.Subscribe(ctx, t, h, p)
	if err != nil {
		w.end(&Result{})
		return err
	}
	// Progress until told to stop.
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	var told int64
loop:
	for {
		select {
		case <-tick.C:
			if n := pb.done.Load(); n != told {
				told = n
				emit(workerLine{Done: n})
			}
		case <-lines:
			break loop // "stop", or the parent went away
		case <-ctx.Done():
			break loop
		}
	}
	stopErr := s.Stop(context.Background())
	var r Result
	w.end(&r)
	fillResult(&r, s.Stats(), &pb.lat)
	r.Deliveries = pb.done.Load()
	w.perDelivery(&r)
	pr := &ProcResult{Index: index, Pid: os.Getpid(), MaxProcs: runtime.GOMAXPROCS(0), Deliveries: r.Deliveries, BeginNS: begin.UnixNano(), LastNS: lastNS.Load(),
		P50Ms: r.P50Ms, P99Ms: r.P99Ms, PeakConns: r.PeakConns, PeakRSSMB: r.PeakRSSMB, CPUMicros: r.CPUMicros, Errors: r.Errors}
	if pr.LastNS == 0 {
		pr.LastNS = pr.BeginNS
	}
	if secs := float64(pr.LastNS-pr.BeginNS) / 1e9; secs > 0 {
		pr.PerSecond = float64(pr.Deliveries) / secs
	}
	emit(workerLine{Final: pr})
	return stopErr
}

// contention samples what the database says while a multi-process drain
// runs (see Contention).
type contention struct {
	c      Config
	db     *sqlx.DB
	tables []string
	pg     bool
	before map[string]int64
	stopc  chan struct{}
	ended  chan struct{}

	samples, active, lock, lw, io int64
	events                        map[string]int64

	// MariaDB and MySQL: Threads_running samples, their sum and most.
	threadSamples, threads, threadsMax int64
	threadHandling                     string
}

func startContention(ctx context.Context, c Config, db *sqlx.DB, tables []string) (*contention, error) {
	k := &contention{c: c, db: db, tables: tables, stopc: make(chan struct{}), ended: make(chan struct{}), events: map[string]int64{}}
	var one int
	k.pg = db.QueryRowContext(ctx, "SELECT 1 FROM pg_stat_activity LIMIT 1").Scan(&one) == nil
	var err error
	if k.before, err = k.counters(ctx); err != nil {
		return nil, err
	}
	switch {
	case k.pg:
		go k.every(k.sampleActivity)
	case len(k.before) > 0:
		// MariaDB or MySQL. MySQL without the thread pool plugin has no
		// thread_handling: it is left empty.
		_ = db.QueryRowContext(ctx, "SELECT @@thread_handling").Scan(&k.threadHandling)
		go k.every(k.sampleThreads)
	default:
		close(k.ended)
	}
	return k, nil
}

// every takes a sample every SampleEvery until the sampling is stopped.
func (k *contention) every(sample func()) {
	defer close(k.ended)
	t := time.NewTicker(SampleEvery)
	defer t.Stop()
	for {
		select {
		case <-k.stopc:
			return
		case <-t.C:
			sample()
		}
	}
}

// sampleThreads counts one sample of the MariaDB or MySQL server's
// Threads_running.
func (k *contention) sampleThreads() {
	var name string
	var n int64
	if k.db.QueryRow("SHOW GLOBAL STATUS LIKE 'Threads_running'").Scan(&name, &n) != nil {
		return
	}
	n-- // the sampling statement itself
	k.threadSamples++
	k.threads += n
	k.threadsMax = max(k.threadsMax, n)
}

// pgActivity counts the run's active statements by wait: those that name
// the table (or, with Config.Apart, any of the tables, whose names hold
// it) and the advisory key statements.
const pgActivity = `SELECT coalesce(wait_event_type, ''), coalesce(wait_event, ''), count(*)
FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid() AND state = 'active'
  AND (query LIKE '%' || $1 || '%' OR query LIKE '%advisory%')
GROUP BY 1, 2`

// sampleActivity counts one sample of pg_stat_activity (pgActivity).
func (k *contention) sampleActivity() {
	rows, err := k.db.Query(pgActivity, k.c.Table) // every table's name holds it
	if err != nil {
		return
	}
	defer rows.Close()
	k.samples++
	for rows.Next() {
		var typ, ev string
		var n int64
		if rows.Scan(&typ, &ev, &n) != nil {
			continue
		}
		k.active += n
		switch typ {
		case "Lock":
			k.lock += n
		case "LWLock":
			k.lw += n
		case "IO":
			k.io += n
		}
		if typ != "" {
			k.events[typ+":"+ev] += n
		}
	}
}

// counters reads the table's (PostgreSQL) or the server's (MariaDB)
// counters.
func (k *contention) counters(ctx context.Context) (map[string]int64, error) {
	out := map[string]int64{}
	if k.pg {
		for _, t := range k.tables {
			var read, fetch int64
			err := k.db.QueryRowContext(ctx, `SELECT coalesce(sum(idx_tup_read), 0)::bigint, coalesce(sum(idx_tup_fetch), 0)::bigint FROM pg_stat_user_indexes WHERE relname = $1`, t).Scan(&read, &fetch)
			if err != nil {
				return nil, fmt.Errorf("bench: pg_stat_user_indexes: %w", err)
			}
			out["idx_tup_read"] += read
			out["idx_tup_fetch"] += fetch
		}
		var commits int64
		if err := k.db.QueryRowContext(ctx, "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()").Scan(&commits); err == nil {
			out["xact_commit"] = commits
		}
		return out, nil
	}
	rows, err := k.db.QueryContext(ctx, `SHOW GLOBAL STATUS WHERE Variable_name IN
		('Innodb_row_lock_waits', 'Innodb_row_lock_time', 'Innodb_rows_read', 'Rows_read', 'Handler_read_key', 'Handler_read_next',
		 'Innodb_buffer_pool_read_requests', 'Com_select', 'Com_update', 'Com_delete', 'Com_commit')`)
	if err != nil {
		return out, nil // not MariaDB or MySQL: nothing to count
	}
	defer rows.Close()
	for rows.Next() {
		var name string
		var v int64
		if err := rows.Scan(&name, &v); err == nil {
			out[name] = v
		}
	}
	return out, rows.Err()
}

// stop ends the sampling and writes what it saw into r. The table's
// statistics reach PostgreSQL's views when the workers' sessions end,
// which is waited for (at most five seconds).
func (k *contention) stop(ctx context.Context, r *ProcsResult) {
	close(k.stopc)
	<-k.ended
	co := &r.Contention
	if k.samples > 0 {
		n := float64(k.samples)
		co.Samples = int(k.samples)
		co.Active, co.LockWaits, co.LWLock, co.IO = float64(k.active)/n, float64(k.lock)/n, float64(k.lw)/n, float64(k.io)/n
		co.WaitEvents = map[string]float64{}
		for e, v := range k.events {
			co.WaitEvents[e] = float64(v) / n
		}
	}
	if r.Deliveries == 0 {
		return
	}
	d := float64(r.Deliveries)
	var after map[string]int64
	var prev int64 = -1
	for end := time.Now().Add(5 * time.Second); ; {
		// PostgreSQL: the workers' sessions report their counts as they
		// end; wait for the counts to reach the deliveries and hold still.
		var err error
		if after, err = k.counters(ctx); err != nil {
			return
		}
		read := after["idx_tup_read"] - k.before["idx_tup_read"]
		if !k.pg || read >= r.Deliveries && read == prev || time.Now().After(end) {
			break
		}
		prev = read
		time.Sleep(250 * time.Millisecond)
	}
	delta := func(name string) int64 { return after[name] - k.before[name] }
	if k.pg {
		co.IndexReadPerDelivery = float64(delta("idx_tup_read")) / d
		co.HeapFetchPerDelivery = float64(delta("idx_tup_fetch")) / d
		co.CommitsPerDelivery = float64(delta("xact_commit")) / d
		return
	}
	if len(after) > 0 {
		co.ServerCountersChecked = true
		co.ThreadHandling = k.threadHandling
		if k.threadSamples > 0 {
			co.ThreadSamples = int(k.threadSamples)
			co.ThreadsRunning = float64(k.threads) / float64(k.threadSamples)
			co.ThreadsRunningMax = k.threadsMax
		}
		co.RowLockWaits = delta("Innodb_row_lock_waits")
		co.RowLockTimeMs = delta("Innodb_row_lock_time")
		rowsRead := "Rows_read"
		if _, ok := after[rowsRead]; !ok {
			rowsRead = "Innodb_rows_read"
		}
		co.RowsReadPerDelivery = float64(delta(rowsRead)) / d
		co.ReadKeyPerDelivery = float64(delta("Handler_read_key")) / d
		co.ReadNextPerDelivery = float64(delta("Handler_read_next")) / d
		co.PageReadsPerDelivery = float64(delta("Innodb_buffer_pool_read_requests")) / d
		co.CommitsPerDelivery = float64(delta("Com_commit")) / d
		co.StatementsPerDelivery = map[string]float64{}
		for _, st := range []string{"select", "update", "delete"} {
			co.StatementsPerDelivery[st] = float64(delta("Com_"+st)) / d
		}
	}
}

// TopWaits lists a contention's wait events, most frequent first, as
// "type:event per-sample".
func (co Contention) TopWaits(n int) string {
	type ev struct {
		name string
		v    float64
	}
	var evs []ev
	for k, v := range co.WaitEvents {
		evs = append(evs, ev{k, v})
	}
	sort.Slice(evs, func(i, j int) bool { return evs[i].v > evs[j].v || evs[i].v == evs[j].v && evs[i].name < evs[j].name })
	var parts []string
	for i, e := range evs {
		if i == n {
			break
		}
		parts = append(parts, fmt.Sprintf("%s %.2f", e.name, e.v))
	}
	return strings.Join(parts, ", ")
}
