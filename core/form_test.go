package core

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestErrorText(t *testing.T) {
	long := strings.Repeat("é", LastErrorLimit) // 2 bytes each
	for _, c := range []struct {
		name string
		err  error
		want func(string) bool
	}{
		{"nil", nil, func(s string) bool { return s == "" }},
		{"short", errors.New("boom"), func(s string) bool { return s == "boom" }},
		{"long, cut at a character", errors.New(long), func(s string) bool {
			return len(s) <= LastErrorLimit && utf8.ValidString(s) && strings.HasSuffix(s, "...") && len(s) > LastErrorLimit-5
		}},
		{"NUL and bad UTF-8", errors.New("a\x00b\xffc"), func(s string) bool { return s == "ab\uFFFDc" }},
	} {
		if got := ErrorText(c.err); !c.want(got) {
			t.Errorf("%s: ErrorText = %q (%d bytes)", c.name, got, len(got))
		}
	}
}
