package core

import (
	"testing"
	"time"
)

// TestSameTokens: equal times in any zone, text, bytes and numbers are one
// token; a different value, type or an uncomparable one is not.
func TestSameTokens(t *testing.T) {
	t1 := time.Date(2026, 12, 6, 1, 2, 3, 456789000, time.UTC)
	for _, c := range []struct {
		tokens []any
		want   bool
	}{
		{[]any{t1}, true},
		{[]any{t1, t1.In(time.FixedZone("x", 3600))}, true},
		{[]any{t1, t1.Add(time.Microsecond)}, false},
		{[]any{"2026-12-06 01:02:03.456789", "2026-12-06 01:02:03.456789"}, true},
		{[]any{"a", "b"}, false},
		{[]any{[]byte("a"), []byte("a")}, true},
		{[]any{int64(5), int64(5)}, true},
		{[]any{int64(5), 5}, false},
		{[]any{[]int{1}, []int{1}}, false},
		{[]any{nil, nil}, false},
		{nil, false},
	} {
		if got := SameTokens(c.tokens); got != c.want {
			t.Errorf("SameTokens(%v) = %v, want %v", c.tokens, got, c.want)
		}
	}
}
