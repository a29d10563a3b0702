package sqlxbrokertest

import (
	"bytes"
	"context"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/core"
)

// Querier is what Published and RequirePublished read a table through:
// the caller's *sqlx.Tx (its own uncommitted rows included) or a *sqlx.DB.
// The dialect is the one registered for DriverName.
type Querier interface {
	sqlx.QueryerContext
	DriverName() string
}

// readTimeout bounds the reading of a table.
const readTimeout = 30 * time.Second

// tableRows are a table's rows as the driver returned them, by ID.
type tableRows struct {
	cols []string
	rows [][]any
	id   int // the ID column's index
}

// readTable reads every row of table through q, ordered by its ID.
func readTable(q Querier, table sqlxbroker.Table) (*tableRows, error) {
	d, err := sqlxbroker.Lookup(q.DriverName())
	if err != nil {
		return nil, err
	}
	if err := table.Validate(); err != nil {
		return nil, err
	}
	// Any form: only the names are used.
	p := core.NewPlan(d, core.Plan{Table: table.Name, ID: table.IDColumn(), Attempt: table.AttemptColumn(), Order: table.IDColumn()})
	ctx, cancel := context.WithTimeout(context.Background(), readTimeout)
	defer cancel()
	rows, err := q.QueryxContext(ctx, "SELECT * FROM "+p.QTable+" ORDER BY "+p.QID)
	if err != nil {
		return nil, fmt.Errorf("read table %s: %w", table.Name, err)
	}
	defer rows.Close()
	out := &tableRows{id: -1}
	if out.cols, err = rows.Columns(); err != nil {
		return nil, fmt.Errorf("read table %s: %w", table.Name, err)
	}
	for i, c := range out.cols {
		if strings.EqualFold(c, p.ID) {
			out.id = i
		}
	}
	if out.id < 0 {
		return nil, fmt.Errorf("table %s has no ID column %q (it has %s)", table.Name, p.ID, strings.Join(out.cols, ", "))
	}
	for rows.Next() {
		vals, err := rows.SliceScan()
		if err != nil {
			return nil, fmt.Errorf("read table %s: %w", table.Name, err)
		}
		out.rows = append(out.rows, vals)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read table %s: %w", table.Name, err)
	}
	return out, nil
}

// value returns row i's value of col.
func (r *tableRows) value(i int, col string) (any, bool) {
	for j, c := range r.cols {
		if strings.EqualFold(c, col) {
			return r.rows[i][j], true
		}
	}
	return nil, false
}

// Published returns every row of table read through q, ordered by ID, each
// scanned into a T as Delivery.Scan scans a claimed row (T a struct with
// `db` tags; columns without a field are ignored), or, for T
// map[string]any, every column as the driver returned it. Reading through
// the caller's transaction sees the rows it published and has not
// committed. Any error fails the test (Fatalf).
func Published[T any](t TB, q Querier, table sqlxbroker.Table) []T {
	t.Helper()
	out, err := published[T](q, table)
	if err != nil {
		t.Fatalf("sqlxbrokertest: Published: %v", err)
	}
	return out
}

func published[T any](q Querier, table sqlxbroker.Table) ([]T, error) {
	r, err := readTable(q, table)
	if err != nil {
		return nil, err
	}
	out := make([]T, 0, len(r.rows))
	var zero T
	if _, isMap := any(zero).(map[string]any); isMap {
		for _, vals := range r.rows {
			m := make(map[string]any, len(vals))
			for j, c := range r.cols {
				m[c] = vals[j]
			}
			out = append(out, any(m).(T))
		}
		return out, nil
	}
	if typ := reflect.TypeFor[T](); typ.Kind() != reflect.Struct {
		return nil, fmt.Errorf("T is %s, want a struct with `db` tags or map[string]any", typ)
	}
	for _, vals := range r.rows {
		c := &claim{row: core.Row{ID: vals[r.id], Columns: r.cols, Values: vals}}
		var v T
		if err := sqlxbroker.NewDelivery(c).Scan(&v); err != nil {
			return nil, fmt.Errorf("table %s, row %s: %w", table.Name, show(vals[r.id]), err)
		}
		out = append(out, v)
	}
	return out, nil
}

// RequirePublished fails the test (Fatalf) unless table, read through q,
// holds exactly the rows want, in any order. Each wanted row is a message
// as Publish takes it (a struct with `db` tags, a pointer to one, or a
// map[string]any) and is compared on the columns Publish would write for
// it (sqlxbroker.MessageColumns): its ID only when it gives one (not
// zero), the attempt column always (1 unless it gives another: a row
// published and not yet delivered), ReadyAt only when it gives one, and no
// other column. Values are compared as the database stores them: a string
// equals the same text read back as bytes, a bool equals 1 or 0, a number
// equals its text, a time.Time equals the same instant (to the
// microsecond) read back as a time or as text.
//
// The failure message lists each wanted row missing (with the closest row
// found and the columns that differ) and each row found that was not
// wanted. Pass the caller's transaction as q to check rows it has not
// committed; with no want, the table must be empty.
func RequirePublished(t TB, q Querier, table sqlxbroker.Table, want ...any) {
	t.Helper()
	if msg, err := requirePublished(q, table, want); err != nil {
		t.Fatalf("sqlxbrokertest: RequirePublished: %v", err)
	} else if msg != "" {
		t.Fatalf("sqlxbrokertest: RequirePublished: %s", msg)
	}
}

// wantRow is one wanted row, its columns as Publish writes them.
type wantRow struct {
	cols []string
	vals []any // driver values
}

func (w *wantRow) String() string {
	parts := make([]string, len(w.cols))
	for i, c := range w.cols {
		parts[i] = c + "=" + show(w.vals[i])
	}
	return "{" + strings.Join(parts, ", ") + "}"
}

// requirePublished returns a failure message ("" when the table holds
// exactly want) or an error that stopped the comparison.
func requirePublished(q Querier, table sqlxbroker.Table, want []any) (string, error) {
	wants := make([]wantRow, len(want))
	for i, w := range want {
		cols, vals, err := sqlxbroker.MessageColumns(table, w)
		if err != nil {
			return "", fmt.Errorf("want[%d]: %w", i, err)
		}
		for j := range vals {
			if vals[j], err = driverValue(vals[j]); err != nil {
				return "", fmt.Errorf("want[%d]: column %q: %w", i, cols[j], err)
			}
		}
		wants[i] = wantRow{cols, vals}
	}
	r, err := readTable(q, table)
	if err != nil {
		return "", err
	}
	// diffs lists the columns of row i that differ from w (a column the
	// table lacks differs too).
	diffs := func(w *wantRow, i int) []string {
		var out []string
		for j, c := range w.cols {
			got, ok := r.value(i, c)
			switch {
			case !ok:
				out = append(out, fmt.Sprintf("%s: want %s, the table has no such column", c, show(w.vals[j])))
			case !sameValue(w.vals[j], got):
				out = append(out, fmt.Sprintf("%s: want %s, got %s", c, show(w.vals[j]), show(got)))
			}
		}
		return out
	}
	used := make([]bool, len(r.rows))
	missing := []int{}
	for wi := range wants {
		found := false
		for i := range r.rows {
			if !used[i] && len(diffs(&wants[wi], i)) == 0 {
				used[i], found = true, true
				break
			}
		}
		if !found {
			missing = append(missing, wi)
		}
	}
	var extra []int
	for i := range r.rows {
		if !used[i] {
			extra = append(extra, i)
		}
	}
	if len(missing) == 0 && len(extra) == 0 {
		return "", nil
	}
	// The columns shown for rows found: the wanted ones, else all.
	showCols := r.cols
	if len(wants) > 0 {
		showCols = append([]string{r.cols[r.id]}, wants[0].cols...)
	}
	rowText := func(i int) string {
		parts := []string{}
		seen := map[string]bool{}
		for _, c := range showCols {
			if seen[strings.ToLower(c)] {
				continue
			}
			seen[strings.ToLower(c)] = true
			v, ok := r.value(i, c)
			if !ok {
				continue
			}
			parts = append(parts, c+"="+show(v))
		}
		return "{" + strings.Join(parts, ", ") + "}"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "table %s holds %s, %d wanted; missing (-): %d, not wanted (+): %d",
		table.Name, rowsText(len(r.rows)), len(wants), len(missing), len(extra))
	for _, wi := range missing {
		fmt.Fprintf(&b, "\n  - want[%d] %s", wi, &wants[wi])
		best, bestDiff := -1, []string(nil)
		for _, i := range extra {
			if d := diffs(&wants[wi], i); best < 0 || len(d) < len(bestDiff) {
				best, bestDiff = i, d
			}
		}
		if best >= 0 {
			fmt.Fprintf(&b, "\n      closest row %s=%s differs in %s", r.cols[r.id], show(r.rows[best][r.id]), strings.Join(bestDiff, "; "))
		}
	}
	for _, i := range extra {
		fmt.Fprintf(&b, "\n  + row %s", rowText(i))
	}
	return b.String(), nil
}

func rowsText(n int) string {
	if n == 1 {
		return "1 row"
	}
	return fmt.Sprintf("%d rows", n)
}

// show formats a driver value for a message: text quoted, times in
// RFC 3339, NULL for nil.
func show(v any) string {
	switch x := v.(type) {
	case nil:
		return "NULL"
	case []byte:
		return strconv.Quote(string(x))
	case string:
		return strconv.Quote(x)
	case time.Time:
		return x.UTC().Format(time.RFC3339Nano)
	}
	return fmt.Sprint(v)
}

// timeLayouts are the texts a database returns a timestamp as.
var timeLayouts = []string{time.RFC3339Nano, "2006-01-02 15:04:05.999999999Z07:00", "2006-01-02 15:04:05.999999999 -0700 MST",
	"2006-01-02 15:04:05.999999999-07:00", "2006-01-02 15:04:05.999999999", "2006-01-02T15:04:05.999999999"}

func asText(v any) (string, bool) {
	switch x := v.(type) {
	case string:
		return x, true
	case []byte:
		return string(x), true
	}
	return "", false
}

// sameValue reports whether want (a driver value Publish binds) equals
// got (a driver value read back), as the database stores it.
func sameValue(want, got any) bool {
	if want == nil || got == nil {
		return want == nil && got == nil
	}
	switch w := want.(type) {
	case time.Time:
		g, ok := got.(time.Time)
		if s, text := asText(got); text {
			for _, l := range timeLayouts {
				if p, err := time.Parse(l, s); err == nil {
					g, ok = p, true
					break
				}
			}
		}
		return ok && w.Truncate(time.Microsecond).Equal(g.Truncate(time.Microsecond))
	case bool:
		switch g := got.(type) {
		case bool:
			return w == g
		case int64:
			return w == (g != 0)
		}
		if s, ok := asText(got); ok {
			b, err := strconv.ParseBool(s)
			return err == nil && b == w
		}
		return false
	case int64:
		switch g := got.(type) {
		case int64:
			return w == g
		case float64:
			return float64(w) == g
		}
		if s, ok := asText(got); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
			return err == nil && n == w
		}
		return false
	case float64:
		switch g := got.(type) {
		case float64:
			return w == g
		case int64:
			return w == float64(g)
		}
		if s, ok := asText(got); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
			return err == nil && f == w
		}
		return false
	case string:
		if s, ok := asText(got); ok {
			return s == w
		}
		return fmt.Sprint(got) == w
	case []byte:
		s, ok := asText(got)
		return ok && bytes.Equal([]byte(s), w)
	}
	return reflect.DeepEqual(want, got)
}
