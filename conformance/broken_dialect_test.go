package conformance_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/sqlxbroker/sqlxbroker/conformance"
	"github.com/sqlxbroker/sqlxbroker/core"
	"github.com/sqlxbroker/sqlxbroker/examples/leaseonly"
)

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
			db, err := sqlx.Open(leaseonly.DriverName, "file:"+path+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)")
			if err != nil {
				tb.Fatalf("open: %v", err)
			}
			tb.Cleanup(func() { db.Close() })
			return db
		},
	}
}

// brokenLease claims rows whatever the form's condition says: a lease held
// by another broker is taken again. The suite must catch it.
type brokenLease struct{ leaseonly.Dialect }

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
	// The scenarios that exist to catch it, and two that a dialect
	// ignoring the lease may still pass: the rest of the suite would only
	// wait out its deadlines on a broken dialect.
	tg.Scenarios = []string{"SkipLocked", "ExactlyOnce", "CrashRecovery", "Attempts", "PublishFields"}
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

// withoutSkipper is the example dialect without core.DuplicateSkipper: only
// the interfaces embedded here are promoted.
type withoutSkipper struct {
	core.Dialect
	core.Leaser
	core.TableCreator
}

// TestPublishDuplicatesRefused: PublishDuplicates on a dialect without the
// capability checks the refusal (ErrUnsupported naming the dialect and the
// capability, nothing inserted), and passes.
func TestPublishDuplicatesRefused(t *testing.T) {
	d := leaseonly.Dialect{}
	tg := exampleTarget(t, withoutSkipper{d, d, d})
	tg.Short = true
	if core.CapabilitiesOf(tg.Dialect).DuplicateSkipper != nil {
		t.Fatal("the wrapped dialect still skips duplicates")
	}
	conformance.PublishDuplicates(t, &tg, core.Lease)
}
