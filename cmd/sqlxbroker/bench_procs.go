package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"runtime"

	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/internal/bench"
)

// procsCompare is a --procs-compare run: one process with all the
// handlers, then Procs processes with a share each, on the same fill.
type procsCompare struct {
	Form        string             `json:"form"`
	Concurrency int                `json:"concurrency"` // handlers in all
	Procs       int                `json:"procs"`
	One         *bench.ProcsResult `json:"one"`
	Many        *bench.ProcsResult `json:"many"`
	Ratio       float64            `json:"ratio"` // Many's deliveries/s over One's
	// Apart (--procs-apart) is Procs processes again, each on a table
	// of its own; ApartRatio its deliveries/s over One's, and Shared
	// Many's over Apart's: what sharing the table costs.
	Apart      *bench.ProcsResult `json:"apart,omitempty"`
	ApartRatio float64            `json:"apart_ratio,omitempty"`
	Shared     float64            `json:"shared_ratio,omitempty"`
	Round      int                `json:"round,omitempty"` // of --rounds, from 1; round r ran One, Many (and Apart) turned by r-1: in round 2 Many first
}

// The runs of one round of --procs-compare.
const (
	kindOne   = iota // one process with all the handlers
	kindMany         // the processes on one table
	kindApart        // the processes on a table each (--procs-apart)
)

// benchWorkerCmd is the command of one worker process: this program in
// bench-worker mode.
var benchWorkerCmd = func() *exec.Cmd { return exec.Command(os.Args[0], "bench-worker") }

// benchProcs runs the multi-process drains of --procs or --procs-compare
// for every form and concurrency; a comparison rounds times, alternating
// which side runs first.
func benchProcs(base bench.Config, forms []sqlxbroker.Form, concs []int, procs, compare, rounds int, shareCPUs, apart, asJSON bool) error {
	ctx := context.Background()
	worker := benchWorkerCmd
	run := func(f sqlxbroker.Form, k, n int, apart bool) (*bench.ProcsResult, error) {
		c := base
		c.Form, c.Concurrency, c.Apart = f, k, apart && n > 1
		if shareCPUs {
			c.WorkerMaxProcs = max(1, runtime.NumCPU()/n)
		}
		if !asJSON {
			tables := ""
			if c.Apart {
				tables = ", a table each"
			}
			fmt.Fprintf(os.Stderr, "%s drain, %d processes x %d handlers%s\n", f, n, k, tables)
		}
		r, err := bench.RunProcs(ctx, c, n, worker)
		if err != nil {
			return nil, fmt.Errorf("bench %s, %d processes x %d handlers: %w", f, n, k, err)
		}
		return r, nil
	}
	var all []*bench.ProcsResult
	var cmps []procsCompare
	for _, f := range forms {
		for _, k := range concs {
			if procs > 0 {
				r, err := run(f, k, procs, apart)
				if err != nil {
					return err
				}
				all = append(all, r)
				if asJSON {
					line, _ := json.Marshal(r)
					fmt.Println(string(line))
				}
				continue
			}
			if k%compare != 0 {
				return fmt.Errorf("bench: --procs-compare %d: --concurrency %d is not a multiple of it", compare, k)
			}
			for round := range rounds {
				// One process, the processes on the table, and with
				// --procs-apart the processes on a table each, in an
				// order that turns from round to round.
				kinds := []int{kindOne, kindMany}
				if apart {
					kinds = append(kinds, kindApart)
				}
				var runs [3]*bench.ProcsResult
				for i := range kinds {
					kind := kinds[(i+round)%len(kinds)]
					n, handlers := compare, k/compare
					if kind == kindOne {
						n, handlers = 1, k
					}
					r, err := run(f, handlers, n, kind == kindApart)
					if err != nil {
						return err
					}
					runs[kind] = r
				}
				one, many := runs[kindOne], runs[kindMany]
				cmp := procsCompare{Form: f.String(), Concurrency: k, Procs: compare, One: one, Many: many, Ratio: many.PerSecond / one.PerSecond}
				if a := runs[kindApart]; a != nil {
					cmp.Apart, cmp.ApartRatio, cmp.Shared = a, a.PerSecond/one.PerSecond, many.PerSecond/a.PerSecond
					all = append(all, a)
				}
				if rounds > 1 {
					cmp.Round = round + 1
				}
				cmps = append(cmps, cmp)
				all = append(all, one, many)
				if asJSON {
					line, _ := json.Marshal(cmp)
					fmt.Println(string(line))
				}
			}
		}
	}
	if !asJSON {
		printProcs(all)
		for _, c := range cmps {
			round := ""
			if c.Round > 0 {
				round = fmt.Sprintf(" (round %d)", c.Round)
			}
			fmt.Printf("%s%s: %d processes x %d handlers %.0f/s, 1 x %d %.0f/s: ratio %.2f\n",
				c.Form, round, c.Procs, c.Concurrency/c.Procs, c.Many.PerSecond, c.Concurrency, c.One.PerSecond, c.Ratio)
			if c.Apart != nil {
				fmt.Printf("%s%s: %d processes on a table each %.0f/s: %.2f of 1 process; on one table %.2f of that\n",
					c.Form, round, c.Procs, c.Apart.PerSecond, c.ApartRatio, c.Shared)
			}
		}
		order := "the processes first in every second"
		if apart {
			order = "one process, the processes on one table and on a table each, in turn first"
		}
		for i := 0; rounds > 1 && i < len(cmps); i += rounds {
			set := cmps[i : i+rounds]
			ratios := make([]float64, len(set))
			apartR, shared := make([]float64, len(set)), make([]float64, len(set))
			for j, c := range set {
				ratios[j], apartR[j], shared[j] = c.Ratio, c.ApartRatio, c.Shared
			}
			fmt.Printf("%s, %d processes over 1 at %d handlers, %d rounds (%s): %s\n",
				set[0].Form, set[0].Procs, set[0].Concurrency, rounds, order, roundRatios(ratios))
			if apart {
				fmt.Printf("%s, %d processes on a table each over 1: %s\n", set[0].Form, set[0].Procs, roundRatios(apartR))
				fmt.Printf("%s, %d processes on one table over a table each: %s\n", set[0].Form, set[0].Procs, roundRatios(shared))
			}
		}
	}
	return nil
}

func printProcs(rs []*bench.ProcsResult) {
	fmt.Printf("\n| form | procs x handlers | rows | deliveries/s | p99 ms | conns | CPU us/delivery | errors | per process (deliveries/s, deliveries, CPU us/delivery) |\n")
	fmt.Printf("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n")
	for _, r := range rs {
		per := ""
		for i, p := range r.PerProcess {
			if i > 0 {
				per += "; "
			}
			per += fmt.Sprintf("%.0f, %d, %.0f", p.PerSecond, p.Deliveries, p.CPUMicros)
		}
		maxProcs := ""
		if len(r.PerProcess) > 0 && r.PerProcess[0].MaxProcs != runtime.NumCPU() {
			maxProcs = fmt.Sprintf(" (GOMAXPROCS %d)", r.PerProcess[0].MaxProcs)
		}
		if r.Apart {
			maxProcs += ", a table each"
		}
		fmt.Printf("| %s | %d x %d%s | %d | %.0f | %.2f | %d | %.1f | %d | %s |\n",
			r.Form, r.Procs, r.Concurrency, maxProcs, r.Rows, r.PerSecond, r.P99Ms, r.PeakConns, r.CPUMicros, r.Errors, per)
	}
	fmt.Println()
	for _, r := range rs {
		co := r.Contention
		label := fmt.Sprintf("%s %d x %d", r.Form, r.Procs, r.Concurrency)
		if r.Apart {
			label += ", a table each"
		}
		switch {
		case co.Samples > 0:
			fmt.Printf("%s: %d samples, per sample %.2f statements running, %.2f waiting on locks, %.2f on LWLocks, %.2f on I/O (%s); per delivery %.2f index entries read, %.2f rows fetched, %.3f commits in the database\n",
				label, co.Samples, co.Active, co.LockWaits, co.LWLock, co.IO, co.TopWaits(4), co.IndexReadPerDelivery, co.HeapFetchPerDelivery, co.CommitsPerDelivery)
		case co.ServerCountersChecked:
			fmt.Printf("%s: InnoDB row lock waits %d (%d ms in all); per delivery %.2f rows read, %.2f index lookups, %.2f index entries read after them, %.1f buffer pool page reads, %.3f commits, %.3f SELECT, %.3f UPDATE, %.3f DELETE (the server's counters, all sessions)\n",
				label, co.RowLockWaits, co.RowLockTimeMs, co.RowsReadPerDelivery, co.ReadKeyPerDelivery, co.ReadNextPerDelivery,
				co.PageReadsPerDelivery, co.CommitsPerDelivery, co.StatementsPerDelivery["select"], co.StatementsPerDelivery["update"], co.StatementsPerDelivery["delete"])
			if co.ThreadSamples > 0 {
				handling := ""
				if co.ThreadHandling != "" {
					handling = ", thread_handling " + co.ThreadHandling
				}
				fmt.Printf("%s: server threads running a statement %.2f on average, %d at most (%d samples%s)\n",
					label, co.ThreadsRunning, co.ThreadsRunningMax, co.ThreadSamples, handling)
			}
		}
	}
}

// benchWorker is the bench-worker mode: a worker process of --procs,
// configured through its environment (bench.WorkerEnv).
func benchWorker() error {
	c, index, err := bench.WorkerConfig()
	if err != nil {
		return err
	}
	if c.Dialect, err = benchDialect(c.Driver, c.DSN); err != nil {
		return err
	}
	return bench.Worker(context.Background(), c, index, os.Stdin, os.Stdout)
}
