package conformance

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/core"
)

// childEnv carries the table a crash child claims from.
const childEnv = "SQLXBROKER_CONFORMANCE_CHILD"

// childMode runs the crash child when the environment asks for it: claim one
// row, say so on stdout, and hang until killed. It reports whether it ran.
func childMode(t *testing.T, tg *Target) bool {
	if os.Getenv(childEnv) == "" {
		return false
	}
	runChild(t, tg)
	return true
}

func runChild(t TB, tg *Target) {
	spec := os.Getenv(childEnv)
	var tb sqlxbroker.Table
	if err := json.Unmarshal([]byte(spec), &tb); err != nil {
		fmt.Printf("ERROR bad %s: %v\n", childEnv, err)
		os.Exit(3)
	}
	b := sqlxbroker.OpenDialect(tg.Open(t), tg.Dialect)
	f, err := b.Form(tb)
	if err == nil {
		err = f.Start(context.Background())
	}
	var cs []core.Claim
	if err == nil {
		cs, err = f.Claim(context.Background(), 1)
	}
	if err != nil || len(cs) != 1 {
		fmt.Printf("ERROR claim: %v (%d rows)\n", err, len(cs))
		os.Exit(3)
	}
	fmt.Printf("CLAIMED %v\n", sqlxbroker.NewDelivery(cs[0]).ID())
	select {} // the handler "runs" until the parent kills the process
}

// CrashRecovery: a child process claims a row, its handler blocks, and the
// parent kills it with SIGKILL. Row-lock and advisory rows come back at
// once (row lock with the attempt uncounted, advisory with it counted);
// lease rows come back after the lease, attempt counted.
func CrashRecovery(t TB, tg *Target, f sqlxbroker.Form) {
	b := tg.broker(t)
	tb := tg.fresh(t, b.DB(), f, nil)
	publish(t, b, tb, msg{Acct: "crash"})
	spec, _ := json.Marshal(tb)
	args := tg.ChildArgs
	if args == nil {
		top := strings.SplitN(t.Name(), "/", 2)[0]
		args = []string{"-test.run=^" + regexp.QuoteMeta(top) + "$", "-test.count=1"}
	}
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), childEnv+"="+string(spec))
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatalf("child stdout: %v", err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start child: %v", err)
	}
	claimed := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			line := sc.Text()
			if strings.HasPrefix(line, "CLAIMED ") || strings.HasPrefix(line, "ERROR ") {
				claimed <- line
				return
			}
		}
		claimed <- "ERROR child exited: " + fmt.Sprint(sc.Err())
	}()
	var line string
	select {
	case line = <-claimed:
	case <-time.After(60 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatalf("the child did not claim within 60s")
	}
	if !strings.HasPrefix(line, "CLAIMED ") {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("child: %s", line)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatalf("kill child: %v", err)
	}
	_ = cmd.Wait()
	killed := time.Now()

	fm := form(t, b, tb)
	want := map[sqlxbroker.Form]int{sqlxbroker.RowLock: 1, sqlxbroker.Lease: 2, sqlxbroker.Advisory: 2}[f]
	if f == sqlxbroker.Lease {
		if cs := claim(t, fm, 1); len(cs) != 0 {
			t.Fatalf("a crashed delivery's lease was claimed before it ran out")
		}
	}
	var cs []core.Claim
	wait := 10 * time.Second
	if f == sqlxbroker.Lease {
		wait += tb.LeaseDuration()
	}
	WaitFor(t, wait, "the crashed delivery's row to come back", func() bool {
		cs = claim(t, fm, 1)
		return len(cs) == 1
	})
	if f != sqlxbroker.Lease && time.Since(killed) > 5*time.Second {
		t.Errorf("the %s row came back %v after the crash, want at once", f, time.Since(killed))
	}
	if a := sqlxbroker.NewDelivery(cs[0]).Attempt(); a != want {
		t.Errorf("after the crash the %s row reports attempt %d, want %d", f, a, want)
	}
	if got := strings.TrimPrefix(line, "CLAIMED "); got != idOf(cs[0]) {
		t.Errorf("recovered row %s, the child held %s", idOf(cs[0]), got)
	}
	complete(t, cs[0], sqlxbroker.Succeeded)
}
