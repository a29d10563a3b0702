package forms_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/conformance"
	"github.com/sqlxbroker/sqlxbroker/core"
	"github.com/sqlxbroker/sqlxbroker/dialects/sqlite"
	"github.com/sqlxbroker/sqlxbroker/forms"
)

// TestRenewalAfterALostLease: a claim whose lease ran out stays in work
// while its handler ignores its cancelled context; the other leases of the
// form must go on being renewed. (A renewal round used to be bounded by the
// earliest deadline in work, a past one included, so every round failed at
// once and every lease of the subscription ran out.)
func TestRenewalAfterALostLease(t *testing.T) {
	const lease = time.Second
	ctx := context.Background()
	db, b, tb := leaseTable(t, lease)
	if err := b.Publish(ctx, db, tb, map[string]any{"account": "a"}, map[string]any{"account": "b"}); err != nil {
		t.Fatal(err)
	}
	p, err := b.Plan(tb)
	if err != nil {
		t.Fatal(err)
	}
	f := conformance.StartForm(t, b, tb)
	claimed := time.Now()
	var cs []core.Claim
	for range 2 {
		c, err := f.Claim(ctx, 1)
		if err != nil || len(c) != 1 {
			t.Fatalf("claim: %d claims, %v", len(c), err)
		}
		cs = append(cs, c...)
	}
	lost, kept := cs[0], cs[1]
	// Another claim takes the first row: its renewal finds another token,
	// and its handler (which goes on, ignoring its context) is told.
	if _, err := db.Exec(p.Rebind("UPDATE jobs SET locked_until = ? WHERE id = ?"), p.Time(time.Now().Add(time.Hour)), sqlxbroker.NewDelivery(lost).ID()); err != nil {
		t.Fatal(err)
	}
	conformance.WaitFor(t, 3*lease, "the taken row's claim to be told its lease is lost", func() bool {
		select {
		case <-conformance.Lost(lost):
			return true
		default:
			return false
		}
	})
	// The kept row must be renewed after the lost claim's deadline passed
	// (claimed + lease), more than once.
	want := claimed.Add(2*lease + lease/5)
	conformance.WaitFor(t, 5*lease, "the kept lease to be renewed past "+want.Format(time.StampMilli), func() bool {
		select {
		case <-conformance.Lost(kept):
			t.Fatalf("the kept lease was lost %v after the claim: renewals stopped", time.Since(claimed).Round(time.Millisecond))
		default:
		}
		var s string
		if err := db.Get(&s, p.Rebind("SELECT locked_until FROM jobs WHERE id = ?"), sqlxbroker.NewDelivery(kept).ID()); err != nil {
			t.Fatal(err)
		}
		until, err := time.Parse("2006-01-02 15:04:05.000000", s)
		if err != nil {
			t.Fatal(err)
		}
		return until.After(want)
	})
	if err := conformance.Complete(ctx, kept, sqlxbroker.Outcome{Kind: sqlxbroker.Succeeded}); err != nil {
		t.Errorf("complete the kept row: %v", err)
	}
	if err := conformance.Complete(ctx, lost, sqlxbroker.Outcome{Kind: sqlxbroker.Succeeded}); !errors.Is(err, sqlxbroker.ErrLeaseLost) {
		t.Errorf("complete the taken row: %v, want ErrLeaseLost", err)
	}
}

// TestLeaseGroups: the rows of one claim share one expiry group, a
// renewal moves them to a new one and ends the old, and the last
// completion ends the group: the form keeps nothing of finished claims.
func TestLeaseGroups(t *testing.T) {
	const lease = time.Second
	ctx := context.Background()
	db, b, tb := leaseTable(t, lease)
	if err := b.Publish(ctx, db, tb, map[string]any{"account": "a"}, map[string]any{"account": "b"}, map[string]any{"account": "c"}); err != nil {
		t.Fatal(err)
	}
	p, err := b.Plan(tb)
	if err != nil {
		t.Fatal(err)
	}
	f := conformance.StartForm(t, b, tb)
	cs, err := f.Claim(ctx, 3)
	if err != nil || len(cs) != 3 {
		t.Fatalf("claim: %d claims, %v", len(cs), err)
	}
	if n := forms.LeaseGroups(f); n != 1 {
		t.Fatalf("%d groups after one claim, want 1", n)
	}
	if err := conformance.Complete(ctx, cs[0], sqlxbroker.Outcome{Kind: sqlxbroker.Succeeded}); err != nil {
		t.Fatal(err)
	}
	var first string
	if err := db.Get(&first, p.Rebind("SELECT locked_until FROM jobs WHERE id = ?"), sqlxbroker.NewDelivery(cs[1]).ID()); err != nil {
		t.Fatal(err)
	}
	conformance.WaitFor(t, 3*lease, "the two leases in work to be renewed", func() bool {
		var s []string
		if err := db.Select(&s, "SELECT locked_until FROM jobs"); err != nil {
			t.Fatal(err)
		}
		return len(s) == 2 && s[0] != first && s[1] != first
	})
	if n := forms.LeaseGroups(f); n != 1 {
		t.Errorf("%d groups after a renewal of every lease in work, want 1 (the renewal's)", n)
	}
	for _, c := range cs[1:] {
		if err := conformance.Complete(ctx, c, sqlxbroker.Outcome{Kind: sqlxbroker.Succeeded}); err != nil {
			t.Fatalf("complete a renewed lease: %v", err)
		}
		select {
		case <-conformance.Lost(c):
			t.Errorf("a renewed lease was told lost")
		default:
		}
	}
	if n := forms.LeaseGroups(f); n != 0 {
		t.Errorf("%d groups once every claim completed, want 0", n)
	}
}

// TestCompleteThatGivesUpStopsRenewal: a completion whose context ends
// before the batcher takes it returns an error and leaves the row to come
// back when its lease runs out. It must stop renewing the lease; a claim
// renewed after its completion returned would hold its row for as long as
// the form runs. (It used to: the claim stayed in work.)
func TestCompleteThatGivesUpStopsRenewal(t *testing.T) {
	const lease, rows = time.Second, 16
	ctx := context.Background()
	db, b, tb := leaseTable(t, lease)
	msgs := make([]any, rows)
	for i := range msgs {
		msgs[i] = map[string]any{"account": "a"}
	}
	if err := b.Publish(ctx, db, tb, msgs...); err != nil {
		t.Fatal(err)
	}
	p, err := b.Plan(tb)
	if err != nil {
		t.Fatal(err)
	}
	f := conformance.StartForm(t, b, tb)
	cs, err := f.Claim(ctx, rows)
	if err != nil || len(cs) != rows {
		t.Fatalf("claim: %d claims, %v", len(cs), err)
	}
	gone, cancel := context.WithCancel(ctx)
	cancel()
	gaveUp := 0
	for _, c := range cs {
		// The batcher may take some (their rows are deleted); the rest
		// give up at once.
		if err := conformance.Complete(gone, c, sqlxbroker.Outcome{Kind: sqlxbroker.Succeeded}); err != nil {
			gaveUp++
		}
	}
	t.Logf("%d of %d completions gave up", gaveUp, rows)
	conformance.WaitFor(t, 4*lease, "every lease of a finished claim to run out", func() bool {
		var held int
		if err := db.Get(&held, p.Rebind("SELECT COUNT(*) FROM jobs WHERE locked_until > ?"), p.Time(time.Now())); err != nil {
			t.Fatal(err)
		}
		return held == 0
	})
}

// leaseTable opens a new SQLite database with a lease table "jobs" (an
// account column) and returns it with its broker.
func leaseTable(t *testing.T, lease time.Duration) (*sqlx.DB, *sqlxbroker.Broker, sqlxbroker.Table) {
	t.Helper()
	return sqliteTable(t, sqlxbroker.Table{Name: "jobs", LockedUntil: "locked_until", Lease: lease})
}

// sqliteTable creates tb, with an account column, in a new SQLite file.
func sqliteTable(t *testing.T, tb sqlxbroker.Table) (*sqlx.DB, *sqlxbroker.Broker, sqlxbroker.Table) {
	t.Helper()
	return sqliteTableWith(t, tb, [2]string{"account", "text"})
}

// sqliteTableWith creates tb with the payload columns cols in a new
// SQLite file.
func sqliteTableWith(t *testing.T, tb sqlxbroker.Table, cols ...[2]string) (*sqlx.DB, *sqlxbroker.Broker, sqlxbroker.Table) {
	t.Helper()
	db, err := sqlite.Open(filepath.Join(t.TempDir(), "jobs.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	b, err := sqlxbroker.Open(db)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.CreateTable(context.Background(), tb, cols...); err != nil {
		t.Fatal(err)
	}
	return db, b, tb
}
