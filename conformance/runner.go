package conformance

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/core"
)

// Result is one scenario's outcome outside a Go test.
type Result struct {
	Form     sqlxbroker.Form
	Scenario string
	Status   string // "pass", "fail" or "skip"
	Took     time.Duration
	Log      []string // what the scenario logged and why it failed
}

// RunAll runs the suite without a Go test harness (the sqlxbroker command
// does), calling progress before and after each scenario. Its crash
// scenario re-runs the current program with tg.ChildArgs, which must reach
// MaybeChild before anything else.
func RunAll(tg Target, progress func(r Result, done bool)) []Result {
	caps := core.CapabilitiesOf(tg.Dialect)
	var out []Result
	run := func(f sqlxbroker.Form, name string, fn func(t TB)) {
		r := Result{Form: f, Scenario: name}
		if progress != nil {
			progress(r, false)
		}
		t := &runT{name: "Conformance/" + f.String() + "/" + name}
		begin := time.Now()
		t.run(fn)
		r.Took, r.Log, r.Status = time.Since(begin), t.log, t.status()
		out = append(out, r)
		if progress != nil {
			progress(r, true)
		}
	}
	for _, f := range core.Forms {
		if !caps.Offers(f) {
			run(f, "Unavailable", func(t TB) { Unavailable(t, &tg, f) })
			continue
		}
		if !tg.runs(f) {
			continue
		}
		for _, s := range Scenarios() {
			if s.Applies(tg.Dialect, f) {
				run(f, s.Name, func(t TB) { s.Run(t, &tg, f) })
			}
		}
	}
	if tg.OldServer != nil {
		run(0, "VersionGate", func(t TB) { VersionGate(t, &tg) })
	}
	return out
}

// MaybeChild runs the crash child and never returns when the environment
// asks for one; otherwise it returns at once.
func MaybeChild(tg Target) {
	if os.Getenv(childEnv) == "" {
		return
	}
	runChild(&runT{name: "child"}, &tg)
}

// runT is a TB for RunAll: Fatalf and Skipf end the scenario's goroutine.
type runT struct {
	name     string
	mu       sync.Mutex
	log      []string
	failed   bool
	skipped  bool
	cleanups []func()
}

func (t *runT) run(fn func(TB)) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer func() {
			if r := recover(); r != nil {
				t.Errorf("panic: %v", r)
			}
		}()
		fn(t)
	}()
	<-done
	for i := len(t.cleanups) - 1; i >= 0; i-- {
		t.cleanups[i]()
	}
}

func (t *runT) status() string {
	switch {
	case t.failed:
		return "fail"
	case t.skipped:
		return "skip"
	}
	return "pass"
}

func (t *runT) Helper()                         {}
func (t *runT) Name() string                    { return t.name }
func (t *runT) add(s string)                    { t.mu.Lock(); t.log = append(t.log, strings.TrimSpace(s)); t.mu.Unlock() }
func (t *runT) Logf(format string, args ...any) { t.add(fmt.Sprintf(format, args...)) }
func (t *runT) Errorf(format string, args ...any) {
	t.add(fmt.Sprintf(format, args...))
	t.mu.Lock()
	t.failed = true
	t.mu.Unlock()
}
func (t *runT) Fatalf(format string, args ...any) { t.Errorf(format, args...); runtime.Goexit() }
func (t *runT) Skipf(format string, args ...any) {
	t.add(fmt.Sprintf(format, args...))
	t.skipped = true
	runtime.Goexit()
}
func (t *runT) Failed() bool     { t.mu.Lock(); defer t.mu.Unlock(); return t.failed }
func (t *runT) Cleanup(f func()) { t.mu.Lock(); t.cleanups = append(t.cleanups, f); t.mu.Unlock() }
