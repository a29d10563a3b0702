package forms_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/conformance"
	"github.com/sqlxbroker/sqlxbroker/forms"
)

// TestClockSkew: the lease form compares deadlines written by one host's
// clock with another's. A broker whose clock is off by less than the lease
// tolerates (ahead: under half the lease, the time a renewed lease has left
// when its next renewal is due; behind: under one lease, the margin of a
// deadline counted as dangling) steals no lease that its holder renews;
// beyond those bounds it does, which shows the bounds are the real ones.
func TestClockSkew(t *testing.T) {
	const lease = 2 * time.Second
	for _, c := range []struct {
		skew   time.Duration
		steals bool
	}{
		{lease / 4, false},
		{-lease * 9 / 10, false},
		{lease * 3 / 4, true},
		{-lease * 3 / 2, true},
	} {
		t.Run(fmt.Sprintf("skew %v", c.skew), func(t *testing.T) {
			ctx := context.Background()
			db, b, tb := leaseTable(t, lease)
			if err := b.Publish(ctx, db, tb, map[string]any{"account": "held"}); err != nil {
				t.Fatal(err)
			}
			holder := conformance.StartForm(t, b, tb)
			held, err := holder.Claim(ctx, 1)
			if err != nil || len(held) != 1 {
				t.Fatalf("claim: %d claims, %v", len(held), err)
			}
			lost := conformance.Lost(held[0])
			skewed := conformance.StartForm(t, b, tb)
			forms.SetClock(skewed, func() time.Time { return time.Now().UTC().Add(c.skew).Truncate(time.Microsecond) })
			// A lease and a half: three renewals, each one's lease checked
			// by the skewed claims up to its next renewal.
			window := lease * 3 / 2
			until := time.Now().Add(window)
			stolen := time.Duration(-1)
			for start := time.Now(); time.Now().Before(until); time.Sleep(10 * time.Millisecond) {
				cs, err := skewed.Claim(ctx, 1)
				if err != nil {
					t.Fatalf("skewed claim: %v", err)
				}
				if len(cs) > 0 {
					stolen = time.Since(start)
					break
				}
			}
			select {
			case <-lost:
				if !c.steals {
					t.Fatalf("the holder lost its lease to its own renewals' failure")
				}
			default:
			}
			switch {
			case c.steals && stolen < 0:
				t.Errorf("a broker %v off took no lease in %v: the bound the docs give is wrong", c.skew, window)
			case !c.steals && stolen >= 0:
				t.Errorf("a broker %v off stole a renewed lease after %v", c.skew, stolen)
			}
			if err := conformance.Complete(ctx, held[0], sqlxbroker.Outcome{Kind: sqlxbroker.Succeeded}); err != nil && !c.steals {
				t.Errorf("the holder's completion: %v", err)
			}
		})
	}
}
