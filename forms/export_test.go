package forms

import (
	"context"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/sqlxbroker/sqlxbroker/core"
)

// SetFullScanEvery sets how often claims scan from the first row, until
// the test ends.
func SetFullScanEvery(d time.Duration) { fullScanEvery = d }

// SetRescannedHook runs fn as each rescan's claim reports its rows, after
// its statement and before the cursor learns of them, until t ends.
func SetRescannedHook(t testing.TB, fn func()) {
	t.Cleanup(func() { rescannedHook = nil })
	rescannedHook = fn
}

// SetByIDHook runs fn for each row a row-lock claim locks by ID
// (core.RowLockSQL.ByID), until t ends.
func SetByIDHook(t testing.TB, fn func()) {
	t.Cleanup(func() { byIDHook = nil })
	byIDHook = fn
}

// SetFloorEvery sets how long a floor serves full scans before it is read
// again.
func SetFloorEvery(d time.Duration) { floorEvery = d }

// EndKeySession ends the session that holds an advisory form's keys, as a
// failed statement on it does.
func EndKeySession(f core.ClaimForm) {
	a := unwrap(f).(*advisory)
	a.keys.mu.Lock()
	defer a.keys.mu.Unlock()
	if a.keys.sess != nil {
		a.keys.fail()
	}
}

// SetClock makes a lease form read the time from clock.
func SetClock(f core.ClaimForm, clock func() time.Time) {
	unwrap(f).(*lease).clock = clock
}

// LeaseGroups is how many expiry groups a lease form watches.
func LeaseGroups(f core.ClaimForm) int {
	l := unwrap(f).(*lease)
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.groups)
}

// unwrap is the form under the wrappers around f.
func unwrap(f core.ClaimForm) core.ClaimForm {
	for u, ok := f.(interface{ Unwrap() core.ClaimForm }); ok; u, ok = f.(interface{ Unwrap() core.ClaimForm }) {
		f = u.Unwrap()
	}
	return f
}

// CompleteTogether completes the claims of an advisory form with o in
// one batch, as its batcher writes the completions that queued together,
// and returns each completion's result.
func CompleteTogether(f core.ClaimForm, cs []core.Claim, o core.Outcome) []error {
	a := unwrap(f).(*advisory)
	errs := make([]error, len(cs))
	batch := make([]*advisoryClaim, len(cs))
	for i, c := range cs {
		ac := c.(*advisoryClaim)
		ac.o, ac.done = o, func(err error) { errs[i] = err }
		batch[i] = ac
	}
	a.flush(batch)
	return errs
}

// SetParkFor sets how long an advisory form keeps the key of a finished
// delivery for its next claims, until t ends.
func SetParkFor(t testing.TB, d time.Duration) {
	old := parkFor
	t.Cleanup(func() { parkFor = old })
	parkFor = d
}

// TryKeys tries keys on an advisory form's key session as its claims do,
// with want as a claim's wave gives it, and returns which it took and how
// many it tried.
func TryKeys(f core.ClaimForm, keys []string, want int) ([]bool, int, error) {
	ok, tried, _, err := unwrap(f).(*advisory).keys.try(context.Background(), keys, want)
	return ok, tried, err
}

// ParkKeys parks keys that an advisory form's key session holds, as the
// completions of their deliveries do.
func ParkKeys(f core.ClaimForm, keys ...string) {
	h := &unwrap(f).(*advisory).keys
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, k := range keys {
		h.parkKey(k)
	}
}

// ParkedKeys lists the keys an advisory form has parked, sorted.
func ParkedKeys(f core.ClaimForm) []string {
	h := &unwrap(f).(*advisory).keys
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Sorted(maps.Keys(h.parked))
}
