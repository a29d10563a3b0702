package forms_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/conformance"
	"github.com/sqlxbroker/sqlxbroker/core"
	"github.com/sqlxbroker/sqlxbroker/forms"
)

// TestAdvisoryBatchedDone drains an advisory table with a DoneAt column
// through the engine, whose completions the form queues and writes in
// batches: every row must be marked done once and kept, no two rows of a
// key may run at once, and once the drain is over the subscription holds
// no connection (the key session went back to the pool with its last key).
func TestAdvisoryBatchedDone(t *testing.T) {
	ctx := context.Background()
	db, b, tb := sqliteTable(t, sqlxbroker.Table{Name: "jobs", AdvisoryLock: "acct-{account}", DoneAt: "done_at"})
	const rows, keys = 200, 7
	msgs := make([]any, rows)
	for i := range msgs {
		msgs[i] = map[string]any{"account": fmt.Sprint(i % keys)}
	}
	if err := b.Publish(ctx, db, tb, msgs...); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	inWork, runs := map[string]int{}, map[any]int{}
	s, err := b.Subscribe(ctx, tb, func(ctx context.Context, d *sqlxbroker.Delivery) error {
		mu.Lock()
		runs[d.ID()]++
		if inWork[d.Key()]++; inWork[d.Key()] > 1 {
			t.Errorf("two rows of key %s run at once", d.Key())
		}
		mu.Unlock()
		time.Sleep(time.Millisecond)
		mu.Lock()
		inWork[d.Key()]--
		mu.Unlock()
		return nil
	}, sqlxbroker.SubscribeParams{Concurrency: 16, PollInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	conformance.WaitFor(t, 30*time.Second, "every row marked done", func() bool {
		var n int
		_ = db.Get(&n, "SELECT count(*) FROM jobs WHERE done_at IS NOT NULL")
		return n == rows
	})
	conformance.WaitFor(t, 10*time.Second, "the subscription to hold no connection", func() bool {
		return db.Stats().InUse == 0
	})
	if err := s.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	var total int
	if err := db.Get(&total, "SELECT count(*) FROM jobs"); err != nil || total != rows {
		t.Errorf("%d rows kept (%v), want %d: done rows are marked, not deleted", total, err, rows)
	}
	if st := s.Stats(); st.Succeeded != rows || st.CompleteErrors != 0 {
		t.Errorf("stats %+v, want %d successes and no completion error", st, rows)
	}
	mu.Lock()
	defer mu.Unlock()
	for id, n := range runs {
		if n != 1 {
			t.Errorf("row %v ran %d times", id, n)
		}
	}
}

// TestAdvisoryKeysOutliveSession ends the key session of a dialect whose
// keys the process holds rather than the server (SQLite): its deliveries
// are lost, and their keys must be released all the same, or their rows
// could never be claimed again while the process runs.
func TestAdvisoryKeysOutliveSession(t *testing.T) {
	ctx := context.Background()
	db, b, tb := sqliteTable(t, sqlxbroker.Table{Name: "jobs", AdvisoryLock: "acct-{account}"})
	if err := b.Publish(ctx, db, tb, map[string]any{"account": "a"}, map[string]any{"account": "b"}); err != nil {
		t.Fatal(err)
	}
	f := conformance.StartForm(t, b, tb)
	cs, err := f.Claim(ctx, 2)
	if err != nil || len(cs) != 2 {
		t.Fatalf("claimed %d rows (%v), want 2", len(cs), err)
	}
	forms.EndKeySession(f)
	for _, c := range cs {
		select {
		case <-conformance.Lost(c):
		default:
			t.Fatalf("row %v: not lost with its key session", sqlxbroker.NewDelivery(c).ID())
		}
		if err := conformance.Complete(ctx, c, sqlxbroker.Outcome{Kind: sqlxbroker.Succeeded}); !errors.Is(err, sqlxbroker.ErrLeaseLost) {
			t.Errorf("row %v: completion after the session ended returned %v, want ErrLeaseLost", sqlxbroker.NewDelivery(c).ID(), err)
		}
	}
	again, err := f.Claim(ctx, 2)
	if err != nil || len(again) != 2 {
		t.Fatalf("claimed again %d rows (%v), want both: their keys stayed held", len(again), err)
	}
	for _, c := range again {
		if err := conformance.Complete(ctx, c, sqlxbroker.Outcome{Kind: sqlxbroker.Succeeded}); err != nil {
			t.Error(err)
		}
	}
}

// TestAdvisoryClaimCursor: advisory claims start from the claim cursor, past
// the rows of the form's own deliveries, so a row made claimable again
// behind it (a retry at once) waits for the next full scan: the periodic
// one, or the one a claim makes at once when the rows ahead of the cursor
// are too few. It is never left behind.
func TestAdvisoryClaimCursor(t *testing.T) {
	t.Cleanup(func() { forms.SetFullScanEvery(100 * time.Millisecond) })
	forms.SetFullScanEvery(time.Hour)
	ctx := context.Background()
	db, b, tb := sqliteTable(t, sqlxbroker.Table{Name: "jobs", AdvisoryLock: "acct-{account}"})
	for _, a := range []string{"a", "b", "c", "d", "e"} {
		if err := b.Publish(ctx, db, tb, map[string]any{"account": a}); err != nil {
			t.Fatal(err)
		}
	}
	f := conformance.StartForm(t, b, tb)
	held := map[string]core.Claim{}
	claim := func(want string) {
		t.Helper()
		cs, err := f.Claim(ctx, 1)
		if err != nil || len(cs) != 1 {
			t.Fatalf("claim: %d claims, %v; want row %s", len(cs), err, want)
		}
		got := fmt.Sprint(sqlxbroker.NewDelivery(cs[0]).ID())
		if got != want {
			t.Fatalf("claimed row %s, want %s", got, want)
		}
		held[got] = cs[0]
	}
	retry := func(id string) {
		t.Helper()
		if err := conformance.Complete(ctx, held[id], sqlxbroker.Outcome{Kind: sqlxbroker.Retry}); err != nil {
			t.Fatal(err)
		}
	}
	claim("1")
	claim("2")
	retry("1")
	claim("3") // from the cursor: row 1 waits
	forms.SetFullScanEvery(0)
	claim("1") // the periodic full scan finds it
	forms.SetFullScanEvery(time.Hour)
	claim("4")
	claim("5")
	retry("2")
	claim("2") // nothing ahead of the cursor: a full scan at once
	if cs, err := f.Claim(ctx, 1); err != nil || len(cs) != 0 {
		t.Fatalf("claim with every row held: %d claims, %v", len(cs), err)
	}
	for id, c := range held {
		if err := conformance.Complete(ctx, c, sqlxbroker.Outcome{Kind: sqlxbroker.Succeeded}); err != nil {
			t.Errorf("row %s: %v", id, err)
		}
	}
}

// TestAdvisorySuccessFencedByAttempt: successes are written off the key
// session, each only on a row that still holds the attempt its take
// counted. A row another subscription took since (its attempt counted
// again, as after this form's key session ended unseen) is left as that
// subscription has it, and its completion says ErrLeaseLost; every other
// row completes, alone or in a batch, with or without a DoneAt column.
func TestAdvisorySuccessFencedByAttempt(t *testing.T) {
	ctx := context.Background()
	tables := []sqlxbroker.Table{
		{Name: "fx_fence_adv", AdvisoryLock: "acct-{account}"},
		{Name: "fx_fence_adv_done", AdvisoryLock: "acct-{account}", DoneAt: "done_at"},
	}
	for _, c := range formTables(t, tables, [2]string{"account", "text"}) {
		t.Run(c.name+"/"+c.tb.Name, func(t *testing.T) {
			db, b, tb := c.db, c.b, c.tb
			d := b.Dialect()
			for i := range 5 {
				if err := b.Publish(ctx, db, tb, map[string]any{"account": fmt.Sprint("a", i)}); err != nil {
					t.Fatal(err)
				}
			}
			f := conformance.StartForm(t, b, tb)
			cs, err := f.Claim(ctx, 5)
			if err != nil || len(cs) != 5 {
				t.Fatalf("claimed %d rows (%v), want 5", len(cs), err)
			}
			id := func(c core.Claim) any { return sqlxbroker.NewDelivery(c).ID() }
			attempt := d.QuoteIdent(tb.AttemptColumn())
			retake := func(c core.Claim) {
				t.Helper()
				q := db.Rebind("UPDATE " + d.QuoteIdent(tb.Name) + " SET " + attempt + " = " + attempt + " + 1 WHERE " + d.QuoteIdent(tb.IDColumn()) + " = ?")
				if _, err := db.ExecContext(ctx, q, id(c)); err != nil {
					t.Fatal(err)
				}
			}
			// Alone: one row taken again, one not.
			retake(cs[0])
			if err := conformance.Complete(ctx, cs[0], sqlxbroker.Outcome{Kind: sqlxbroker.Succeeded}); !errors.Is(err, sqlxbroker.ErrLeaseLost) {
				t.Errorf("row %v, taken again: completion returned %v, want ErrLeaseLost", id(cs[0]), err)
			}
			if err := conformance.Complete(ctx, cs[1], sqlxbroker.Outcome{Kind: sqlxbroker.Succeeded}); err != nil {
				t.Errorf("row %v: completion returned %v", id(cs[1]), err)
			}
			// In one batch: the row taken again in the middle.
			retake(cs[3])
			errs := forms.CompleteTogether(f, cs[2:], sqlxbroker.Outcome{Kind: sqlxbroker.Succeeded})
			for i, err := range errs {
				c := cs[2+i]
				if want := c == cs[3]; want != errors.Is(err, sqlxbroker.ErrLeaseLost) || !want && err != nil {
					t.Errorf("row %v in a batch (taken again: %v): completion returned %v", id(c), want, err)
				}
			}
			// Left: the two rows taken again, as their taker has them.
			left := "SELECT " + d.QuoteIdent(tb.IDColumn()) + ", " + attempt + " FROM " + d.QuoteIdent(tb.Name)
			if tb.DoneAt != "" {
				left += " WHERE " + d.QuoteIdent(tb.DoneAt) + " IS NULL"
			}
			rows, err := db.QueryxContext(ctx, left+" ORDER BY 1")
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for rows.Next() {
				var rid, n int64
				if err := rows.Scan(&rid, &n); err != nil {
					t.Fatal(err)
				}
				got = append(got, fmt.Sprintf("%d@%d", rid, n))
			}
			if err := rows.Err(); err != nil {
				t.Fatal(err)
			}
			want := []string{fmt.Sprintf("%v@3", id(cs[0])), fmt.Sprintf("%v@3", id(cs[3]))}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("rows left unfinished (id@attempt) %v, want %v: those taken again, untouched", got, want)
			}
		})
	}
}

// TestAdvisoryKeysParked: the key of a finished delivery stays on the key
// session for the form's next claim, which takes the key's next row
// without the key being free in between; another subscription passes
// over that row meanwhile. A parked key no claim takes is released within
// parkFor, and at once when the form closes.
func TestAdvisoryKeysParked(t *testing.T) {
	ctx := context.Background()
	tables := []sqlxbroker.Table{{Name: "fx_parked_adv", AdvisoryLock: "acct-{account}"}}
	for _, c := range formTables(t, tables, [2]string{"account", "text"}) {
		t.Run(c.name, func(t *testing.T) {
			db, b, tb := c.db, c.b, c.tb
			for range 4 {
				if err := b.Publish(ctx, db, tb, map[string]any{"account": "a"}); err != nil {
					t.Fatal(err)
				}
			}
			claim := func(f core.ClaimForm, want int) []core.Claim {
				t.Helper()
				cs, err := f.Claim(ctx, 10)
				if err != nil || len(cs) != want {
					t.Fatalf("claimed %d rows (%v), want %d", len(cs), err, want)
				}
				return cs
			}
			complete := func(cs []core.Claim) {
				t.Helper()
				for _, c := range cs {
					if err := conformance.Complete(ctx, c, sqlxbroker.Outcome{Kind: sqlxbroker.Succeeded}); err != nil {
						t.Fatal(err)
					}
				}
			}

			forms.SetParkFor(t, time.Hour)
			f1, f2 := conformance.StartForm(t, b, tb), conformance.StartForm(t, b, tb)
			complete(claim(f1, 1))
			claim(f2, 0)           // the key is parked on f1's session
			complete(claim(f1, 1)) // f1 takes the key's next row
			claim(f2, 0)
			if err := f1.Close(); err != nil {
				t.Fatal(err)
			}
			last := claim(f2, 1) // released as f1 closed
			forms.SetParkFor(t, 10*time.Millisecond)
			complete(last) // parked on f2's session, and no claim of f2's takes it
			f3 := conformance.StartForm(t, b, tb)
			conformance.WaitFor(t, 10*time.Second, "another form to claim the last row once the parked key is released", func() bool {
				cs, err := f3.Claim(ctx, 10)
				if err != nil {
					t.Fatal(err)
				}
				complete(cs)
				return len(cs) == 1
			})
		})
	}
}

// TestAdvisoryParkedKeysTried: a claim's keys that are parked are taken
// with no statement and count toward what it wants; its other keys are
// tried. Where the parked keys alone are as many as it wants, the others
// before the last of them are tried all the same (no key is passed over)
// and what is locked beyond the want is parked, not lost: another
// session cannot take it until it is released.
func TestAdvisoryParkedKeysTried(t *testing.T) {
	tables := []sqlxbroker.Table{{Name: "fx_parked_try", AdvisoryLock: "acct-{account}"}}
	for _, c := range formTables(t, tables, [2]string{"account", "text"}) {
		t.Run(c.name, func(t *testing.T) {
			forms.SetParkFor(t, time.Hour)
			f, other := conformance.StartForm(t, c.b, c.tb), conformance.StartForm(t, c.b, c.tb)
			try := func(f core.ClaimForm, keys []string, want int, wantOK string, wantTried int) {
				t.Helper()
				ok, tried, err := forms.TryKeys(f, keys, want)
				if err != nil {
					t.Fatal(err)
				}
				if fmt.Sprint(ok) != wantOK || tried != wantTried {
					t.Errorf("try %v (want %d): took %v, tried %d; want %s, %d", keys, want, ok, tried, wantOK, wantTried)
				}
			}
			try(f, []string{"pk-a", "pk-c"}, 0, "[true true]", 2)
			forms.ParkKeys(f, "pk-a", "pk-c")
			try(f, []string{"pk-x", "pk-a", "pk-y", "pk-c", "pk-z"}, 2, "[true true false false false]", 4)
			if got := fmt.Sprint(forms.ParkedKeys(f)); got != "[pk-c pk-y]" {
				t.Errorf("parked %s, want [pk-c pk-y]: pk-y was locked beyond the want", got)
			}
			try(other, []string{"pk-y", "pk-c", "pk-z"}, 0, "[false false true]", 3)
			try(f, []string{"pk-c", "pk-w"}, 1, "[true false]", 1)
			try(f, []string{"pk-w", "pk-y"}, 0, "[true true]", 2)
			if got := forms.ParkedKeys(f); len(got) != 0 {
				t.Errorf("parked %v, want none: every parked key was taken", got)
			}
		})
	}
}
