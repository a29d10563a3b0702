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

func TestParseOrder(t *testing.T) {
	for _, c := range []struct {
		in, want string // want: keys as "col[-]" joined by ","; "" for an error
	}{
		{"", "id"}, {"seq", "seq"}, {"id", "id"}, {"id DESC", "id-"},
		{"prio DESC", "prio-,id"}, {"prio DESC, id", "prio-,id"}, {"prio desc,id asc", "prio-,id"},
		{"a, b DESC", "a,b-,id"}, {"a, id DESC, b", "a,id-,b"},
		{" jobs", ""}, {"jobs\n", ""}, {"a,,b", ""}, {"a  DESC", ""}, {"a DOWN", ""}, {"a, a", ""}, {"a b c", ""}, {"a;b", ""},
	} {
		keys, err := ParseOrder(c.in, "id")
		var got []string
		for _, k := range keys {
			s := k.Column
			if k.Desc {
				s += "-"
			}
			got = append(got, s)
		}
		if (err == nil) != (c.want != "") || strings.Join(got, ",") != c.want {
			t.Errorf("ParseOrder(%q) = %v, %v; want %q", c.in, got, err, c.want)
		}
	}
}
