package main

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/conformance"
	"github.com/sqlxbroker/sqlxbroker/core"
	_ "github.com/sqlxbroker/sqlxbroker/dialects/mysql"
	_ "github.com/sqlxbroker/sqlxbroker/dialects/postgres"
	_ "github.com/sqlxbroker/sqlxbroker/dialects/sqlite"
)

func conformanceTarget(driver, dsn string, short bool) (conformance.Target, error) {
	d, err := sqlxbroker.Lookup(driver)
	if err != nil {
		return conformance.Target{}, err
	}
	tg := conformance.DSNTarget(d, driver, dsn)
	tg.Short = short
	tg.ChildArgs = []string{"conformance", "--driver", driver, "--dsn", dsn}
	return tg, nil
}

func conformanceCmd(args []string) error {
	fs := flag.NewFlagSet("conformance", flag.ExitOnError)
	driver := fs.String("driver", "", "database/sql driver name: "+strings.Join(sqlxbroker.Dialects(), ", "))
	dsn := fs.String("dsn", "", "data source name of a database the suite may create tables in")
	short := fs.Bool("short", false, "scaled-down volumes")
	_ = fs.Parse(args)
	if *driver == "" || *dsn == "" {
		return fmt.Errorf("conformance: --driver and --dsn are required")
	}
	tg, err := conformanceTarget(*driver, *dsn, *short)
	if err != nil {
		return err
	}
	conformance.MaybeChild(tg)

	db, err := sqlx.Open(*driver, *dsn)
	if err != nil {
		return fmt.Errorf("conformance: open %s: %w", *driver, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	err = db.PingContext(ctx)
	cancel()
	db.Close()
	if err != nil {
		return fmt.Errorf("conformance: cannot reach the %s database: %w", *driver, err)
	}
	fmt.Printf("conformance suite: dialect %s (driver %q), forms offered: %v\n", tg.Dialect.Name(), *driver, core.FormsOf(tg.Dialect))
	results := conformance.RunAll(tg, func(r conformance.Result, done bool) {
		if !done {
			fmt.Printf("  %-9s %-16s ...", formName(r.Form), r.Scenario)
			return
		}
		fmt.Printf(" %s (%.2fs)\n", r.Status, r.Took.Seconds())
		if r.Status != "pass" {
			for _, l := range r.Log {
				fmt.Printf("      %s\n", strings.ReplaceAll(l, "\n", "\n      "))
			}
		}
	})
	return printTable(results)
}

func formName(f core.Form) string {
	if f == 0 {
		return "-"
	}
	return f.String()
}

// printTable prints form x scenario and fails when any scenario failed.
func printTable(results []conformance.Result) error {
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
	fmt.Printf("\n%-16s", "scenario")
	for _, f := range forms {
		fmt.Printf(" %-14s", f)
	}
	fmt.Println()
	failed := 0
	for _, s := range scenarios {
		fmt.Printf("%-16s", s)
		for _, f := range forms {
			c := cell[f+"/"+s]
			if c == "" {
				c = "n/a"
			}
			fmt.Printf(" %-14s", c)
		}
		fmt.Println()
	}
	for _, r := range results {
		if r.Status == "fail" {
			failed++
		}
	}
	fmt.Printf("\n%d passed, %d failed\n", len(results)-failed, failed)
	if failed > 0 {
		return fmt.Errorf("conformance: %d scenario(s) failed", failed)
	}
	return nil
}
