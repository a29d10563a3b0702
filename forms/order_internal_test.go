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
