package forms_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/conformance"
	"github.com/sqlxbroker/sqlxbroker/core"
	"github.com/sqlxbroker/sqlxbroker/forms"
)

// TestClaimCursor: claims start from the last row claimed, so a row made
// claimable again behind it (a retry at once) waits for the next full
// scan: the periodic one, or the one a claim makes when nothing is ahead of
// the cursor. It is never left behind.
func TestClaimCursor(t *testing.T) {
	t.Cleanup(func() { forms.SetFullScanEvery(100 * time.Millisecond) })
	forms.SetFullScanEvery(time.Hour)
	ctx := context.Background()
	db, b, tb := leaseTable(t, time.Minute)
	for range 5 {
		if err := b.Publish(ctx, db, tb, map[string]any{"account": "a"}); err != nil {
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
}
