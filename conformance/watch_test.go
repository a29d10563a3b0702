package conformance_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/sqlxbroker/sqlxbroker/conformance"
	"github.com/sqlxbroker/sqlxbroker/core"
	"github.com/sqlxbroker/sqlxbroker/examples/leaseonly"
)

// hungLease is the example dialect whose claim never returns, as a
// statement stuck behind a lock no timeout covers.
type hungLease struct{ leaseonly.Dialect }

func (hungLease) ClaimLeases(ctx context.Context, on sqlx.ExtContext, p *core.LeaseClaimParams) (*sqlx.Rows, error) {
	time.Sleep(time.Hour)
	return nil, context.DeadlineExceeded
}

const hungChild = "SQLXBROKER_HUNG_SCENARIO_CHILD"

// TestScenarioLimit: a scenario that hangs ends the program once
// Target.ScenarioLimit passes (RunAll), or just before go test's -timeout
// would (Run), and the output ends by naming the scenario, after the stack
// of the goroutine where it waits.
func TestScenarioLimit(t *testing.T) {
	switch os.Getenv(hungChild) {
	case "runall":
		tg := exampleTarget(t, hungLease{})
		tg.Scenarios = []string{"Attempts"}
		tg.ScenarioLimit = 5 * time.Second
		conformance.RunAll(tg, nil)
		t.Fatal("RunAll returned from a hung scenario")
	case "run":
		tg := exampleTarget(t, hungLease{})
		tg.Scenarios = []string{"Attempts"}
		conformance.Run(t, tg)
		t.Fatal("Run returned from a hung scenario")
	}
	for _, c := range []struct {
		mode, timeout, want string
	}{
		{"runall", "10m", "conformance: Conformance/lease/Attempts did not end within 5s (Target.ScenarioLimit)"},
		{"run", "25s", "conformance: TestScenarioLimit/lease/Attempts did not end within 5s (go test's -timeout, less 20s)"},
	} {
		t.Run(c.mode, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestScenarioLimit$", "-test.count=1", "-test.timeout="+c.timeout)
			cmd.Env = append(os.Environ(), hungChild+"="+c.mode)
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			begin := time.Now()
			err := cmd.Run()
			took := time.Since(begin)
			if err == nil {
				t.Fatalf("the program with a hung scenario exited 0:\n%s", out.String())
			}
			if took > time.Minute {
				t.Errorf("the program ended %v after starting a scenario limited to 5s", took)
			}
			text := out.String()
			if !strings.Contains(text, "hungLease.ClaimLeases") {
				t.Errorf("the output has no stack of the hung claim:\n%s", text)
			}
			at := strings.LastIndex(text, c.want)
			if at < 0 {
				t.Fatalf("the output does not name the hung scenario (%q):\n%s", c.want, text)
			}
			if rest := text[at:]; strings.Contains(rest, "hungLease.ClaimLeases") {
				t.Errorf("the scenario's name is not after the goroutines' stacks:\n%s", rest)
			}
		})
	}
}
