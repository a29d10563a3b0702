package fuzz_test

// Fuzz targets for what a table description lets reach SQL. Their seed
// corpora live in testdata/fuzz/<FuzzName>/ (injection attempts, quotes,
// backticks, NUL bytes, unicode lookalikes, over-long names, unbalanced
// braces) and run as ordinary tests with `go test`; explore further with
//
//	go test ./internal/fuzz -run '^$' -fuzz '^FuzzParseKeyTemplate$' -fuzztime 60s
//	go test ./internal/fuzz -run '^$' -fuzz '^FuzzTableValidate$' -fuzztime 60s
//	go test ./internal/fuzz -run '^$' -fuzz '^FuzzNewPlan$' -fuzztime 60s

import (
	"database/sql"
	"errors"
	"reflect"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/core"
	"github.com/sqlxbroker/sqlxbroker/dialects/mysql"
	"github.com/sqlxbroker/sqlxbroker/dialects/postgres"
	"github.com/sqlxbroker/sqlxbroker/dialects/sqlite"
)

// plainIdent is the identifier rule, restated here so the targets do not
// trust core.CheckIdent to define it.
var plainIdent = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

func isIdent(s string) bool { return plainIdent.MatchString(s) && len(s) <= core.MaxIdentLength }

// keyToken splits a key template into its tokens: an escaped brace, a
// column reference, or a run of literal text. A template is well formed
// when these tokens cover it end to end.
var keyToken = regexp.MustCompile(`\{\{|\}\}|\{([A-Za-z_][A-Za-z0-9_]*)\}|[^{}]+`)

// refRender is an independent reading of a key template: ok when the
// template is well formed and references at least one column; the
// rendering with each column's value taken from val; the columns in order
// of first use.
func refRender(s string, val func(col string) string) (ok bool, out string, cols []string) {
	var b strings.Builder
	seen := map[string]bool{}
	at := 0
	for _, m := range keyToken.FindAllStringSubmatchIndex(s, -1) {
		if m[0] != at {
			return false, "", nil // a lone brace the tokens do not cover
		}
		at = m[1]
		switch tok := s[m[0]:m[1]]; {
		case tok == "{{":
			b.WriteByte('{')
		case tok == "}}":
			b.WriteByte('}')
		case m[2] >= 0:
			col := s[m[2]:m[3]]
			if len(col) > core.MaxIdentLength {
				return false, "", nil
			}
			if !seen[col] {
				seen[col] = true
				cols = append(cols, col)
			}
			b.WriteString(val(col))
		default:
			b.WriteString(tok)
		}
	}
	if at != len(s) || len(cols) == 0 {
		return false, "", nil
	}
	return true, b.String(), cols
}

// escapeLiteral writes text as template literal text.
func escapeLiteral(s string) string {
	return strings.NewReplacer("{", "{{", "}", "}}").Replace(s)
}

func FuzzParseKeyTemplate(f *testing.F) {
	f.Fuzz(func(t *testing.T, s string) {
		angle := func(col string) string { return "<" + col + ">" }
		k, err := core.ParseKeyTemplate(s)
		ok, want, wantCols := refRender(s, angle)
		if (err == nil) != ok {
			t.Fatalf("ParseKeyTemplate(%q) error %v; the reference reading says well formed = %v", s, err, ok)
		}
		if err == nil {
			cols := k.Columns()
			if len(cols) == 0 {
				t.Fatalf("%q accepted with no column", s)
			}
			for _, c := range cols {
				if err := core.CheckIdent(c); err != nil || !isIdent(c) {
					t.Fatalf("%q accepted with column %q: %v", s, c, err)
				}
			}
			if !reflect.DeepEqual(cols, wantCols) {
				t.Fatalf("%q: columns %q, want %q", s, cols, wantCols)
			}
			if got := k.Render(func(c string) any { return angle(c) }); got != want {
				t.Fatalf("%q rendered %q, want %q", s, got, want)
			}
			if got := k.Render(func(c string) any { return []byte(angle(c)) }); got != want {
				t.Fatalf("%q rendered from []byte %q, want %q", s, got, want)
			}
			_, wantNull, _ := refRender(s, func(string) string { return "" })
			if got := k.Render(func(string) any { return nil }); got != wantNull {
				t.Fatalf("%q rendered NULLs as %q, want %q", s, got, wantNull)
			}
		}

		// Any text, escaped, is literal text around a column: braces
		// round-trip through "{{" and "}}" and nothing else changes.
		tpl := escapeLiteral(s) + "{acct}" + escapeLiteral(s)
		k, err = core.ParseKeyTemplate(tpl)
		if err != nil {
			t.Fatalf("escaped literal %q around a column refused: %v", tpl, err)
		}
		if got, want := k.Render(func(string) any { return "\x00'\"`" }), s+"\x00'\"`"+s; got != want {
			t.Fatalf("%q rendered %q, want %q", tpl, got, want)
		}
		if cols := k.Columns(); len(cols) != 1 || cols[0] != "acct" {
			t.Fatalf("%q: columns %q, want [acct]", tpl, cols)
		}
	})
}

// tableOf builds a description from fuzzed fields.
func tableOf(name, id, attempt, order, lockedUntil, group, readyAt, deadAt, doneAt, advisory string, lease int64, maxAttempts int, isolation int) sqlxbroker.Table {
	return sqlxbroker.Table{
		Name: name, ID: id, Attempt: attempt, Order: order, LockedUntil: lockedUntil, Lease: time.Duration(lease),
		AdvisoryLock: advisory, Group: group, ReadyAt: readyAt, DeadAt: deadAt, MaxAttempts: maxAttempts,
		DoneAt: doneAt, Isolation: sql.IsolationLevel(isolation),
	}
}

// identFields are the identifier fields of a description, by field name.
func identFields(t sqlxbroker.Table) map[string]string {
	return map[string]string{
		"ID": t.ID, "Attempt": t.Attempt, "Order": t.Order, "LockedUntil": t.LockedUntil, "Group": t.Group,
		"ReadyAt": t.ReadyAt, "DeadAt": t.DeadAt, "DoneAt": t.DoneAt,
	}
}

// checkRefusal fails unless err is a *sqlxbroker.TableError that matches
// ErrInvalidTable and names a field of sqlxbroker.Table.
func checkRefusal(t *testing.T, tb sqlxbroker.Table, err error) *sqlxbroker.TableError {
	t.Helper()
	var te *sqlxbroker.TableError
	if !errors.As(err, &te) {
		t.Fatalf("%+v refused with %T %v, want a *sqlxbroker.TableError", tb, err, err)
	}
	if !errors.Is(err, core.ErrInvalidTable) {
		t.Fatalf("%+v: %v does not match ErrInvalidTable", tb, err)
	}
	if _, ok := reflect.TypeFor[sqlxbroker.Table]().FieldByName(te.Field); !ok {
		t.Fatalf("%+v: error names %q, which is no field of sqlxbroker.Table: %v", tb, te.Field, err)
	}
	if !strings.Contains(err.Error(), te.Field) {
		t.Fatalf("%+v: message %q does not name the field %s", tb, err, te.Field)
	}
	return te
}

// checkAccepted fails unless every identifier of an accepted description is
// plain and the description is coherent.
func checkAccepted(t *testing.T, tb sqlxbroker.Table) {
	t.Helper()
	parts := strings.Split(tb.Name, ".")
	if len(parts) > 2 {
		t.Fatalf("name %q accepted with %d parts", tb.Name, len(parts))
	}
	for _, p := range parts {
		if !isIdent(p) {
			t.Fatalf("name %q accepted with part %q", tb.Name, p)
		}
	}
	for field, v := range identFields(tb) {
		if v != "" && !isIdent(v) {
			t.Fatalf("%s %q accepted", field, v)
		}
	}
	for _, c := range tb.Columns() {
		if !isIdent(c[1]) {
			t.Fatalf("column %q (%s) accepted", c[1], c[0])
		}
	}
	if tb.AdvisoryLock != "" {
		if tb.LockedUntil != "" {
			t.Fatalf("both LockedUntil and AdvisoryLock accepted")
		}
		if ok, _, _ := refRender(tb.AdvisoryLock, func(string) string { return "" }); !ok {
			t.Fatalf("key template %q accepted", tb.AdvisoryLock)
		}
	}
	if tb.Lease != 0 && (tb.LockedUntil == "" || tb.Lease < time.Second || tb.Lease%time.Second != 0) {
		t.Fatalf("lease %v accepted (LockedUntil %q)", tb.Lease, tb.LockedUntil)
	}
	if tb.MaxAttempts < 0 || tb.MaxAttempts > 0 && tb.DeadAt == "" {
		t.Fatalf("MaxAttempts %d accepted with DeadAt %q", tb.MaxAttempts, tb.DeadAt)
	}
}

func FuzzTableValidate(f *testing.F) {
	f.Fuzz(func(t *testing.T, name, id, attempt, order, lockedUntil, group, readyAt, deadAt, doneAt, advisory string, lease int64, maxAttempts int, isolation int) {
		tb := tableOf(name, id, attempt, order, lockedUntil, group, readyAt, deadAt, doneAt, advisory, lease, maxAttempts, isolation)
		err := tb.Validate()
		if err != nil {
			te := checkRefusal(t, tb, err)
			if te.Table != tb.Name {
				t.Fatalf("error names table %q, want %q", te.Table, tb.Name)
			}
			// A refusal for an identifier field names a field whose
			// value is not a plain identifier.
			if v, ok := identFields(tb)[te.Field]; ok && isIdent(v) {
				t.Fatalf("%s %q is a plain identifier, yet refused: %v", te.Field, v, err)
			}
			return
		}
		checkAccepted(t, tb)
	})
}

// dialects are the built-in dialects whose quoting the plan must use.
var dialects = []core.Dialect{postgres.Dialect{}, mysql.Dialect{}, mysql.Dialect{MariaDB: true}, sqlite.Dialect{}}

func FuzzNewPlan(f *testing.F) {
	f.Fuzz(func(t *testing.T, name, id, attempt, order, lockedUntil, group, readyAt, deadAt, doneAt, advisory string, lease int64, maxAttempts int) {
		tb := tableOf(name, id, attempt, order, lockedUntil, group, readyAt, deadAt, doneAt, advisory, lease, maxAttempts, 0)
		verr := tb.Validate()
		for _, d := range dialects {
			p, err := sqlxbroker.NewPlan(d, tb)
			if verr != nil {
				te := checkRefusal(t, tb, err)
				var ve *sqlxbroker.TableError
				errors.As(verr, &ve)
				if te.Field != ve.Field {
					t.Fatalf("%s: NewPlan names %s, Validate %s", d.Name(), te.Field, ve.Field)
				}
				if p != nil {
					t.Fatalf("%s: a plan came with the error %v", d.Name(), err)
				}
				continue
			}
			if err != nil {
				// A valid description on a dialect that lacks its form.
				if !errors.Is(err, core.ErrFormUnavailable) || core.CapabilitiesOf(d).Offers(tb.Form()) {
					t.Fatalf("%s: valid %+v refused: %v", d.Name(), tb, err)
				}
				continue
			}
			checkAccepted(t, tb)
			checkPlan(t, d, tb, p)
		}
	})
}

// checkPlan fails unless every quoted name of p is d's quoting of the
// plain identifier the description (with defaults) gives, and the shared
// SQL fragments hold nothing but quoted names and fixed SQL.
func checkPlan(t *testing.T, d core.Dialect, tb sqlxbroker.Table, p *core.Plan) {
	t.Helper()
	qa := d.QuoteIdent("a")
	open, shut := qa[:len(qa)-2], qa[len(qa)-1:]
	quoted := func(what, q, ident string) {
		t.Helper()
		if ident == "" {
			if q != "" {
				t.Fatalf("%s: %s is %q for no column", d.Name(), what, q)
			}
			return
		}
		if !isIdent(ident) {
			t.Fatalf("%s: %s comes from %q", d.Name(), what, ident)
		}
		if q != d.QuoteIdent(ident) || q != open+ident+shut {
			t.Fatalf("%s: %s is %q, want %s%s%s", d.Name(), what, q, open, ident, shut)
		}
	}
	parts := strings.Split(tb.Name, ".")
	qparts := make([]string, len(parts))
	for i, s := range parts {
		quoted("a QTable part", d.QuoteIdent(s), s)
		qparts[i] = d.QuoteIdent(s)
	}
	if want := strings.Join(qparts, "."); p.QTable != want {
		t.Fatalf("%s: QTable %q, want %q", d.Name(), p.QTable, want)
	}
	quoted("QID", p.QID, tb.IDColumn())
	quoted("QAttempt", p.QAttempt, tb.AttemptColumn())
	quoted("QOrder", p.QOrder, tb.OrderColumn())
	quoted("QLockedUntil", p.QLockedUntil, tb.LockedUntil)
	quoted("QGroup", p.QGroup, tb.Group)
	quoted("QReadyAt", p.QReadyAt, tb.ReadyAt)
	quoted("QDeadAt", p.QDeadAt, tb.DeadAt)
	quoted("QDoneAt", p.QDoneAt, tb.DoneAt)
	var keyCols []string
	if tb.AdvisoryLock != "" {
		if p.Key == nil {
			t.Fatalf("%s: advisory plan without a key", d.Name())
		}
		keyCols = p.Key.Columns()
	}
	if len(p.QKeyCols) != len(keyCols) {
		t.Fatalf("%s: QKeyCols %q for key columns %q", d.Name(), p.QKeyCols, keyCols)
	}
	for i, c := range keyCols {
		quoted("QKeyCols", p.QKeyCols[i], c)
	}

	// What is left of the fragments once quoted names are taken out is
	// fixed SQL: words, comparisons and placeholders, no quote, no comment,
	// no statement separator.
	qname := quotedName(open, shut)
	ready, args := p.Ready(p.Alias, time.Unix(0, 0))
	frags := []string{ready, p.Unfinished(""), p.Unfinished(p.Alias), p.OrderBy(p.Alias)}
	if p.QGroup != "" {
		frags = append(frags, p.Head(p.Alias))
	}
	for _, fr := range frags {
		if rest := qname.ReplaceAllString(fr, ""); !fixedSQL.MatchString(rest) {
			t.Fatalf("%s: fragment %q holds more than quoted names and fixed SQL: %q", d.Name(), fr, rest)
		}
	}
	if n := strings.Count(ready, "?"); n != len(args) {
		t.Fatalf("%s: Ready has %d placeholders and %d args", d.Name(), n, len(args))
	}
}

// fixedSQL is what the plan's fragments may hold besides quoted names.
var fixedSQL = regexp.MustCompile(`^[A-Za-z0-9_ .()=<>?]*$`)

var quotedNames sync.Map // open+shut: *regexp.Regexp

// quotedName matches a plain identifier quoted with open and shut.
func quotedName(open, shut string) *regexp.Regexp {
	if re, ok := quotedNames.Load(open + shut); ok {
		return re.(*regexp.Regexp)
	}
	re := regexp.MustCompile(regexp.QuoteMeta(open) + `[A-Za-z_][A-Za-z0-9_]*` + regexp.QuoteMeta(shut))
	quotedNames.Store(open+shut, re)
	return re
}
