// Package conformance is the shared test suite every dialect x claim form
// pair must pass. The built-in dialects run it from their tests; a third
// party runs it for a new dialect; the sqlxbroker command runs it against any
// DSN.
//
//	func TestConformance(t *testing.T) {
//		conformance.Run(t, conformance.Target{
//			Dialect: mydialect.Dialect{},
//			Open:    func(t conformance.TB) *sqlx.DB { ... a new pool on the test database ... },
//		})
//	}
//
// What the suite checks comes from the dialect's capabilities
// (core.CapabilitiesOf), never from its name: every form the dialect offers
// runs every scenario that applies to it, and every form it does not offer
// must fail with sqlxbroker.ErrFormUnavailable. The crash scenario re-runs the
// test binary (os.Args[0]) as a child process with SQLXBROKER_CONFORMANCE_CHILD
// set, so Run must be reached the same way in the child: call it from a
// top-level Test function as above.
//
// The rules a Target must follow:
//
//  1. Open returns a new connection pool on the same database each call;
//     the suite treats each pool as one broker.
//  2. The database must let the suite create and drop tables (the dialect's
//     TableCreator makes them, or Target.CreateTable does).
//  3. Nothing else may write to the suite's tables while it runs; each
//     scenario uses its own freshly named table.
package conformance

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/core"
)

// TB is the part of testing.TB the suite uses; *testing.T satisfies it, and
// the command-line runner has its own.
type TB interface {
	Helper()
	Name() string
	Logf(format string, args ...any)
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
	Skipf(format string, args ...any)
	Failed() bool
	Cleanup(func())
}

// Target is the database under test.
type Target struct {
	// Dialect is the dialect under test.
	Dialect core.Dialect
	// Open returns a new pool on the database under test (rule 1).
	Open func(t TB) *sqlx.DB
	// CreateTable, when set, creates tables instead of the dialect's
	// TableCreator; it must create what broker.TableDDL would.
	CreateTable func(t TB, db *sqlx.DB, table sqlxbroker.Table, payload [][2]string)
	// Short scales volumes down (testing.Short() does too).
	Short bool
	// OldServer, when set, opens a server older than some form needs, and
	// OldServerRefuses lists the forms it must refuse with ErrServerTooOld
	// (the other offered forms must work on it).
	OldServer        func(t TB) *sqlx.DB
	OldServerRefuses []sqlxbroker.Form
	// ChildArgs are the arguments the crash scenario re-runs os.Args[0]
	// with; nil re-runs the current top-level Go test.
	ChildArgs []string
	// Forms, when set, limits the suite to these forms: an offered form
	// left out runs no scenario (the sqlxbroker command leaves out forms
	// the server refuses with ErrServerTooOld, and checks the refusal
	// through OldServer). A form the dialect does not offer is checked
	// for ErrFormUnavailable whether listed or not. Nil runs every form.
	Forms []sqlxbroker.Form
	// Scenarios, when set, limits each form to the scenarios named
	// (Scenario.Name), for a quick run of a target whose full run is
	// recorded elsewhere; the checks of forms not offered or refused
	// (Unavailable, Refused) run whatever it says. Nil runs every one.
	Scenarios []string
	// Refuses lists forms the dialect offers but must refuse on this
	// target at subscribe time with a *sqlxbroker.FormError
	// (ErrFormUnavailable), as PostgreSQL's advisory form behind a pooler
	// in transaction mode: each runs the Refused scenario, which checks
	// the refusal and that the table is left as it was, instead of the
	// form's scenarios.
	Refuses []sqlxbroker.Form
	// Sessions, when set, opens a pool like Open and returns with it a
	// kill that ends, from another session, every server session the pool
	// has opened so far, as a failover or an administrator would, and
	// returns how many it ended (conformance.Sessions makes one from the
	// driver's connector). The scenarios SessionLoss and HolderLost need
	// it and skip, saying so, without it (a database without server
	// sessions, such as SQLite, has nothing to end).
	Sessions func(t TB) (db *sqlx.DB, kill func(t TB) int)
	// Dial, when set, opens a pool like Open whose connections dial makes
	// (lib/pq: Connector.Dialer; go-sql-driver/mysql: Config.DialFunc).
	// The scenarios NetworkStall and NetworkCut put a faulty Network
	// there, and skip, saying so, without it.
	Dial func(t TB, dial DialFunc) *sqlx.DB
	// ScenarioLimit is how long one scenario may run. A scenario still
	// running then ends the program, as go test's -timeout would, but
	// naming the scenario after every goroutine's stack, so a hang is
	// found from the end of a long log. Zero means DefaultScenarioLimit;
	// a negative limit runs scenarios unwatched.
	ScenarioLimit time.Duration
}

// DefaultScenarioLimit is Target.ScenarioLimit's zero value: far longer
// than any scenario takes, even OperationsAtScale's 140,000 deliveries on
// a loaded two-CPU machine under the race detector. Under go test the
// watch ends a scenario sooner when the test binary's -timeout would end
// it first, so the name still comes last.
const DefaultScenarioLimit = 15 * time.Minute

// refuses reports whether f is in tg.Refuses.
func (tg *Target) refuses(f sqlxbroker.Form) bool {
	for _, g := range tg.Refuses {
		if g == f {
			return true
		}
	}
	return false
}

// picks reports whether tg.Scenarios lets scenario name run.
func (tg *Target) picks(name string) bool {
	if tg.Scenarios == nil {
		return true
	}
	for _, n := range tg.Scenarios {
		if n == name {
			return true
		}
	}
	return false
}

// badScenarios names the entries of tg.Scenarios no scenario has.
func (tg *Target) badScenarios() error {
	known := map[string]bool{}
	for _, s := range Scenarios() {
		known[s.Name] = true
	}
	var bad []string
	for _, n := range tg.Scenarios {
		if !known[n] {
			bad = append(bad, fmt.Sprintf("%q", n))
		}
	}
	if bad == nil {
		return nil
	}
	return fmt.Errorf("conformance: Target.Scenarios names no scenario of the suite: %s", strings.Join(bad, ", "))
}

// runs reports whether the suite runs form f's scenarios.
func (tg *Target) runs(f sqlxbroker.Form) bool {
	if tg.Forms == nil {
		return true
	}
	for _, g := range tg.Forms {
		if g == f {
			return true
		}
	}
	return false
}

// Scenario is one check of one form.
type Scenario struct {
	Name string
	// Applies reports whether the scenario checks form f of dialect d.
	Applies func(d core.Dialect, f sqlxbroker.Form) bool
	Run     func(t TB, tg *Target, f sqlxbroker.Form)
}

// Scenarios lists the suite, in the order Run runs it.
func Scenarios() []Scenario {
	all := func(core.Dialect, sqlxbroker.Form) bool { return true }
	only := func(forms ...sqlxbroker.Form) func(core.Dialect, sqlxbroker.Form) bool {
		return func(_ core.Dialect, f sqlxbroker.Form) bool {
			for _, g := range forms {
				if f == g {
					return true
				}
			}
			return false
		}
	}
	fifo := func(d core.Dialect, f sqlxbroker.Form) bool { return core.CapabilitiesOf(d).GroupGuard != nil }
	return []Scenario{
		{"ExactlyOnce", all, ExactlyOnce},
		{"SkipLocked", all, SkipLocked},
		{"CrashRecovery", all, CrashRecovery},
		{"Attempts", all, Attempts},
		{"LeaseLoss", only(sqlxbroker.Lease), LeaseLoss},
		{"Renewal", only(sqlxbroker.Lease), Renewal},
		{"FIFO", fifo, FIFO},
		{"PriorityOrder", all, PriorityOrder},
		{"FIFORefused", func(d core.Dialect, f sqlxbroker.Form) bool { return !fifo(d, f) }, FIFORefused},
		{"AdvisoryKeys", only(sqlxbroker.Advisory), AdvisoryKeys},
		{"AdvisoryBatch", only(sqlxbroker.Advisory), AdvisoryBatch},
		{"AdvisoryFirst", func(d core.Dialect, f sqlxbroker.Form) bool {
			return f == sqlxbroker.Advisory && core.CapabilitiesOf(d).AdvisoryFirstLocker != nil
		}, AdvisoryFirst},
		{"IDMatch", func(d core.Dialect, f sqlxbroker.Form) bool {
			return f == sqlxbroker.Advisory && core.CapabilitiesOf(d).IDMatcher != nil
		}, IDMatch},
		{"LockWaitLimit", func(d core.Dialect, f sqlxbroker.Form) bool {
			if f != sqlxbroker.Advisory {
				return false
			}
			set, _ := core.CapabilitiesOf(d).AdvisoryLocker.LockWaitLimit(time.Second)
			return set != ""
		}, LockWaitLimit},
		{"Outcomes", all, Outcomes},
		{"DeadNow", all, DeadNow},
		{"RetryAfterDelay", all, RetryAfterDelay},
		{"Snoozes", all, Snoozes},
		{"PanicLogged", all, PanicLogged},
		{"Operations", all, Operations},
		{"OperationsAtScale", only(sqlxbroker.Lease), OperationsAtScale},
		{"OperationsPassRowsInWork", only(sqlxbroker.RowLock), OperationsPassRowsInWork},
		{"PublishFields", all, PublishFields},
		{"PublishDuplicates", all, PublishDuplicates},
		{"PublishReadyAt", all, PublishReadyAt},
		{"PublishMetadata", all, PublishMetadata},
		{"PoolLifecycle", all, PoolLifecycle},
		{"SessionLoss", all, SessionLoss},
		{"SessionCrash", all, SessionCrash},
		{"HolderLost", only(sqlxbroker.Advisory), HolderLost},
		{"NetworkStall", only(sqlxbroker.Lease), NetworkStall},
		{"NetworkCut", all, NetworkCut},
		{"BrokenRows", all, BrokenRows},
		{"HandlerTx", only(sqlxbroker.RowLock), HandlerTx},
		{"TxAfterCompletion", only(sqlxbroker.RowLock), TxAfterCompletion},
		{"BadDescriptions", all, BadDescriptions},
		{"HostileKeys", all, HostileKeys},
		{"HostileIdentifiers", all, HostileIdentifiers},
	}
}

// step is one entry of the suite as it runs: a scenario of a form, a
// form's Unavailable check, or (form 0) VersionGate. A form the Target
// leaves out is one step with skip set.
type step struct {
	form sqlxbroker.Form
	name string
	skip string
	run  func(t TB)
}

// steps lists what Run and RunAll run, in order.
func (tg *Target) steps() []step {
	caps := core.CapabilitiesOf(tg.Dialect)
	var out []step
	for _, f := range core.Forms {
		switch {
		case !caps.Offers(f):
			out = append(out, step{form: f, name: "Unavailable", run: func(t TB) { Unavailable(t, tg, f) }})
		case !tg.runs(f):
			out = append(out, step{form: f, skip: fmt.Sprintf("the %s form is left out (Target.Forms)", f)})
		case tg.refuses(f):
			out = append(out, step{form: f, name: "Refused", run: func(t TB) { Refused(t, tg, f) }})
		default:
			for _, s := range Scenarios() {
				if s.Applies(tg.Dialect, f) && tg.picks(s.Name) {
					out = append(out, step{form: f, name: s.Name, run: func(t TB) { s.Run(t, tg, f) }})
				}
			}
		}
	}
	if tg.OldServer != nil {
		out = append(out, step{name: "VersionGate", run: func(t TB) { VersionGate(t, tg) }})
	}
	return out
}

// Run runs every scenario for every form: offered forms as subtests
// "<form>/<scenario>", forms not offered as "<form>/Unavailable", forms the
// target refuses (Target.Refuses) as "<form>/Refused", and VersionGate when
// the Target has an OldServer.
func Run(t *testing.T, tg Target) {
	if childMode(t, &tg) {
		return
	}
	if testing.Short() {
		tg.Short = true
	}
	if err := tg.badScenarios(); err != nil {
		t.Fatal(err)
	}
	steps := tg.steps()
	for _, f := range core.Forms {
		t.Run(f.String(), func(t *testing.T) {
			for _, s := range steps {
				switch {
				case s.form != f:
				case s.skip != "":
					t.Skip(s.skip)
				default:
					t.Run(s.name, func(t *testing.T) { tg.watched(t, s.run) })
				}
			}
		})
	}
	for _, s := range steps {
		if s.form == 0 {
			t.Run(s.name, func(t *testing.T) { tg.watched(t, s.run) })
		}
	}
}

// watched runs a scenario under tg.ScenarioLimit: past it, every
// goroutine's stack goes to standard error and the program panics naming
// the scenario (the panic's own trace is short, so its name ends the log).
func (tg *Target) watched(t TB, run func(TB)) {
	limit := tg.ScenarioLimit
	if limit == 0 {
		limit = DefaultScenarioLimit
	}
	if limit < 0 {
		run(t)
		return
	}
	by := "Target.ScenarioLimit"
	if dt, ok := t.(interface{ Deadline() (time.Time, bool) }); ok {
		// Ahead of go test's own -timeout panic, whose list of running
		// tests comes first in a long dump.
		if end, set := dt.Deadline(); set {
			if left := time.Until(end) - 20*time.Second; left < limit {
				limit, by = max(left, time.Second).Round(time.Second), "go test's -timeout, less 20s"
			}
		}
	}
	timer := time.AfterFunc(limit, func() {
		fmt.Fprintf(os.Stderr, "conformance: %s has run for %v; every goroutine's stack:\n\n%s\n", t.Name(), limit, allStacks())
		panic(fmt.Sprintf("conformance: %s did not end within %v (%s); the goroutines above show where it waits", t.Name(), limit, by))
	})
	defer timer.Stop()
	run(t)
}

// allStacks returns every goroutine's stack, whole.
func allStacks() []byte {
	for buf := make([]byte, 1<<16); ; buf = make([]byte, 2*len(buf)) {
		if n := runtime.Stack(buf, true); n < len(buf) {
			return buf[:n]
		}
	}
}

// suitePayload are the payload columns of the suite's tables.
var suitePayload = [][2]string{{"acct", "text"}, {"grp", "text"}, {"body", "text"}}

// fresh returns a new table description for form f with the suite's
// columns, creates the table, and drops it when the test ends.
func (tg *Target) fresh(t TB, db *sqlx.DB, f sqlxbroker.Form, edit func(*sqlxbroker.Table)) sqlxbroker.Table {
	t.Helper()
	return tg.freshWith(t, db, f, edit, suitePayload)
}

// suiteTable returns a description of a freshly named table of the suite
// for form f (a 2 s lease; the key "acct-{acct}"), not yet created.
func suiteTable(f sqlxbroker.Form) sqlxbroker.Table {
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	tb := sqlxbroker.Table{Name: "cf_" + hex.EncodeToString(rnd[:]), ReadyAt: "ready_at", DeadAt: "dead_at"}
	switch f {
	case sqlxbroker.Lease:
		tb.LockedUntil, tb.Lease = "locked_until", 2*time.Second
	case sqlxbroker.Advisory:
		tb.AdvisoryLock = "acct-{acct}"
	}
	return tb
}

// freshWith is fresh with other payload columns.
func (tg *Target) freshWith(t TB, db *sqlx.DB, f sqlxbroker.Form, edit func(*sqlxbroker.Table), payload [][2]string) sqlxbroker.Table {
	t.Helper()
	tb := suiteTable(f)
	if edit != nil {
		edit(&tb)
	}
	if tg.CreateTable != nil {
		tg.CreateTable(t, db, tb, payload)
	} else {
		b := sqlxbroker.OpenDialect(db, tg.Dialect)
		if err := b.CreateTable(context.Background(), tb, payload...); err != nil {
			t.Fatalf("create table: %v", err)
		}
	}
	t.Cleanup(func() {
		_, _ = db.Exec("DROP TABLE " + tg.Dialect.QuoteIdent(tb.Name))
	})
	return tb
}

// msg is a row the suite publishes.
type msg struct {
	Acct string `db:"acct"`
	Grp  string `db:"grp"`
	Body string `db:"body"`
}

func publish(t TB, b *sqlxbroker.Broker, tb sqlxbroker.Table, msgs ...msg) {
	t.Helper()
	all := make([]any, len(msgs))
	for i := range msgs {
		all[i] = msgs[i]
	}
	if err := b.Publish(context.Background(), b.DB(), tb, all...); err != nil {
		t.Fatalf("publish: %v", err)
	}
}

func (tg *Target) broker(t TB) *sqlxbroker.Broker {
	db := tg.Open(t)
	// The row-lock form holds a connection per delivery; with
	// database/sql's default of 2 idle connections every delivery would
	// open a new one.
	db.SetMaxIdleConns(64)
	return sqlxbroker.OpenDialect(db, tg.Dialect)
}

// WaitFor polls cond every 5 ms until it holds, failing the test when d
// passes first. Dialect tests use it to wait on conditions, not sleeps.
func WaitFor(t TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitDrain waits until done reaches want, failing only when it stops
// moving for stall: a large drain on a loaded machine may be slow, but one
// that makes no progress has failed.
func waitDrain(t TB, stall time.Duration, what string, want int64, done func() int64) {
	t.Helper()
	last, moved := done(), time.Now()
	for last < want {
		time.Sleep(20 * time.Millisecond)
		switch n := done(); {
		case n != last:
			last, moved = n, time.Now()
		case time.Since(moved) > stall:
			t.Fatalf("waiting for %s: %d of %d, and none more in %v", what, n, want, stall)
		}
	}
}

func count(t TB, db *sqlx.DB, d core.Dialect, table, where string, args ...any) int {
	t.Helper()
	var n int
	q := "SELECT COUNT(*) FROM " + d.QuoteIdent(table)
	if where != "" {
		q += " WHERE " + where
	}
	if err := db.QueryRow(sqlx.Rebind(d.BindType(), q), args...).Scan(&n); err != nil {
		t.Fatalf("count %s: %v", table, err)
	}
	return n
}

// StartForm returns b's claim form for tb, started and closed when the test
// ends, for driving claims by hand.
func StartForm(t TB, b *sqlxbroker.Broker, tb sqlxbroker.Table) core.ClaimForm {
	t.Helper()
	return form(t, b, tb)
}

func start(t TB, f core.ClaimForm) core.ClaimForm {
	t.Helper()
	if err := f.Start(context.Background()); err != nil {
		t.Fatalf("start the form: %v", err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func form(t TB, b *sqlxbroker.Broker, tb sqlxbroker.Table) core.ClaimForm {
	t.Helper()
	f, err := b.Form(tb)
	if err != nil {
		t.Fatalf("form: %v", err)
	}
	return start(t, f)
}

func claim(t TB, f core.ClaimForm, n int) []core.Claim {
	t.Helper()
	cs, err := f.Claim(context.Background(), n)
	if err != nil {
		t.Fatalf("claim: %v", err)
	}
	return cs
}

func complete(t TB, c core.Claim, k sqlxbroker.OutcomeKind) {
	t.Helper()
	if err := Complete(context.Background(), c, sqlxbroker.Outcome{Kind: k}); err != nil {
		t.Fatalf("complete %s: %v", k, err)
	}
}

func ids(cs []core.Claim) []string {
	out := make([]string, len(cs))
	for i, c := range cs {
		out[i] = fmt.Sprint(sqlxbroker.NewDelivery(c).ID())
	}
	return out
}

func idOf(c core.Claim) string { return fmt.Sprint(sqlxbroker.NewDelivery(c).ID()) }

func volume(tg *Target, full, short int) int {
	if tg.Short {
		return short
	}
	return full
}

func env(k string) string { return strings.TrimSpace(os.Getenv(k)) }

// DSNTarget is the Target of a database reached by driver and dsn: each Open
// is a new pool, closed when the test ends.
func DSNTarget(d core.Dialect, driver, dsn string) Target {
	return Target{Dialect: d, Open: func(t TB) *sqlx.DB {
		db, err := sqlx.Open(driver, dsn)
		if err != nil {
			t.Fatalf("open %s: %v", driver, err)
		}
		t.Cleanup(func() { db.Close() })
		return db
	}}
}

// Complete records o for a claim made by hand and waits for the form's
// answer: nil, ErrLeaseLost, or the statement's error.
func Complete(ctx context.Context, c core.Claim, o sqlxbroker.Outcome) error {
	defer lostChans.Delete(c)
	done := make(chan error, 1)
	c.Complete(ctx, o, func(err error) { done <- err })
	return <-done
}

var lostChans sync.Map // core.Claim -> chan struct{}

// Lost returns a channel closed once the form's hold on c is lost (the
// form's OnLost), for claims made by hand. A claim gets one such channel,
// whoever asks.
func Lost(c core.Claim) <-chan struct{} {
	ch := make(chan struct{})
	if old, loaded := lostChans.LoadOrStore(c, ch); loaded {
		return old.(chan struct{})
	}
	var once sync.Once
	c.OnLost(func() { once.Do(func() { close(ch) }) })
	return ch
}
