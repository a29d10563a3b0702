package forms

import (
	"testing"
	"time"

	"github.com/sqlxbroker/sqlxbroker/core"
)

// TestBefore: positions in a claim order "prio DESC, id" compare as the
// order says, with the values as drivers return them (integers, MySQL's
// text digits, times, strings); values that cannot be compared are not
// before anything.
func TestBefore(t *testing.T) {
	p := &core.Plan{OrderKeys: []core.OrderKey{{Column: "prio", Desc: true}, {Column: "id"}}}
	t0 := time.Unix(100, 0)
	for _, c := range []struct {
		v, w []any
		want bool
	}{
		{[]any{int64(1), int64(9)}, []any{int64(0), int64(3)}, true},      // higher priority first
		{[]any{int64(0), int64(2)}, []any{int64(0), int64(3)}, true},      // then the lower id
		{[]any{int64(0), int64(3)}, []any{int64(0), int64(3)}, false},     // the same position
		{[]any{int64(0), int64(4)}, []any{int64(0), int64(3)}, false},     // after
		{[]any{"10", "2"}, []any{"9", "1"}, true},                         // digits as numbers
		{[]any{int64(1), "7"}, []any{"1", int64(8)}, true},                // mixed as drivers mix them
		{[]any{int64(0), t0}, []any{int64(0), t0.Add(time.Second)}, true}, // times
		{[]any{int64(0), "a"}, []any{int64(0), "b"}, true},                // strings
		{[]any{int64(0), true}, []any{int64(0), false}, false},            // not comparable
	} {
		if got := before(p, c.v, c.w); got != c.want {
			t.Errorf("before(%v, %v) = %v, want %v", c.v, c.w, got, c.want)
		}
	}
}

// TestCursorStrictScans: claims from the cursor are lenient, and so are
// the full scans but the first and one every strictScanEvery after it;
// a full scan for a rescan follows the same clock.
func TestCursorStrictScans(t *testing.T) {
	defer func(f, s time.Duration) { fullScanEvery, strictScanEvery = f, s }(fullScanEvery, strictScanEvery)
	fullScanEvery, strictScanEvery = time.Hour, time.Hour
	p := &core.Plan{Alias: "c", OrderKeys: []core.OrderKey{{Column: "id", Q: `"id"`}}}
	var c cursor
	step := func(what string, retry, full, lenient bool) {
		t.Helper()
		s := c.from(p, p.Alias, retry)
		if (s.cond == "") != full || s.lenient != lenient {
			t.Fatalf("%s: full scan %v, lenient %v; want %v, %v", what, s.cond == "", s.lenient, full, lenient)
		}
		if s.cond == "" {
			c.advance([]any{int64(1)})
		}
	}
	step("the first claim", false, true, false)
	step("a claim from the cursor", false, false, true)
	step("the full scan after the cursor found nothing", true, true, true)
	c.rescanNext()
	step("a rescan", false, true, true)
	c.rescanned(p, nil, false)
	step("a claim from the cursor again", false, false, true)
	strictScanEvery = 0
	step("the full scan after strictScanEvery", true, true, false)
	step("a claim from the cursor after it", false, false, true)
	fullScanEvery = 0
	step("a periodic full scan", false, true, false)
}
