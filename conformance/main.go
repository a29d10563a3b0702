package conformance

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/core"
)

// Main runs the suite from a command line, as `sqlxbroker conformance` does,
// and returns the process's exit code: 0 when every scenario passed (and
// the forms --expect-refused names, exactly, were refused), 1 when one
// failed or the database cannot be reached, 2 for bad flags. It prints
// each scenario as it runs, then the form x scenario table and one line per
// form for scripts:
//
//	result <form> <pass|refused|unavailable|FAIL> scenarios=N passed=N failed=N took=SECONDS
//
// The flags are --driver (a database/sql driver name with a registered
// dialect), --dsn, --short (scaled-down volumes) and --expect-refused. A
// form the server is too old for (ErrServerTooOld) runs no scenario; the
// version gate checks its refusal and that the other forms subscribe. A
// form the connection cannot serve (ErrFormUnavailable at start, as the
// advisory form with --driver postgres-txpool) runs the Refused scenario. The
// crash scenario re-runs the program with the same arguments, so call Main
// first thing in main, with os.Args[1:]. A dialect's own command:
//
//	package main
//
//	import (
//		"os"
//
//		"github.com/sqlxbroker/sqlxbroker/conformance"
//		_ "example.com/mydialect" // registers the dialect for its driver name
//	)
//
//	func main() { os.Exit(conformance.Main(os.Args[1:])) }
func Main(args []string) int {
	fs := flag.NewFlagSet("conformance", flag.ContinueOnError)
	if err := run(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) || errors.Is(err, errUsage) {
			if !errors.Is(err, flag.ErrHelp) {
				fmt.Fprintln(os.Stderr, err)
			}
			return 2
		}
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

var errUsage = errors.New("conformance: usage")

func run(fs *flag.FlagSet, args []string) error {
	driver := fs.String("driver", "", "database/sql driver name: "+strings.Join(sqlxbroker.Dialects(), ", "))
	dsn := fs.String("dsn", "", "data source name of a database the suite may create tables in")
	short := fs.Bool("short", false, "scaled-down volumes")
	var expect []sqlxbroker.Form
	expectSet := false
	fs.Func("expect-refused", "comma-separated forms the server must refuse at subscribe time (ErrServerTooOld, or ErrFormUnavailable as behind a transaction-mode pooler), e.g. advisory (\"none\": none); the run fails unless exactly these are refused", func(s string) error {
		fl, err := parseForms(s)
		expect, expectSet = fl, true
		return err
	})
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if *driver == "" || *dsn == "" {
		return fmt.Errorf("%w: --driver and --dsn are required", errUsage)
	}
	d, err := sqlxbroker.Lookup(*driver)
	if err != nil {
		return err
	}
	tg := DSNTarget(d, *driver, *dsn)
	tg.Short = *short
	tg.ChildArgs = os.Args[1:] // the crash child re-runs this command line
	MaybeChild(tg)

	db, err := sqlx.Open(*driver, *dsn)
	if err != nil {
		return fmt.Errorf("conformance: open %s: %w", *driver, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	err = db.PingContext(ctx)
	var refused map[sqlxbroker.Form]error
	if err == nil {
		refused, err = refusedForms(ctx, tg.Dialect, db)
	}
	cancel()
	db.Close()
	if err != nil {
		return fmt.Errorf("conformance: cannot reach the %s database: %w", *driver, err)
	}
	fmt.Printf("conformance suite: dialect %s (driver %q), forms offered: %v\n", tg.Dialect.Name(), *driver, core.FormsOf(tg.Dialect))
	if len(refused) > 0 {
		// Forms the server is too old for run no scenario; the version
		// gate checks that subscribing to them fails with ErrServerTooOld
		// and that the other forms subscribe on the same server. Forms
		// refused with ErrFormUnavailable (a FormError: the connection
		// cannot serve them) run the Refused scenario alone.
		tg.Forms = nil
		for _, f := range core.FormsOf(tg.Dialect) {
			switch err := refused[f]; {
			case err == nil:
				tg.Forms = append(tg.Forms, f)
			case errors.Is(err, sqlxbroker.ErrServerTooOld):
				tg.OldServerRefuses = append(tg.OldServerRefuses, f)
				tg.OldServer = tg.Open
				fmt.Printf("  %-9s refused: server too old (%v)\n", f, err)
			default:
				tg.Forms, tg.Refuses = append(tg.Forms, f), append(tg.Refuses, f)
				fmt.Printf("  %-9s refused: %v\n", f, err)
			}
		}
		tg.Forms = append(tg.Forms, 0) // non-nil: only the forms listed
	}
	results := RunAll(tg, func(r Result, done bool) {
		if !done {
			fmt.Printf("  %-9s %-18s ...", formName(r.Form), r.Scenario)
			return
		}
		fmt.Printf(" %s (%.2fs)\n", r.Status, r.Took.Seconds())
		if r.Status != "pass" {
			for _, l := range r.Log {
				fmt.Printf("      %s\n", strings.ReplaceAll(l, "\n", "\n      "))
			}
		}
	})
	err = printTable(results, refused)
	if expectSet {
		var got []sqlxbroker.Form
		for _, f := range core.Forms {
			if refused[f] != nil {
				got = append(got, f)
			}
		}
		if formNames(got) != formNames(expect) {
			err = errors.Join(err, fmt.Errorf("conformance: the server refused %s, --expect-refused says %s", formNames(got), formNames(expect)))
		} else {
			fmt.Printf("refused as expected: %s\n", formNames(expect))
		}
	}
	return err
}

// refusedForms asks the dialect's Starter, for each offered form, whether
// the server is too old for it or the connection cannot serve it (a
// description of the suite's, no table): the forms it refuses with
// ErrServerTooOld or ErrFormUnavailable, with the refusal. Any other
// failure of the check is returned: no scenario could pass on such a
// connection.
func refusedForms(ctx context.Context, d core.Dialect, db *sqlx.DB) (map[sqlxbroker.Form]error, error) {
	out := map[sqlxbroker.Form]error{}
	s := core.CapabilitiesOf(d).Starter
	if s == nil {
		return out, nil
	}
	pool := core.NewPool(db, d)
	defer pool.Close()
	for _, f := range core.FormsOf(d) {
		p, err := sqlxbroker.NewPlan(d, suiteTable(f))
		if err != nil {
			return nil, err
		}
		stop, err := s.Start(ctx, pool, p)
		if stop != nil {
			_ = stop()
		}
		switch {
		case errors.Is(err, sqlxbroker.ErrServerTooOld), errors.Is(err, sqlxbroker.ErrFormUnavailable):
			out[f] = err
		case err != nil:
			return nil, fmt.Errorf("check the server for the %s form: %w", f, err)
		}
	}
	return out, nil
}

// parseForms reads a list of form names (sqlxbroker.ParseForms); "none"
// is the empty list.
func parseForms(s string) ([]sqlxbroker.Form, error) {
	if strings.TrimSpace(s) == "none" {
		return nil, nil
	}
	return sqlxbroker.ParseForms(s)
}

// formNames renders forms in core.Forms order, "none" for none.
func formNames(fl []sqlxbroker.Form) string {
	var names []string
	for _, f := range core.Forms {
		for _, g := range fl {
			if f == g {
				names = append(names, f.String())
				break
			}
		}
	}
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ",")
}

func formName(f sqlxbroker.Form) string {
	if f == 0 {
		return "-"
	}
	return f.String()
}

// printTable prints form x scenario, then one line per form for scripts:
//
//	result <form> <pass|refused|unavailable|FAIL> scenarios=N passed=N failed=N took=SECONDS
//
// and fails when any scenario failed. A form the server is too old for is
// "refused" when the version gate passed (the refusal is ErrServerTooOld),
// one refused with ErrFormUnavailable when its Refused scenario passed;
// else FAIL.
func printTable(results []Result, refused map[sqlxbroker.Form]error) error {
	var scenarios []string
	seen := map[string]bool{}
	cell := map[string]string{}
	for _, r := range results {
		if !seen[r.Scenario] {
			seen[r.Scenario] = true
			scenarios = append(scenarios, r.Scenario)
		}
		cell[formName(r.Form)+"/"+r.Scenario] = fmt.Sprintf("%s %.1fs", r.Status, r.Took.Seconds())
	}
	forms := []string{}
	for _, f := range core.Forms {
		forms = append(forms, f.String())
	}
	fmt.Printf("\n%-18s", "scenario")
	for _, f := range forms {
		fmt.Printf(" %-14s", f)
	}
	fmt.Println()
	for _, s := range scenarios {
		fmt.Printf("%-18s", s)
		for _, f := range core.Forms {
			c := cell[f.String()+"/"+s]
			switch {
			case c != "":
			case refused[f] != nil && s != "VersionGate":
				c = "refused"
			default:
				c = "n/a"
			}
			fmt.Printf(" %-14s", c)
		}
		fmt.Println()
	}
	failed := 0
	gate := "pass"
	type sum struct {
		n, passed, failed int
		took              time.Duration
		unavailable       bool
	}
	per := map[sqlxbroker.Form]*sum{}
	for _, r := range results {
		if r.Status == "fail" {
			failed++
		}
		if r.Form == 0 {
			if r.Status == "fail" {
				gate = "fail"
			}
			continue
		}
		s := per[r.Form]
		if s == nil {
			s = &sum{}
			per[r.Form] = s
		}
		s.n++
		s.took += r.Took
		s.unavailable = s.unavailable || r.Scenario == "Unavailable"
		if r.Status == "fail" {
			s.failed++
		} else if r.Status == "pass" {
			s.passed++
		}
	}
	fmt.Println()
	for _, f := range core.Forms {
		s := per[f]
		if s == nil {
			s = &sum{}
		}
		status := "pass"
		switch tooOld := errors.Is(refused[f], sqlxbroker.ErrServerTooOld); {
		case refused[f] != nil && !tooOld && s.failed == 0 && s.n > 0:
			status = "refused"
		case refused[f] != nil && tooOld && gate == "pass":
			status = "refused"
		case refused[f] != nil:
			status = "FAIL"
		case s.failed > 0 || s.n == 0:
			status = "FAIL"
		case s.unavailable:
			status = "unavailable"
		}
		fmt.Printf("result %s %s scenarios=%d passed=%d failed=%d took=%.1f\n", f, status, s.n, s.passed, s.failed, s.took.Seconds())
	}
	fmt.Printf("\n%d passed, %d failed\n", len(results)-failed, failed)
	if failed > 0 {
		return fmt.Errorf("conformance: %d scenario(s) failed", failed)
	}
	return nil
}
