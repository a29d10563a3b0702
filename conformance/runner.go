package conformance

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/sqlxbroker/sqlxbroker"
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
	var out []Result
	if err := tg.badScenarios(); err != nil {
		return []Result{{Scenario: "Scenarios", Status: "fail", Log: []string{err.Error()}}}
	}
	for _, s := range tg.steps() {
		if s.skip != "" {
			continue
		}
		r := Result{Form: s.form, Scenario: s.name}
		if progress != nil {
			progress(r, false)
		}
		t := &runT{name: "Conformance/" + s.form.String() + "/" + s.name}
		begin := time.Now()
		t.run(func(t TB) { tg.watched(t, s.run) })
		r.Took, r.Log, r.Status = time.Since(begin), t.log, t.status()
		out = append(out, r)
		if progress != nil {
			progress(r, true)
		}
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
