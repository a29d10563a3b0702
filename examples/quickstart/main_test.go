package main

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/sqlxbroker/sqlxbroker/conformance/provision"
	"github.com/sqlxbroker/sqlxbroker/internal/testreport"
)

// TestQuickStart builds the quick start, runs it on SQLite, PostgreSQL
// and MariaDB, waits until it has sent both jobs, sends SIGINT, and wants
// a graceful stop (exit status 0, "stopped") with the table empty.
func TestQuickStart(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "quickstart")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	t.Run("sqlite", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "jobs.db")
		testreport.Tested(t, "SQLite", "a file in a temporary directory")
		runQuickStart(t, bin, "sqlite", path)
		db := sqlx.MustOpen("sqlite", path)
		defer db.Close()
		wantEmpty(t, db)
	})
	for _, c := range []struct {
		name, driver string
		db           provision.Database
	}{{"postgres", "postgres", provision.Postgres}, {"mariadb", "mysql", provision.MariaDB}} {
		t.Run(c.name, func(t *testing.T) {
			dsn := c.db.Get(t)
			db := sqlx.MustOpen(c.driver, dsn)
			defer db.Close()
			if _, err := db.Exec("DROP TABLE IF EXISTS quickstart_jobs"); err != nil {
				t.Fatal(err)
			}
			runQuickStart(t, bin, c.driver, dsn)
			wantEmpty(t, db)
		})
	}
}

func runQuickStart(t *testing.T, bin, driver, dsn string) {
	t.Helper()
	cmd := exec.Command(bin, "-driver", driver, "-dsn", dsn)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var lines []string
	sent := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(out)
		n := 0
		for sc.Scan() {
			mu.Lock()
			lines = append(lines, sc.Text())
			mu.Unlock()
			if strings.HasPrefix(sc.Text(), "sent to ") {
				if n++; n == 2 {
					close(sent)
				}
			}
		}
	}()
	select {
	case <-sent:
	case <-time.After(60 * time.Second):
		cmd.Process.Kill()
		<-done
		t.Fatalf("the quick start did not send both jobs within 60 s; it printed %q", lines)
	}
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	exited := make(chan error, 1)
	go func() { <-done; exited <- cmd.Wait() }()
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("the quick start ended with %v after SIGINT; it printed %q", err, lines)
		}
	case <-ctx.Done():
		cmd.Process.Kill()
		t.Fatal("the quick start did not stop within 40 s of SIGINT")
	}
	mu.Lock()
	defer mu.Unlock()
	want := map[string]bool{"sent to a@example.com": false, "sent to b@example.com": false, "stopped": false}
	for _, l := range lines {
		if _, ok := want[l]; ok {
			if want[l] {
				t.Errorf("printed %q twice: %q", l, lines)
			}
			want[l] = true
		}
	}
	for l, seen := range want {
		if !seen {
			t.Errorf("never printed %q: %q", l, lines)
		}
	}
}

func wantEmpty(t *testing.T, db *sqlx.DB) {
	t.Helper()
	var n int
	if err := db.Get(&n, "SELECT COUNT(*) FROM quickstart_jobs"); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("%d rows left in quickstart_jobs after both jobs were sent, want 0", n)
	}
}
