package core

import (
	"fmt"
	"strings"
)

// OrderKey is one key of a table's claim order: a column and its direction.
type OrderKey struct {
	Column string // as the description names it
	Q      string // quoted; set by NewPlan
	Desc   bool   // descending
}

// ParseOrder reads a claim order: a comma-separated list of columns, each
// optionally followed by ASC or DESC ("priority DESC, id"). An empty order
// is the id alone. A single column with no direction is the order as given
// (a custom sequence column, as before); any other order that does not
// name the id gets it as its last key (ascending), so the order is total:
// no two rows tie, which the claim cursor and FIFO heads rely on. Each
// column must be a plain identifier named once; the error says which part
// is wrong.
func ParseOrder(order, id string) ([]OrderKey, error) {
	if strings.TrimSpace(order) == "" {
		return []OrderKey{{Column: id}}, nil
	}
	var keys []OrderKey
	seen := map[string]bool{}
	plain := true
	for i, part := range strings.Split(order, ",") {
		if i > 0 {
			part = strings.TrimPrefix(part, " ") // "a, b"
		}
		// Keys are written exactly: "col" or "col DIR", one space apart.
		f := strings.Split(part, " ")
		if part == "" {
			return nil, fmt.Errorf("empty key in order %q", order)
		}
		if len(f) > 2 || slicesHasEmpty(f) {
			return nil, fmt.Errorf("order key %q: want a column and at most ASC or DESC, one space apart", part)
		}
		k := OrderKey{Column: f[0]}
		if err := CheckIdent(k.Column); err != nil {
			return nil, fmt.Errorf("order key %q: %w", part, err)
		}
		if len(f) == 2 {
			plain = false
			switch strings.ToUpper(f[1]) {
			case "ASC":
			case "DESC":
				k.Desc = true
			default:
				return nil, fmt.Errorf("order key %q: direction %q is not ASC or DESC", part, f[1])
			}
		}
		l := strings.ToLower(k.Column)
		if seen[l] {
			return nil, fmt.Errorf("order names column %q twice", k.Column)
		}
		seen[l] = true
		keys = append(keys, k)
	}
	if (len(keys) > 1 || !plain) && !seen[strings.ToLower(id)] {
		keys = append(keys, OrderKey{Column: id})
	}
	return keys, nil
}

func slicesHasEmpty(f []string) bool {
	for _, s := range f {
		if s == "" {
			return true
		}
	}
	return false
}

// OrderIsID reports whether claims order by the id alone, ascending.
func (p *Plan) OrderIsID() bool {
	return len(p.OrderKeys) == 1 && !p.OrderKeys[0].Desc && strings.EqualFold(p.OrderKeys[0].Column, p.ID)
}

// OrderColumns lists the order's columns that are not the id.
func (p *Plan) OrderColumns() []string {
	var out []string
	for _, k := range p.OrderKeys {
		if !strings.EqualFold(k.Column, p.ID) {
			out = append(out, k.Column)
		}
	}
	return out
}

// OrderBy is the ORDER BY list of claims over alias ("" for none): each
// key with DESC where it descends. Indexes serving claims list the same.
func (p *Plan) OrderBy(alias string) string {
	if len(p.OrderKeys) == 1 && !p.OrderKeys[0].Desc {
		return col(alias, p.OrderKeys[0].Q)
	}
	parts := make([]string, len(p.OrderKeys))
	for i, k := range p.OrderKeys {
		parts[i] = col(alias, k.Q)
		if k.Desc {
			parts[i] += " DESC"
		}
	}
	return strings.Join(parts, ", ")
}

// OrderValues reads a row's order key values with get (a column's value
// by name), in key order: a claim cursor's position.
func (p *Plan) OrderValues(get func(col string) any) []any {
	out := make([]any, len(p.OrderKeys))
	for i, k := range p.OrderKeys {
		out[i] = get(k.Column)
	}
	return out
}

// From is the condition over alias that a row comes at or after the
// position at (OrderValues of a row) in claim order, or strictly after it
// when strict, and its args. With several keys it is written so that an
// index on the keys can seek to the position: the first key bounds the
// range and the rest decide ties ("a <= ? AND (a < ? OR b >= ?)" for
// "a DESC, b"). A single ascending key is "alias.key >= ?" (or "> ?").
func (p *Plan) From(alias string, at []any, strict bool) (string, []any) {
	var b strings.Builder
	var args []any
	p.from(&b, &args, alias, at, 0, strict)
	return b.String(), args
}

func (p *Plan) from(b *strings.Builder, args *[]any, alias string, at []any, i int, strict bool) {
	k := p.OrderKeys[i]
	c := col(alias, k.Q)
	after, atOrAfter := " > ?", " >= ?"
	if k.Desc {
		after, atOrAfter = " < ?", " <= ?"
	}
	if i == len(p.OrderKeys)-1 {
		if strict {
			b.WriteString(c + after)
		} else {
			b.WriteString(c + atOrAfter)
		}
		*args = append(*args, at[i])
		return
	}
	b.WriteString(c + atOrAfter + " AND (" + c + after + " OR ")
	*args = append(*args, at[i], at[i])
	p.from(b, args, alias, at, i+1, strict)
	b.WriteString(")")
}

// before is the condition that the row over h comes strictly before the
// row over c in claim order (both aliases given).
func (p *Plan) before(h, c string) string {
	var b strings.Builder
	for i, k := range p.OrderKeys {
		op := " < "
		if k.Desc {
			op = " > "
		}
		hc, cc := col(h, k.Q), col(c, k.Q)
		if i == len(p.OrderKeys)-1 {
			b.WriteString(hc + op + cc)
			break
		}
		b.WriteString("(" + hc + op + cc + " OR (" + hc + " = " + cc + " AND ")
	}
	for i := 0; i < len(p.OrderKeys)-1; i++ {
		b.WriteString("))")
	}
	return b.String()
}
