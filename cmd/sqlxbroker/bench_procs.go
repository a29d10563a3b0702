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
	Ratio       float64            `json:"ratio"`           // Many's deliveries/s over One's
	Round       int                `json:"round,omitempty"` // of --rounds, from 1; in even rounds Many ran first
}

// benchWorkerCmd is the command of one worker process: this program in
// bench-worker mode.
var benchWorkerCmd = func() *exec.Cmd { return exec.Command(os.Args[0], "bench-worker") }

// benchProcs runs the multi-process drains of --procs or --procs-compare
// for every form and concurrency; a comparison rounds times, alternating
// which side runs first.
func benchProcs(base bench.Config, forms []sqlxbroker.Form, concs []int, procs, compare, rounds int, shareCPUs, asJSON bool) error {
	ctx := context.Background()
	worker := benchWorkerCmd
	run := func(f sqlxbroker.Form, k, n int) (*bench.ProcsResult, error) {
		c := base
		c.Form, c.Concurrency = f, k
		if shareCPUs {
			c.WorkerMaxProcs = max(1, runtime.NumCPU()/n)
		}
		if !asJSON {
			fmt.Fprintf(os.Stderr, "%s drain, %d processes x %d handlers\n", f, n, k)
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
				r, err := run(f, k, procs)
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
				var one, many *bench.ProcsResult
				for _, first := range []bool{round%2 == 0, round%2 == 1} { // true: one process
					n, handlers := compare, k/compare
					if first {
						n, handlers = 1, k
					}
					r, err := run(f, handlers, n)
					if err != nil {
						return err
					}
					if first {
						one = r
					} else {
						many = r
					}
				}
				cmp := procsCompare{Form: f.String(), Concurrency: k, Procs: compare, One: one, Many: many, Ratio: many.PerSecond / one.PerSecond}
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
		}
		for i := 0; rounds > 1 && i < len(cmps); i += rounds {
			set := cmps[i : i+rounds]
			ratios := make([]float64, len(set))
			for j, c := range set {
				ratios[j] = c.Ratio
			}
			fmt.Printf("%s, %d processes over 1 at %d handlers, %d rounds (the processes first in every second): %s\n",
				set[0].Form, set[0].Procs, set[0].Concurrency, rounds, roundRatios(ratios))
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
		fmt.Printf("| %s | %d x %d%s | %d | %.0f | %.2f | %d | %.1f | %d | %s |\n",
			r.Form, r.Procs, r.Concurrency, maxProcs, r.Rows, r.PerSecond, r.P99Ms, r.PeakConns, r.CPUMicros, r.Errors, per)
	}
	fmt.Println()
	for _, r := range rs {
		co := r.Contention
		switch {
		case co.Samples > 0:
			fmt.Printf("%s %d x %d: %d samples, per sample %.2f statements running, %.2f waiting on locks, %.2f on LWLocks, %.2f on I/O (%s); per delivery %.2f index entries read, %.2f rows fetched, %.3f commits in the database\n",
				r.Form, r.Procs, r.Concurrency, co.Samples, co.Active, co.LockWaits, co.LWLock, co.IO, co.TopWaits(4), co.IndexReadPerDelivery, co.HeapFetchPerDelivery, co.CommitsPerDelivery)
		case co.ServerCountersChecked:
			fmt.Printf("%s %d x %d: InnoDB row lock waits %d (%d ms in all); per delivery %.2f rows read, %.2f index lookups, %.2f index entries read after them, %.3f commits, %.3f SELECT, %.3f UPDATE, %.3f DELETE (the server's counters, all sessions)\n",
				r.Form, r.Procs, r.Concurrency, co.RowLockWaits, co.RowLockTimeMs, co.RowsReadPerDelivery, co.ReadKeyPerDelivery, co.ReadNextPerDelivery,
				co.CommitsPerDelivery, co.StatementsPerDelivery["select"], co.StatementsPerDelivery["update"], co.StatementsPerDelivery["delete"])
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
