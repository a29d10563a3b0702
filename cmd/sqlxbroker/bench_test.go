package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/sqlxbroker/sqlxbroker/internal/bench"
)

// TestBenchProcsCompare runs `bench --procs-compare 2 --rounds 2
// --share-cpus --procs-apart --json` on an SQLite file: two rounds of one
// process with all the handlers against two with half each, on one table
// and on a table each, every row delivered in each run, the ratios printed
// are theirs, and each worker ran with its share of the CPUs. Its workers are this test binary again
// (bench.WorkerEnv set).
func TestBenchProcsCompare(t *testing.T) {
	if os.Getenv(bench.WorkerEnv) != "" {
		if err := benchWorker(); err != nil {
			os.Exit(1)
		}
		os.Exit(0)
	}
	old := benchWorkerCmd
	benchWorkerCmd = func() *exec.Cmd { return exec.Command(os.Args[0], "-test.run=^TestBenchProcsCompare$") }
	defer func() { benchWorkerCmd = old }()

	lines := benchJSON(t, 2, "--procs-compare", "2", "--rounds", "2", "--share-cpus", "--procs-apart", "--table", "sxb_cli_procs")
	for i, line := range lines {
		var c procsCompare
		if err := json.Unmarshal([]byte(line), &c); err != nil {
			t.Fatalf("line %d: %v\n%s", i+1, err, line)
		}
		if c.Round != i+1 {
			t.Errorf("line %d: round %d", i+1, c.Round)
		}
		checkProcsCompare(t, c)
		if c.Apart == nil || !c.Apart.Apart || c.Many.Apart || c.Apart.Procs != 2 || c.Apart.Deliveries != 600 {
			t.Fatalf("line %d: the run on a table each: %+v", i+1, c.Apart)
		}
		for _, p := range c.Apart.PerProcess {
			if p.Deliveries != 300 {
				t.Errorf("line %d: worker %d on its own table delivered %d, want 300", i+1, p.Index, p.Deliveries)
			}
		}
		if c.ApartRatio != c.Apart.PerSecond/c.One.PerSecond || c.Shared != c.Many.PerSecond/c.Apart.PerSecond {
			t.Errorf("line %d: ratios %v and %v, want %v and %v", i+1, c.ApartRatio, c.Shared,
				c.Apart.PerSecond/c.One.PerSecond, c.Many.PerSecond/c.Apart.PerSecond)
		}
	}
}

func checkProcsCompare(t *testing.T, c procsCompare) {
	t.Helper()
	if c.One == nil || c.Many == nil || c.One.Procs != 1 || c.One.Concurrency != 8 || c.Many.Procs != 2 || c.Many.Concurrency != 4 {
		t.Fatalf("runs: %+v", c)
	}
	if c.One.Deliveries != 600 || c.Many.Deliveries != 600 || len(c.Many.PerProcess) != 2 {
		t.Errorf("deliveries %d and %d (%d processes), want 600 each", c.One.Deliveries, c.Many.Deliveries, len(c.Many.PerProcess))
	}
	if c.Ratio != c.Many.PerSecond/c.One.PerSecond || c.Ratio <= 0 {
		t.Errorf("ratio %v, want %v", c.Ratio, c.Many.PerSecond/c.One.PerSecond)
	}
	for _, r := range []*bench.ProcsResult{c.One, c.Many} {
		want := max(1, runtime.NumCPU()/r.Procs)
		for _, p := range r.PerProcess {
			if p.MaxProcs != want {
				t.Errorf("%d processes: worker %d ran with GOMAXPROCS %d, want %d (--share-cpus)", r.Procs, p.Index, p.MaxProcs, want)
			}
		}
	}
}

// TestBenchProcsBadInput: flags that cannot make a multi-process run are
// refused by name.
func TestBenchProcsBadInput(t *testing.T) {
	dsn := filepath.Join(t.TempDir(), "b.db")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--procs-compare", "3", "--concurrency", "8"}, "not a multiple"},
		{[]string{"--procs", "2", "--procs-compare", "2"}, "exclude each other"},
		{[]string{"--procs-apart"}, "--procs-apart divides the rows of --procs or --procs-compare"},
		{[]string{"--procs", "2", "--mode", "steady"}, "drains only"},
		{[]string{"--rounds", "3"}, "--rounds repeats the comparisons of --floor or --procs-compare"},
		{[]string{"--rounds", "0", "--floor"}, "--rounds 0: want at least 1"},
	} {
		err := benchCmd(append([]string{"--driver", "sqlite", "--dsn", dsn, "--form", "lease", "--table", "sxb_cli_procs"}, c.args...))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want an error saying %q", c.args, err, c.want)
		}
	}
}

// TestBenchFloorRounds runs `bench --floor --rounds 2 --memprofile F
// --json` on an SQLite file: two drains of the lease form, each with its
// floor (the floor first in the second), every row delivered, each
// round's ratio its own drain over its own floor, and F and F.base hold
// allocation profiles.
func TestBenchFloorRounds(t *testing.T) {
	mem := filepath.Join(t.TempDir(), "mem.prof")
	lines := benchJSON(t, 2, "--floor", "--rounds", "2", "--commit-duration", "-1s", "--table", "sxb_cli_floor", "--memprofile", mem)
	for _, name := range []string{mem + ".base", mem} { // the last drain's allocation profiles, gzipped protobuf
		if b, err := os.ReadFile(name); err != nil || len(b) < 2 || b[0] != 0x1f || b[1] != 0x8b {
			t.Errorf("--memprofile: %s: %d bytes, %v; want a gzipped profile", name, len(b), err)
		}
	}
	var rs []bench.Result
	for i, line := range lines {
		var r bench.Result
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("line %d: %v\n%s", i+1, err, line)
		}
		if r.Rows != 600 || r.Errors != 0 || r.PerSecond <= 0 || r.FloorPerSec <= 0 || r.OfFloor != r.PerSecond/r.FloorPerSec {
			t.Errorf("round %d: %d rows, %d errors, %.0f/s, floor %.0f/s, of floor %v", i+1, r.Rows, r.Errors, r.PerSecond, r.FloorPerSec, r.OfFloor)
		}
		if r.FloorFirst != (i == 1) {
			t.Errorf("round %d: floor first %v", i+1, r.FloorFirst)
		}
		rs = append(rs, r)
	}
	line := floorLine(rs)
	want := fmt.Sprintf("%.2f, %.2f; median %.2f", rs[0].OfFloor, rs[1].OfFloor, (rs[0].OfFloor+rs[1].OfFloor)/2)
	if !strings.Contains(line, want) {
		t.Errorf("summary %q does not hold %q", line, want)
	}
}

// benchJSON runs `bench --json` over 600 rows of an SQLite file with 8
// lease handlers and the flags given, and returns its lines, failing
// unless there are want of them.
func benchJSON(t *testing.T, want int, flags ...string) []string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "out")
	f, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	stdout := os.Stdout
	os.Stdout = f
	err = benchCmd(append([]string{"--driver", "sqlite", "--dsn", filepath.Join(t.TempDir(), "b.db"), "--form", "lease",
		"--concurrency", "8", "--rows", "600", "--json"}, flags...))
	os.Stdout = stdout
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	text, _ := os.ReadFile(out)
	lines := strings.Split(strings.TrimSpace(string(text)), "\n")
	if len(lines) != want {
		t.Fatalf("%d JSON lines, want %d (one per round):\n%s", len(lines), want, text)
	}
	return lines
}
