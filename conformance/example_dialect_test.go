package conformance_test

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/glebarez/go-sqlite"
	"github.com/jmoiron/sqlx"
	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/conformance"
	"github.com/sqlxbroker/sqlxbroker/core"
)

// leaseOnly is the worked example of docs/implementing-a-dialect.md: a
// dialect written from scratch for SQLite that offers the lease form only.
// The suite asks it what it can do: it runs every lease scenario and checks
// that the row-lock and advisory forms fail with ErrFormUnavailable.
type leaseOnly struct{}

func (leaseOnly) Name() string               { return "example lease-only SQLite" }
func (leaseOnly) QuoteIdent(s string) string { return `"` + s + `"` }
func (leaseOnly) BindType() int              { return sqlx.QUESTION }
func (leaseOnly) EncodeTime(t time.Time) any { return t.UTC().Format("2006-01-02 15:04:05.000000") }
func (leaseOnly) Features() core.Features {
	return core.Features{DeleteReturning: true, UpdateReturning: true}
}

// ClaimLeases is the one capability: an UPDATE .. RETURNING of the rows the
// form's condition selects.
func (leaseOnly) ClaimLeases(ctx context.Context, on sqlx.ExtContext, p *core.LeaseClaimParams) (*sqlx.Rows, error) {
	pl := p.Plan
	q := fmt.Sprintf(`UPDATE %[1]s SET %[2]s = ?, %[3]s = %[9]s
WHERE %[4]s IN (SELECT %[5]s.%[4]s FROM %[1]s %[5]s WHERE %[6]s ORDER BY %[7]s LIMIT %[8]d) RETURNING *`,
		pl.QTable, pl.QLockedUntil, pl.QAttempt, pl.QID, pl.Alias, p.Where, pl.OrderBy(pl.Alias), p.Limit, pl.NextAttempt(""))
	return on.QueryxContext(ctx, q, append([]any{p.Deadline}, p.Args...)...)
}

// FenceLeases matches a batch of leased rows the portable way.
func (leaseOnly) FenceLeases(p *core.Plan, ids, tokens []any) (string, []any) {
	return core.FencePairs(p, ids, tokens)
}

// CreateTable lets the suite make its tables.
func (d leaseOnly) CreateTable(p *core.DDLParams) ([]string, error) {
	cols := []string{`"id" INTEGER PRIMARY KEY`, `"attempt" INTEGER NOT NULL DEFAULT 1`}
	for _, c := range []string{p.Plan.LockedUntil, p.Plan.ReadyAt, p.Plan.DeadAt, p.Plan.DoneAt, p.Plan.Group} {
		if c != "" {
			cols = append(cols, d.QuoteIdent(c)+" TEXT")
		}
	}
	for _, c := range p.Payload {
		if c[0] != p.Plan.Group {
			cols = append(cols, d.QuoteIdent(c[0])+" TEXT")
		}
	}
	return []string{"CREATE TABLE " + p.Plan.QTable + " (" + strings.Join(cols, ", ") + ")"}, nil
}

func init() {
	// A new driver name for the same driver, and the dialect for it.
	sql.Register("example-sqlite", &sqlite.Driver{})
	sqlxbroker.Register("example-sqlite", leaseOnly{})
}

func exampleTarget(t testing.TB, d core.Dialect) conformance.Target {
	dir := t.TempDir()
	return conformance.Target{
		Dialect: d,
		Open: func(tb conformance.TB) *sqlx.DB {
			// The crash child re-runs this test and must find the same file.
			path := filepath.Join(dir, "example.db")
			if p := getenvDefault("SQLXBROKER_EXAMPLE_FILE", ""); p != "" {
				path = p
			}
			db, err := sqlx.Open("example-sqlite", "file:"+path+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)")
			if err != nil {
				tb.Fatalf("open: %v", err)
			}
			tb.Cleanup(func() { db.Close() })
			return db
		},
	}
}

// TestExampleDialect: the worked example passes the suite.
func TestExampleDialect(t *testing.T) {
	d, err := sqlxbroker.Lookup("example-sqlite")
	if err != nil {
		t.Fatal(err)
	}
	tg := exampleTarget(t, d)
	if getenvDefault("SQLXBROKER_EXAMPLE_FILE", "") == "" {
		t.Setenv("SQLXBROKER_EXAMPLE_FILE", filepath.Join(t.TempDir(), "example.db"))
	}
	tg.Short = true
	conformance.Run(t, tg)
}

// brokenLease claims rows whatever the form's condition says: a lease held
// by another broker is taken again. The suite must catch it.
type brokenLease struct{ leaseOnly }

func (brokenLease) ClaimLeases(ctx context.Context, on sqlx.ExtContext, p *core.LeaseClaimParams) (*sqlx.Rows, error) {
	pl := p.Plan
	q := fmt.Sprintf(`UPDATE %[1]s SET %[2]s = ?, %[3]s = %[6]s
WHERE %[4]s IN (SELECT %[4]s FROM %[1]s ORDER BY %[4]s LIMIT %[5]d) RETURNING *`,
		pl.QTable, pl.QLockedUntil, pl.QAttempt, pl.QID, p.Limit, pl.NextAttempt(""))
	return on.QueryxContext(ctx, q, p.Deadline)
}

// TestBrokenDialectFails: a dialect that ignores the lease fails the suite,
// in the scenarios that exist to catch it.
func TestBrokenDialectFails(t *testing.T) {
	tg := exampleTarget(t, brokenLease{})
	tg.Short = true
	tg.ChildArgs = []string{"-test.run=^TestBrokenDialectFails$"}
	if getenvDefault("SQLXBROKER_EXAMPLE_FILE", "") == "" {
		t.Setenv("SQLXBROKER_EXAMPLE_FILE", filepath.Join(t.TempDir(), "broken.db"))
	}
	conformance.MaybeChild(tg)
	failed := map[string]bool{}
	for _, r := range conformance.RunAll(tg, nil) {
		if r.Status == "fail" {
			failed[r.Form.String()+"/"+r.Scenario] = true
		}
	}
	for _, want := range []string{"lease/SkipLocked", "lease/ExactlyOnce", "lease/CrashRecovery"} {
		if !failed[want] {
			t.Errorf("the broken dialect passed %s", want)
		}
	}
	t.Logf("scenarios failed by the broken dialect: %v", failed)
}
