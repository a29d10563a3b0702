package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sqlxbroker/sqlxbroker/internal/bench"
)

// TestBenchProcsCompare runs `bench --procs-compare 2 --json` on an SQLite
// file: one process with all the handlers, then two with half each, every
// row delivered in both, and the ratio printed is theirs. Its workers are
// this test binary again (bench.WorkerEnv set).
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

	out := filepath.Join(t.TempDir(), "out")
	f, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	stdout := os.Stdout
	os.Stdout = f
	err = benchCmd([]string{"--driver", "sqlite", "--dsn", filepath.Join(t.TempDir(), "b.db"), "--form", "lease",
		"--concurrency", "8", "--rows", "600", "--procs-compare", "2", "--json", "--table", "sxb_cli_procs"})
	os.Stdout = stdout
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	text, _ := os.ReadFile(out)
	var c procsCompare
	if err := json.Unmarshal([]byte(strings.TrimSpace(string(text))), &c); err != nil {
		t.Fatalf("not one JSON line: %v\n%s", err, text)
	}
	if c.One == nil || c.Many == nil || c.One.Procs != 1 || c.One.Concurrency != 8 || c.Many.Procs != 2 || c.Many.Concurrency != 4 {
		t.Fatalf("runs: %+v", c)
	}
	if c.One.Deliveries != 600 || c.Many.Deliveries != 600 || len(c.Many.PerProcess) != 2 {
		t.Errorf("deliveries %d and %d (%d processes), want 600 each", c.One.Deliveries, c.Many.Deliveries, len(c.Many.PerProcess))
	}
	if c.Ratio != c.Many.PerSecond/c.One.PerSecond || c.Ratio <= 0 {
		t.Errorf("ratio %v, want %v", c.Ratio, c.Many.PerSecond/c.One.PerSecond)
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
		{[]string{"--procs", "2", "--mode", "steady"}, "drains only"},
	} {
		err := benchCmd(append([]string{"--driver", "sqlite", "--dsn", dsn, "--form", "lease", "--table", "sxb_cli_procs"}, c.args...))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want an error saying %q", c.args, err, c.want)
		}
	}
}
