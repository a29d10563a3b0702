package core

import (
	"fmt"
	"regexp"
	"strings"
	"time"
)

// Form names a claim form (see package sqlxbroker): RowLock, Lease or
// Advisory.
type Form int

// The claim forms.
const (
	RowLock Form = iota + 1
	Lease
	Advisory
)

// Forms lists the claim forms in a stable order.
var Forms = []Form{RowLock, Lease, Advisory}

func (f Form) String() string {
	switch f {
	case RowLock:
		return "row-lock"
	case Lease:
		return "lease"
	case Advisory:
		return "advisory"
	}
	return fmt.Sprintf("Form(%d)", int(f))
}

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// MaxIdentLength is the longest identifier accepted (PostgreSQL's).
const MaxIdentLength = 63

// CheckIdent reports whether s is a plain identifier.
func CheckIdent(s string) error {
	switch {
	case s == "":
		return fmt.Errorf("empty identifier")
	case len(s) > MaxIdentLength:
		return fmt.Errorf("identifier %q is longer than %d characters", s, MaxIdentLength)
	case !identRE.MatchString(s):
		return fmt.Errorf("identifier %q must match [A-Za-z_][A-Za-z0-9_]*", s)
	}
	return nil
}

// KeyTemplate is a parsed advisory key template.
type KeyTemplate struct {
	parts []keyPart
}

type keyPart struct {
	lit string
	col string // non-empty: a column reference
}

// ParseKeyTemplate parses "text{col}text". "{{" and "}}" are literal braces;
// a template must reference at least one column.
func ParseKeyTemplate(s string) (*KeyTemplate, error) {
	if s == "" {
		return nil, fmt.Errorf("empty key template")
	}
	k := &KeyTemplate{}
	var lit strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '{' && i+1 < len(s) && s[i+1] == '{':
			lit.WriteByte('{')
			i++
		case c == '}' && i+1 < len(s) && s[i+1] == '}':
			lit.WriteByte('}')
			i++
		case c == '{':
			end := strings.IndexByte(s[i+1:], '}')
			if end < 0 {
				return nil, fmt.Errorf("key template %q: unclosed '{' at offset %d", s, i)
			}
			col := s[i+1 : i+1+end]
			if err := CheckIdent(col); err != nil {
				return nil, fmt.Errorf("key template %q: column at offset %d: %v", s, i, err)
			}
			if lit.Len() > 0 {
				k.parts = append(k.parts, keyPart{lit: lit.String()})
				lit.Reset()
			}
			k.parts = append(k.parts, keyPart{col: col})
			i += end + 1
		case c == '}':
			return nil, fmt.Errorf("key template %q: unmatched '}' at offset %d", s, i)
		default:
			lit.WriteByte(c)
		}
	}
	if lit.Len() > 0 {
		k.parts = append(k.parts, keyPart{lit: lit.String()})
	}
	if len(k.Columns()) == 0 {
		return nil, fmt.Errorf("key template %q references no column: every row would share one key", s)
	}
	return k, nil
}

// Columns returns the referenced columns in order of first use.
func (k *KeyTemplate) Columns() []string {
	var out []string
	seen := map[string]bool{}
	for _, p := range k.parts {
		if p.col != "" && !seen[p.col] {
			seen[p.col] = true
			out = append(out, p.col)
		}
	}
	return out
}

// Render builds a row's key from its values: NULL renders as "" (rows
// whose key columns are NULL share that part), []byte as text.
func (k *KeyTemplate) Render(value func(col string) any) string {
	var b strings.Builder
	for _, p := range k.parts {
		if p.col == "" {
			b.WriteString(p.lit)
			continue
		}
		switch v := value(p.col).(type) {
		case nil:
		case []byte:
			b.Write(v)
		case string:
			b.WriteString(v)
		case time.Time:
			b.WriteString(v.UTC().Format(time.RFC3339Nano))
		default:
			fmt.Fprint(&b, v)
		}
	}
	return b.String()
}
