package conformance

import (
	"bytes"
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/core"
)

// hostileTemplate is the advisory key template of HostileKeys: literal text
// that would break out of any SQL string it were pasted into, escaped
// braces, and two key columns, one of them binary.
const hostileTemplate = "h'\"`\\%_{{;--}}{acct}|{kb}"

// hostilePrefix is what hostileTemplate renders before its first column.
const hostilePrefix = "h'\"`\\%_{;--}"

// hostileRow is a row of HostileKeys: acct is a text column, kb a binary
// one (bytes a text column cannot hold: NUL, invalid UTF-8).
type hostileRow struct {
	Acct string `db:"acct"`
	KB   []byte `db:"kb"`
	Body string `db:"body"`
}

var hostilePayload = [][2]string{{"acct", "text"}, {"kb", "bytes"}, {"body", "text"}}

// hostileCase is two rows whose keys render alike: they must run one at a
// time; rows of different cases must not wait for each other.
type hostileCase struct {
	name string
	a, b hostileRow
}

func (c hostileCase) key() string { return hostilePrefix + c.a.Acct + "|" + string(c.a.KB) }

// hostileCases are key-column values that try SQL injection, quoting,
// pattern characters, bytes text cannot hold, lookalikes and keys longer
// than a lock name may be. canary is a table the injections name.
func hostileCases(canary string) []hostileCase {
	long := strings.Repeat("L", 70)
	same := func(name, acct, kb string) hostileCase {
		r := hostileRow{Acct: acct, KB: []byte(kb)}
		return hostileCase{name: name, a: r, b: r}
	}
	cs := []hostileCase{
		same("single quote", "O'Brien", "'"),
		same("double quote", `jobs"--`, `"`),
		same("backtick", "`x`; DROP TABLE `"+canary+"`; --", "`"),
		same("string break-out", "'); DROP TABLE "+canary+"; --", "'); DROP TABLE "+canary+"; --"),
		same("identifier break-out", `"; DROP TABLE "`+canary+`"; --`, ""),
		same("template in a value", "{acct}'); SELECT pg_sleep(10); --", "{kb}"),
		same("backslash", `\`, `\\`),
		same("escaped quotes", `\'`, `\"`),
		same("percent", "%", "%"),
		same("underscore", "_", "_"),
		same("pattern", "%_%", ""),
		same("NUL", "n", "\x00"),
		same("two NULs", "n", "\x00\x00"),
		same("NUL then b", "n", "\x00b"),
		same("NUL then c", "n", "\x00c"),
		same("invalid UTF-8 fe", "u", "\xff\xfe"),
		same("invalid UTF-8 fd", "u", "\xff\xfd"),
		same("truncated UTF-8", "u", "\xc3("),
		same("emoji", "🦀🔒", "🦀"),
		same("emoji swapped", "🔒🦀", "🦀"),
		same("latin", "acct", "ok"),
		same("cyrillic lookalike", "аcct", "ok"),
		same("long 1", long+"1", long),
		same("long 2", long+"2", long),
		same("very long", strings.Repeat("🦀", 60), strings.Repeat("\xfe", 200)),
		same("empty", "", ""),
		// Different values, one key: the key is the rendered string.
		{name: "equal rendering", a: hostileRow{Acct: "x|", KB: []byte("y")}, b: hostileRow{Acct: "x", KB: []byte("|y")}},
	}
	for i := range cs {
		cs[i].a.Body = fmt.Sprintf("%d-a %s", i, cs[i].a.Acct)
		cs[i].b.Body = fmt.Sprintf("%d-b %s", i, cs[i].b.Acct)
	}
	return cs
}

// HostileKeys: rows whose key columns hold quotes, backslashes, SQL that
// tries to break out of a string or an identifier, LIKE patterns, NUL
// bytes, invalid UTF-8, emoji, lookalikes and values past 64 bytes are
// claimed exactly once, come back byte for byte (after a retry too), and
// leave the database intact. In the advisory form (template hostileTemplate, itself full of
// quotes) rows with equal keys run one at a time, across brokers, while
// every distinct key runs at once.
func HostileKeys(t TB, tg *Target, f sqlxbroker.Form) {
	b1, b2 := tg.broker(t), tg.broker(t)
	canary := tg.fresh(t, b1.DB(), f, nil)
	publish(t, b1, canary, msg{Acct: "canary", Body: "canary"})
	tb := tg.freshWith(t, b1.DB(), f, func(x *sqlxbroker.Table) {
		x.Lease = 0 // the default 30 s: nothing here waits for a lease to run out
		if f == sqlxbroker.Advisory {
			x.AdvisoryLock = hostileTemplate
		}
	}, hostilePayload)
	cases := hostileCases(canary.Name)
	var rows []any
	want := map[string]hostileRow{}
	for _, c := range cases {
		rows = append(rows, c.a)
		want[c.a.Body] = c.a
	}
	if f == sqlxbroker.Advisory {
		// The second row of each key; the other forms hold rows, not
		// keys, and need one row per case.
		for _, c := range cases {
			rows = append(rows, c.b)
			want[c.b.Body] = c.b
		}
	}
	if err := b1.Publish(context.Background(), b1.DB(), tb, rows...); err != nil {
		t.Fatalf("publish hostile rows: %v", err)
	}
	keyOf := map[string]string{} // body: the key its row must be delivered under
	for _, c := range cases {
		keyOf[c.a.Body], keyOf[c.b.Body] = c.key(), c.key()
	}
	// check reads a delivery back and fails unless it is the row published
	// with that body, under its key in the advisory form.
	check := func(c core.Claim, attempt int) string {
		t.Helper()
		d := sqlxbroker.NewDelivery(c)
		var got hostileRow
		if err := d.Scan(&got); err != nil {
			t.Fatalf("scan a hostile row: %v", err)
		}
		w, ok := want[got.Body]
		switch {
		case !ok:
			t.Errorf("delivered a row with body %q, which was never published", got.Body)
		case got.Acct != w.Acct || !bytes.Equal(got.KB, w.KB):
			t.Errorf("row %q came back as acct %q kb %q, published acct %q kb %q", got.Body, got.Acct, got.KB, w.Acct, w.KB)
		}
		if f == sqlxbroker.Advisory && d.Key() != keyOf[got.Body] {
			t.Errorf("row %q delivered under key %q, want %q", got.Body, d.Key(), keyOf[got.Body])
		}
		if d.Attempt() != attempt {
			t.Errorf("row %q reports attempt %d, want %d", got.Body, d.Attempt(), attempt)
		}
		return got.Body
	}

	holder := form(t, b1, tb)
	other := form(t, b2, tb)
	held := claim(t, holder, 2*len(cases))
	if f == sqlxbroker.Advisory {
		// One row per key, every key at once: a key that collided with
		// another would have been skipped.
		got := map[string]bool{}
		for _, c := range held {
			got[check(c, 1)] = true
		}
		if len(held) != len(cases) {
			t.Errorf("claimed %d rows of %d distinct keys at once, want one per key", len(held), len(cases))
		}
		for _, c := range cases {
			if !got[c.a.Body] {
				t.Errorf("key %q (%s) was not claimed while no other broker held a key: it shares a lock with another key", c.key(), c.name)
			}
		}
	} else {
		if len(held) != len(cases) {
			t.Errorf("claimed %d hostile rows, want all %d", len(held), len(cases))
		}
		for _, c := range held {
			check(c, 1)
		}
	}
	if got := claim(t, other, 2*len(cases)); len(got) != 0 {
		t.Errorf("another broker claimed %d rows while every row or key was held: %v", len(got), ids(got))
		for _, c := range got {
			complete(t, c, sqlxbroker.Released)
		}
	}

	if f == sqlxbroker.Advisory {
		// Hand each key over: once its first row completes, the other
		// broker gets its second row and nothing else.
		for i, c := range held {
			complete(t, c, sqlxbroker.Succeeded)
			if i >= len(cases) {
				continue
			}
			var next []core.Claim
			WaitFor(t, 10*time.Second, fmt.Sprintf("the second row of key %q (%s)", cases[i].key(), cases[i].name), func() bool {
				next = claim(t, other, 2*len(cases))
				return len(next) > 0
			})
			if len(next) != 1 {
				t.Errorf("key %q (%s) freed: claimed %d rows, want its second row alone", cases[i].key(), cases[i].name, len(next))
			}
			for _, n := range next {
				if body := check(n, 1); body != cases[i].b.Body {
					t.Errorf("key %q (%s) freed: claimed %q, want %q", cases[i].key(), cases[i].name, body, cases[i].b.Body)
				}
				complete(t, n, sqlxbroker.Succeeded)
			}
		}
	} else {
		// Every other row succeeds; the rest go back for a second attempt
		// and come back intact.
		retried := map[string]bool{}
		for i, c := range held {
			if i%2 == 0 {
				complete(t, c, sqlxbroker.Succeeded)
				continue
			}
			var r hostileRow
			_ = sqlxbroker.NewDelivery(c).Scan(&r)
			retried[r.Body] = true
			complete(t, c, sqlxbroker.Retry)
		}
		again := claim(t, other, 2*len(cases))
		if len(again) != len(retried) {
			t.Errorf("after %d retries claimed %d rows", len(retried), len(again))
		}
		for _, c := range again {
			if body := check(c, 2); !retried[body] {
				t.Errorf("row %q came back after it succeeded", body)
			}
			complete(t, c, sqlxbroker.Succeeded)
		}
	}
	if n := count(t, b1.DB(), tg.Dialect, tb.Name, ""); n != 0 {
		t.Errorf("%d hostile rows left, want 0", n)
	}
	if n := count(t, b1.DB(), tg.Dialect, canary.Name, ""); n != 1 {
		t.Errorf("the canary table holds %d rows, want 1", n)
	}
}

// hostileIdents are identifiers that try SQL injection or pass for a plain
// identifier; table is the live table's name, which some of them name.
func hostileIdents(table string) []string {
	return []string{
		table + "; DROP TABLE " + table + "; --",
		table + `"; DROP TABLE "` + table + `"; --`,
		table + "`; DROP TABLE `" + table + "`; --",
		table + "'; DROP TABLE " + table + "; --",
		table + `"--`,
		"{acct}'); SELECT pg_sleep(10); --",
		"jo\x00bs",
		"jobs\n",
		" jobs",
		"1jobs",
		"јobs", // Cyrillic je
		"ｊｏｂｓ",
		"\xff\xfe",
		strings.Repeat("j", core.MaxIdentLength+1),
	}
}

// hostileTemplates are key templates whose column references try SQL
// injection or are not plain identifiers.
var hostileTemplates = []string{
	"k-{acct) OR 1=1 --}",
	`k-{acct"}`,
	"k-{acct`}",
	"k-{acct'}",
	"k-{acct;DROP TABLE jobs}",
	"k-{ acct }",
	"k-{аcct}", // Cyrillic a
	"k-{acct",
	"k-acct}",
	"k-{acct}}{",
	"{{acct}}", // literal braces only: no column
	"'; DROP TABLE jobs; --",
	"k-{" + strings.Repeat("c", core.MaxIdentLength+1) + "}",
	"k-{acct\x00}",
}

// noSQL is a connector that counts the connections asked of it and never
// gives one: a broker on it proves that a call sent no SQL.
type noSQL struct{ asked *atomic.Int64 }

var errNoSQL = errors.New("conformance: a statement was sent for a description that must be refused first")

func (c noSQL) Connect(context.Context) (driver.Conn, error) { c.asked.Add(1); return nil, errNoSQL }
func (c noSQL) Driver() driver.Driver                        { return c }
func (c noSQL) Open(string) (driver.Conn, error)             { c.asked.Add(1); return nil, errNoSQL }

// HostileIdentifiers: a description with a hostile identifier in any
// field (the table, a column, a key template's column) is refused by
// Subscribe, Form, Publish and CreateTable with a *sqlxbroker.TableError that
// matches ErrInvalidTable and names the field, before any SQL is sent
// (a broker whose pool cannot connect gets the same refusal, and was never
// asked for a connection), and the live table does not change.
func HostileIdentifiers(t TB, tg *Target, f sqlxbroker.Form) {
	b := tg.broker(t)
	tb := tg.fresh(t, b.DB(), f, nil)
	publish(t, b, tb, msg{Acct: "a", Body: "intact"})
	before := snapshot(t, tg, b, tb)
	var asked atomic.Int64
	pool := sql.OpenDB(noSQL{&asked})
	defer pool.Close()
	offline := sqlxbroker.OpenDialect(sqlx.NewDb(pool, "conformance-nosql"), tg.Dialect)

	type edit struct {
		field string
		set   func(x *sqlxbroker.Table, v string)
	}
	idents := hostileIdents(tb.Name)
	fields := []edit{
		{"Name", func(x *sqlxbroker.Table, v string) { x.Name = v }},
		{"ID", func(x *sqlxbroker.Table, v string) { x.ID = v }},
		{"Attempt", func(x *sqlxbroker.Table, v string) { x.Attempt = v }},
		{"Order", func(x *sqlxbroker.Table, v string) { x.Order = v }},
		{"LockedUntil", func(x *sqlxbroker.Table, v string) { x.LockedUntil = v }},
		{"Group", func(x *sqlxbroker.Table, v string) { x.Group = v }},
		{"ReadyAt", func(x *sqlxbroker.Table, v string) { x.ReadyAt = v }},
		{"DeadAt", func(x *sqlxbroker.Table, v string) { x.DeadAt = v }},
		{"DoneAt", func(x *sqlxbroker.Table, v string) { x.DoneAt = v }},
	}
	type attempt struct {
		field, value string
		table        sqlxbroker.Table
	}
	var attempts []attempt
	for _, e := range fields {
		for _, v := range idents {
			x := tb
			e.set(&x, v)
			attempts = append(attempts, attempt{e.field, v, x})
		}
	}
	for _, v := range hostileTemplates {
		x := tb
		x.LockedUntil, x.Lease, x.AdvisoryLock = "", 0, v
		attempts = append(attempts, attempt{"AdvisoryLock", v, x})
	}
	// Schema-qualified names: the schema part is quoted on its own.
	for _, v := range []string{"public." + tb.Name + `"; DROP TABLE "` + tb.Name, "a.b." + tb.Name, "." + tb.Name, tb.Name + "."} {
		x := tb
		x.Name = v
		attempts = append(attempts, attempt{"Name", v, x})
	}

	h := func(context.Context, *sqlxbroker.Delivery) error { return nil }
	calls := []struct {
		name string
		call func(br *sqlxbroker.Broker, x sqlxbroker.Table) error
	}{
		{"Subscribe", func(br *sqlxbroker.Broker, x sqlxbroker.Table) error {
			s, err := br.Subscribe(context.Background(), x, h, quick)
			if s != nil {
				_ = s.Stop(context.Background())
			}
			return err
		}},
		{"Form", func(br *sqlxbroker.Broker, x sqlxbroker.Table) error {
			fm, err := br.Form(x)
			if fm != nil {
				fm.Close()
			}
			return err
		}},
		{"Publish", func(br *sqlxbroker.Broker, x sqlxbroker.Table) error {
			return br.Publish(context.Background(), br.DB(), x, msg{Acct: "b", Body: "injected"})
		}},
		{"CreateTable", func(br *sqlxbroker.Broker, x sqlxbroker.Table) error {
			return br.CreateTable(context.Background(), x, suitePayload...)
		}},
	}
	for _, a := range attempts {
		for _, br := range []*sqlxbroker.Broker{offline, b} {
			where := "live"
			if br == offline {
				where = "offline"
			}
			for _, c := range calls {
				err := c.call(br, a.table)
				var te *sqlxbroker.TableError
				switch {
				case err == nil:
					t.Errorf("%s %s with %s %q: accepted", where, c.name, a.field, a.value)
				case !errors.As(err, &te) || !errors.Is(err, sqlxbroker.ErrInvalidTable):
					t.Errorf("%s %s with %s %q: %v, want a *sqlxbroker.TableError (ErrInvalidTable)", where, c.name, a.field, a.value, err)
				case te.Field != a.field:
					t.Errorf("%s %s with %s %q: the error names %s: %v", where, c.name, a.field, a.value, te.Field, err)
				case errors.Is(err, errNoSQL):
					t.Errorf("%s %s with %s %q: refused only after sending SQL: %v", where, c.name, a.field, a.value, err)
				}
			}
		}
	}
	if n := asked.Load(); n != 0 {
		t.Errorf("refusing hostile descriptions asked the pool for %d connections, want 0", n)
	}
	if after := snapshot(t, tg, b, tb); after != before {
		t.Errorf("hostile descriptions changed the table:\n before %s\n after  %s", before, after)
	}
}
