package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/core"
	"github.com/sqlxbroker/sqlxbroker/dialects/postgres"
	"github.com/sqlxbroker/sqlxbroker/dialects/sqlite"
	"github.com/sqlxbroker/sqlxbroker/internal/bench"
)

const benchUsage = `usage: sqlxbroker bench --driver NAME --dsn DSN [flags]

Fills a table with --rows messages and drains it with --concurrency handlers
that do nothing (--mode drain), or publishes --rate messages per second for
--duration and measures publish-to-handler latency (--mode steady). Each run
also measures the database's raw commit rate over as many connections as it
used (peak conns) and prints deliveries/s divided by commits/s. --floor
adds, for drains, the rate of the form's own statements run in a tight
loop without the broker, at the same concurrency: what the database
allows the form (row lock: claim, delete, commit per row over as many
connections as handlers; lease: claims of half a batch and their fenced
deletes, two at a time; advisory: candidates, keys tried and rows taken
for half a batch, two at a time, deleted fenced by attempt and their
keys parked on one key session for the next claims, the rest released
together every 10 ms).

--otel instruments the runs with package otelbroker (an OpenTelemetry SDK
meter and tracer provider, every span sampled and dropped by a no-op
exporter) on a table with ReadyAt and Metadata columns; --otel-compare runs
each run twice on such a table, without the adapter and then with it
(--otel-rounds pairs, in alternating order), and prints the median rates
and CPU per delivery and their ratios.
--otel-sample records the spans of that share of the deliveries (the
tracer's sampler: a share of the trace ids), as an application that samples
its traces would; --otel-traces=false measures the metrics alone.

Lists in --form and --concurrency make a sweep: every form at every
concurrency. --json prints one JSON line per run; --svg writes a chart of
the sweep. For SQLite, --dsn may be a plain file path.

--procs N drains one table with N worker processes (this program again),
each with --concurrency handlers: the table is filled once, the workers
start together, and the aggregate (first Subscribe to last completion in
any process) is printed with each process's part and what the database
showed of the claims' contention (PostgreSQL: pg_stat_activity sampled
every 50 ms and the table's index reads per delivery; MariaDB: the
server's InnoDB row lock waits, rows read and buffer pool page reads,
and its threads running a statement, sampled every 50 ms, with its
thread_handling).
--procs-compare N runs one process with --concurrency handlers, then N
processes with a share of them each, on the same fill size, and prints
the ratio of their rates.
--procs-apart gives each worker process a table of its own (the rows
divided among them): the same processes and handlers, with no claim ever
meeting another process's rows. With --procs-compare it is a third run of
each round, and the ratios then split the comparison in two: what the
processes cost apart (a table each over one process) and what sharing
the table costs (one table over a table each).

--share-cpus gives each worker process GOMAXPROCS of its share of the
machine's CPUs (CPUs / processes, at least 1): four Go runtimes that each
schedule on every CPU of a two-CPU machine spend much of it on their own
scheduling and collection, where four hosts or containers with their own
limits would not.

--rounds N repeats each comparison of --floor and --procs-compare N times,
alternating which side runs first (the broker's drain or its floor; one
process or several), and prints every round's ratio and their median: on a
shared machine one pair of runs is not decisive.

flags:
`

func benchCmd(args []string) error {
	fs := flag.NewFlagSet("bench", flag.ExitOnError)
	fs.Usage = func() { fmt.Fprint(os.Stderr, benchUsage); fs.PrintDefaults() }
	driver := fs.String("driver", "", "database/sql driver name: "+drivers())
	dsn := fs.String("dsn", "", "data source name (the run creates and drops its own tables)")
	forms := fs.String("form", "lease", "claim forms, comma-separated: row-lock, lease, advisory, or all")
	mode := fs.String("mode", bench.Drain, "drain or steady")
	rows := fs.Int("rows", 10_000, "drain: backlog to fill and drain")
	conc := fs.String("concurrency", "10", "handlers at once, comma-separated for a sweep")
	batch := fs.Int("batch", 0, "most rows per claim (0: the engine's default, the concurrency)")
	keys := fs.Int("keys", 1000, "distinct advisory keys")
	rate := fs.Int("rate", 200, "steady: messages per second")
	dur := fs.Duration("duration", 10*time.Second, "steady: how long to publish")
	commit := fs.Duration("commit-duration", 3*time.Second, "raw commit loop length (negative: skip)")
	table := fs.String("table", "sqlxbroker_bench", "table to create, fill and drop")
	asJSON := fs.Bool("json", false, "print one JSON line per run instead of the table")
	svg := fs.String("svg", "", "write a chart of the runs (concurrency x deliveries/s) to this SVG file")
	cpuprofile := fs.String("cpuprofile", "", "write a CPU profile of the drain (or steady phase) of the last run to this file (--procs: each worker's, of every run, to this file with .N added)")
	memprofile := fs.String("memprofile", "", "write the allocation profile as the drain (or steady phase) of the last run ends to this file, and as it starts to this file with .base appended (go tool pprof -sample_index=alloc_space -base F.base F)")
	from := fs.String("from", "", "draw --svg from this file of --json lines (all of them, or those whose dialect is --driver's) instead of running")
	title := fs.String("title", "", "the chart's title")
	floor := fs.Bool("floor", false, "drains: also drain a table with the form's statements alone, no broker (floor/s; of floor = deliveries/s over it)")
	withOtel := fs.Bool("otel", false, "instrument the runs with otelbroker (OpenTelemetry SDK, spans dropped)")
	compare := fs.Bool("otel-compare", false, "run each run without and with otelbroker, and print both rates and the ratio")
	rounds := fs.Int("otel-rounds", 1, "--otel-compare: pairs of runs, alternating without and with")
	sample := fs.Float64("otel-sample", 1, "--otel, --otel-compare: share of the deliveries whose span is recorded (1: all; 0: none, metrics only)")
	traces := fs.Bool("otel-traces", true, "--otel, --otel-compare: a span per delivery (false: the metrics alone, a no-op tracer)")
	procs := fs.Int("procs", 0, "drain with this many worker processes of --concurrency handlers each, on one table")
	interval := fs.Duration("interval", 0, "steady: sample the run every interval (deliveries/s, latency, the table's dead rows and size, memory) and compare its first and last five minutes")
	backlog := fs.Int("backlog", 0, "steady: fill this many older rows first; they drain while the steady messages are published")
	prioritized := fs.Bool("prioritized", false, "steady: order the table \"prio DESC, id\" and publish the steady messages ahead of the backlog")
	doneAt := fs.Bool("done-at", false, "a DoneAt table: successes are marked done instead of deleted")
	pruneEvery := fs.Duration("prune-every", 0, "steady, --done-at: prune done rows (Broker.Prune) this often")
	pruneAge := fs.Duration("prune-age", 10*time.Second, "steady, --prune-every: prune rows done longer ago than this")
	holdTx := fs.Bool("hold-tx", false, "steady: keep a transaction open for the whole run, holding back the server's cleanup of dead rows")
	var setup multiFlag
	fs.Var(&setup, "setup", "a statement to run once the table is created ({table}: its quoted name), e.g. per-table autovacuum settings; repeatable")
	label := fs.String("label", "", "the run's name in charts over time (default: dialect and form)")
	procsCompare := fs.Int("procs-compare", 0, "drain with 1 process of --concurrency handlers, then with this many of a share each; print the ratio")
	procsApart := fs.Bool("procs-apart", false, "--procs: each worker process drains a table of its own (the rows divided among them); --procs-compare: also run the processes so, and print what sharing one table costs")
	shareCPUs := fs.Bool("share-cpus", false, "--procs, --procs-compare: each worker process's GOMAXPROCS is its share of the machine's CPUs (CPUs / processes, at least 1), as separate hosts' or containers' limits would give")
	cmpRounds := fs.Int("rounds", 1, "--floor, --procs-compare: run each comparison this many times, alternating which side runs first; print the ratios and their median")
	_ = fs.Parse(args)
	if *rounds < 1 {
		return fmt.Errorf("bench: --otel-rounds %d: want at least 1", *rounds)
	}
	if *cmpRounds < 1 {
		return fmt.Errorf("bench: --rounds %d: want at least 1", *cmpRounds)
	}
	if *cmpRounds > 1 && !*floor && *procsCompare == 0 {
		return errors.New("bench: --rounds repeats the comparisons of --floor or --procs-compare; give one of them")
	}
	if *procsApart && *procs == 0 && *procsCompare == 0 {
		return errors.New("bench: --procs-apart divides the rows of --procs or --procs-compare among the processes; give one of them")
	}
	if *sample < 0 || *sample > 1 {
		return fmt.Errorf("bench: --otel-sample %v: want a share from 0 to 1", *sample)
	}
	if *from != "" {
		return chartFrom(*from, *driver, *svg, *title)
	}
	var profile io.Writer
	if *cpuprofile != "" && *procs == 0 && *procsCompare == 0 {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			return err
		}
		defer f.Close()
		profile = f
	}
	var memBase, mem io.Writer
	if *memprofile != "" {
		for _, x := range []struct {
			name string
			w    *io.Writer
		}{{*memprofile + ".base", &memBase}, {*memprofile, &mem}} {
			f, err := os.Create(x.name)
			if err != nil {
				return err
			}
			defer f.Close()
			*x.w = &lastWriter{f: f}
		}
	}
	if *driver == "" || *dsn == "" {
		fs.Usage()
		return fmt.Errorf("bench: --driver and --dsn are required")
	}
	if *driver == "sqlite" && !strings.HasPrefix(*dsn, "file:") {
		*dsn = sqlite.DSN(*dsn)
	}
	d, err := benchDialect(*driver, *dsn)
	if err != nil {
		return err
	}
	fl, err := benchForms(*forms, d)
	if err != nil {
		return err
	}
	cl, err := parseInts(*conc)
	if err != nil {
		return fmt.Errorf("bench: --concurrency: %w", err)
	}
	logf := func(format string, a ...any) {
		if !*asJSON {
			fmt.Fprintf(os.Stderr, "  "+format+"\n", a...)
		}
	}
	if !*asJSON {
		fmt.Printf("sqlxbroker bench: %s, %s, %d CPUs, %s\n", d.Name(), *mode, runtime.NumCPU(), runtime.Version())
	}
	if *procs > 0 || *procsCompare > 0 {
		if *procs > 0 && *procsCompare > 0 {
			return errors.New("bench: --procs and --procs-compare exclude each other")
		}
		if *mode != bench.Drain {
			return errors.New("bench: --procs and --procs-compare run drains only (--mode drain)")
		}
		base := bench.Config{Driver: *driver, DSN: *dsn, Dialect: d, Rows: *rows, BatchSize: *batch, Keys: *keys,
			Table: *table, Logf: logf, CommitDuration: -1, WorkerProfile: *cpuprofile}
		return benchProcs(base, fl, cl, *procs, *procsCompare, *cmpRounds, *shareCPUs, *procsApart, *asJSON)
	}
	var results []bench.Result
	var compared []string
	for _, f := range fl {
		for _, k := range cl {
			if !*asJSON {
				fmt.Fprintf(os.Stderr, "%s %s concurrency %d\n", f, *mode, k)
			}
			c := bench.Config{Driver: *driver, DSN: *dsn, Dialect: d, Form: f,
				Mode: *mode, Rows: *rows, Concurrency: k, BatchSize: *batch, Keys: *keys, Rate: *rate,
				Duration: *dur, CommitDuration: *commit, Table: *table, Logf: logf, Profile: profile, MemProfileBase: memBase, MemProfile: mem, Floor: *floor,
				Traced: *withOtel || *compare, Interval: *interval, Backlog: *backlog, Prioritized: *prioritized,
				DoneAt: *doneAt, PruneEvery: *pruneEvery, PruneAge: *pruneAge, HoldTx: *holdTx, Label: *label, Setup: setup}
			var base, with []bench.Result
			n := 1
			switch {
			case *compare:
				n = *rounds
			case *floor && *mode == bench.Drain:
				n = *cmpRounds
			}
			for round := range n {
				c := c
				c.FloorFirst = round%2 == 1 // alternate the floor's side too
				order := []bool{false, true}
				if round%2 == 1 { // alternate, so neither is always the second run
					order = []bool{true, false}
				}
				for _, instrumented := range order {
					if !*compare && instrumented != *withOtel {
						continue
					}
					if *compare && !*asJSON {
						fmt.Fprintf(os.Stderr, " round %d, otelbroker %v\n", round+1, instrumented)
					}
					var r *bench.Result
					var err error
					if instrumented {
						r, err = runOtel(c, *sample, *traces)
					} else {
						base := c
						if *compare {
							base.Adapter = sameRows()
						}
						r, err = bench.Run(context.Background(), base)
					}
					if err != nil {
						if r != nil { // a steady run that fell behind: what it measured
							results = append(results, *r)
							if *asJSON {
								line, _ := json.Marshal(r)
								fmt.Println(string(line))
							} else {
								printResults(results)
								printWindows(results)
							}
						}
						return fmt.Errorf("bench %s concurrency %d: %w", f, k, err)
					}
					results = append(results, *r)
					if instrumented {
						with = append(with, *r)
					} else {
						base = append(base, *r)
					}
					if *asJSON {
						line, _ := json.Marshal(r)
						fmt.Println(string(line))
					}
				}
			}
			if *compare {
				compared = append(compared, compareLine(base, with))
			} else if n > 1 {
				compared = append(compared, floorLine(base))
			}
		}
	}
	if !*asJSON {
		printResults(results)
		printWindows(results)
	}
	for _, l := range compared {
		if *asJSON {
			fmt.Fprintln(os.Stderr, l)
		} else {
			fmt.Println(l)
		}
	}
	if *svg != "" {
		out, err := os.Create(*svg)
		if err != nil {
			return err
		}
		if *title == "" {
			*title = fmt.Sprintf("sqlxbroker %s: %s, %d rows", *mode, d.Name(), *rows)
		}
		if err := writeChart(out, *title, results); err != nil {
			out.Close()
			return err
		}
		if err := out.Close(); err != nil {
			return err
		}
	}
	return nil
}

// benchDialect is the dialect registered for driver; PostgreSQL's listens
// for wake-ups on a connection of its own, as postgres.Open gives.
func benchDialect(driver, dsn string) (core.Dialect, error) {
	d, err := sqlxbroker.Lookup(driver)
	if err != nil {
		return nil, err
	}
	if pd, ok := d.(postgres.Dialect); ok && !pd.TransactionPooling {
		// Wake-ups on a listener of their own, as postgres.Open gives
		// (not through a transaction-mode pooler, which cannot LISTEN).
		pd.ListenDSN = dsn
		d = pd
	}
	return d, nil
}

// benchForms reads --form: "all" is every form d offers.
func benchForms(s string, d core.Dialect) ([]sqlxbroker.Form, error) {
	if s == "all" {
		return core.FormsOf(d), nil
	}
	fl, err := sqlxbroker.ParseForms(s)
	if err == nil && len(fl) == 0 {
		err = errors.New("no form given (row-lock, lease, advisory or all)")
	}
	return fl, err
}

func parseInts(s string) ([]int, error) {
	var out []int
	for _, p := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(p))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q is not a positive integer", p)
		}
		out = append(out, n)
	}
	return out, nil
}

// printResults prints one line per run, as docs/performance.md shows them;
// runs of --otel and --otel-compare with a column that names the adapter.
func printResults(rs []bench.Result) {
	named := false
	for _, r := range rs {
		named = named || r.Traced
	}
	col, sep := "", ""
	if named {
		col, sep = " adapter |", " --- |"
	}
	fmt.Printf("\n| form |%s conc | rows | deliveries/s | p50 ms | p99 ms | peak conns | peak RSS MB | CPU us/delivery | commits/s | CPU us/commit | ratio | errors |\n", col)
	fmt.Printf("| --- |%s ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n", sep)
	for _, r := range rs {
		adapter := ""
		if named {
			adapter = " none |"
			if r.Adapter != "" {
				adapter = " " + r.Adapter + " |"
			}
		}
		fmt.Printf("| %s |%s %d | %d | %.0f | %.2f | %.2f | %d | %.0f | %.1f | %.0f | %.1f | %.2f | %d |\n",
			r.Form, adapter, r.Concurrency, r.Rows, r.PerSecond, r.P50Ms, r.P99Ms, r.PeakConns, r.PeakRSSMB, r.CPUMicros, r.CommitsPerSec, r.CommitCPU, r.Ratio, r.Errors)
	}
	fmt.Printf("\n(commits/s: the raw commit loop over as many connections as the run's peak)\n")
	for _, r := range rs {
		if r.FloorPerSec > 0 {
			commits := "" // no commit loop, no ratio to it
			if r.FloorRatio > 0 {
				commits = fmt.Sprintf(" (%.2f of commits/s)", r.FloorRatio)
			}
			fmt.Printf("%s at %d: the form's statements alone %.0f/s on %d connections%s; the broker %.2f of that\n",
				r.Form, r.Concurrency, r.FloorPerSec, r.FloorConns, commits, r.OfFloor)
		}
	}
}

// chartFrom draws the runs of a file of --json lines as an SVG chart: all
// of them, or those of the dialect registered for driver.
func chartFrom(path, driver, svg, title string) error {
	if svg == "" {
		return fmt.Errorf("bench: --from needs --svg")
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	want := ""
	if driver != "" {
		d, err := sqlxbroker.Lookup(driver)
		if err != nil {
			return err
		}
		want = d.Name()
	}
	var rs []bench.Result
	for i, line := range strings.Split(string(data), "\n") {
		if strings.TrimSpace(line) == "" {
			continue
		}
		var r bench.Result
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			return fmt.Errorf("bench: %s line %d: %w", path, i+1, err)
		}
		if want == "" || r.Dialect == want {
			rs = append(rs, r)
		}
	}
	out, err := os.Create(svg)
	if err != nil {
		return err
	}
	if title == "" {
		title = "sqlxbroker bench"
	}
	if err := writeChart(out, title, rs); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// writeChart draws runs sampled over time as panels over time, other runs
// as a sweep over concurrency.
func writeChart(w io.Writer, title string, rs []bench.Result) error {
	for _, r := range rs {
		if len(r.Samples) > 0 {
			return bench.WriteTimeSVG(w, title, rs)
		}
	}
	return bench.WriteSVG(w, title, rs)
}

// printWindows prints, for sampled steady runs, the first and last five
// minutes side by side and their ratios.
func printWindows(rs []bench.Result) {
	for _, r := range rs {
		if r.First == nil || r.Last == nil {
			continue
		}
		f, l := r.First, r.Last
		fmt.Printf("\n%s %s, %d handlers: first %.0f-%.0f s against last %.0f-%.0f s\n", r.Dialect, r.Form, r.Concurrency, f.From, f.To, l.From, l.To)
		fmt.Printf("| window | deliveries/s | p50 ms | p99 ms | dead rows (max) | table MB (max) | heap MB (max) | RSS MB (max) |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
		for _, x := range []struct {
			name string
			w    *bench.Window
		}{{"first", f}, {"last", l}} {
			fmt.Printf("| %s | %.0f | %.2f | %.2f | %d | %.1f | %.1f | %.1f |\n", x.name, x.w.PerSecond, x.w.P50Ms, x.w.P99Ms, x.w.DeadRows, x.w.TableMB, x.w.HeapMB, x.w.RSSMB)
		}
		fmt.Printf("last/first: deliveries/s %.3f, p99 %.3f, RSS %.3f", ratio(l.PerSecond, f.PerSecond), ratio(l.P99Ms, f.P99Ms), ratio(l.RSSMB, f.RSSMB))
		switch {
		case r.BacklogRows > 0 && r.BacklogDrained > 0:
			fmt.Printf("; backlog of %d drained %.1f s into the run", r.BacklogRows, r.BacklogDrained)
		case r.BacklogRows > 0:
			fmt.Printf("; backlog of %d not drained", r.BacklogRows)
		}
		if r.Pruned > 0 {
			fmt.Printf("; %d rows pruned", r.Pruned)
		}
		fmt.Println()
	}
}

// floorLine sums up the rounds of --floor --rounds: each round's broker
// over its floor, and the medians.
func floorLine(rs []bench.Result) string {
	ratios := make([]float64, len(rs))
	for i, r := range rs {
		ratios[i] = r.OfFloor
	}
	return fmt.Sprintf("%s at %d, %d rounds (the floor first in every second): the broker over its floor %s (broker %.0f/s, floor %.0f/s, medians)",
		rs[0].Form, rs[0].Concurrency, len(rs), roundRatios(ratios),
		medianOf(rs, func(r bench.Result) float64 { return r.PerSecond }), medianOf(rs, func(r bench.Result) float64 { return r.FloorPerSec }))
}

// roundRatios lists the ratios of a comparison's rounds in their order and
// their median: "0.79, 0.93, 0.86; median 0.86".
func roundRatios(ratios []float64) string {
	list := make([]string, len(ratios))
	for i, v := range ratios {
		list[i] = fmt.Sprintf("%.2f", v)
	}
	return strings.Join(list, ", ") + fmt.Sprintf("; median %.2f", median(slices.Clone(ratios)))
}

// median is the middle of v (the mean of the two middle values of an even
// count); v is sorted in place.
func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	slices.Sort(v)
	if n := len(v); n%2 == 0 {
		return (v[n/2-1] + v[n/2]) / 2
	}
	return v[len(v)/2]
}

func medianOf(rs []bench.Result, f func(bench.Result) float64) float64 {
	v := make([]float64, len(rs))
	for i, r := range rs {
		v[i] = f(r)
	}
	return median(v)
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// lastWriter keeps only what was written last: each run of a sweep writes
// its allocation profiles (each in one Write), and the file holds the last
// run's.
type lastWriter struct{ f *os.File }

func (l *lastWriter) Write(p []byte) (int, error) {
	if err := l.f.Truncate(0); err != nil {
		return 0, err
	}
	return l.f.WriteAt(p, 0)
}

// multiFlag is a flag that may be given several times.
type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, "; ") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }
