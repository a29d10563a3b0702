package sqlxbroker

import (
	"database/sql"
	"database/sql/driver"
	"reflect"
	"strings"
	"testing"
	"time"
)

// money is a Valuer through its pointer only.
type money struct{ cents int64 }

func (m *money) Value() (driver.Value, error) { return m.cents, nil }

// label is a struct Valuer with fields of its own (which are not columns).
type label struct {
	Text string `db:"text"`
	Lang string `db:"lang"`
}

func (l label) Value() (driver.Value, error) { return l.Lang + ":" + l.Text, nil }

type Base struct {
	Tenant string `db:"tenant"`
}

type Audit struct {
	By string `db:"by_user"`
}

type walkMsg struct {
	ID    int64           `db:"id"`
	Name  sql.NullString  `db:"name"`
	N     sql.NullInt64   `db:"n"`
	At    sql.NullTime    `db:"at"`
	G     sql.Null[int64] `db:"g"`
	When  time.Time       `db:"when_at"`
	Price money           `db:"price"`
	Label label           `db:"label"`
	Ptr   *string         `db:"ptr"`
	Raw   []byte          `db:"raw"`
	Any   any             `db:"anything"`
	Skip  string          `db:"-"`
	Base
	*Audit
	hidden int
}

func TestFieldWalk(t *testing.T) {
	s := "p"
	tb := &Table{Name: "jobs"}
	now := time.Date(2026, 12, 3, 1, 2, 3, 0, time.UTC)
	m := walkMsg{
		Name: sql.NullString{String: "x", Valid: true}, N: sql.NullInt64{}, At: sql.NullTime{Time: now, Valid: true},
		G: sql.Null[int64]{V: 7, Valid: true}, When: now, Price: money{250}, Label: label{Text: "hi", Lang: "en"},
		Ptr: &s, Raw: []byte("r"), Any: 3, Skip: "no", Base: Base{Tenant: "t1"}, hidden: 1,
	}
	names, vals, err := fieldsOf(tb, &m)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"name", "n", "at", "g", "when_at", "price", "label", "ptr", "raw", "anything", "tenant", "by_user", "attempt"}
	if strings.Join(names, ",") != strings.Join(want, ",") {
		t.Fatalf("columns %v, want %v", names, want)
	}
	got := map[string]any{}
	for i, n := range names {
		got[n] = vals[i]
	}
	for col, wantV := range map[string]any{"name": "x", "n": nil, "at": now, "g": int64(7), "price": int64(250), "label": "en:hi", "anything": 3} {
		v := got[col]
		if dv, ok := v.(driver.Valuer); ok {
			v, err = dv.Value()
			if err != nil {
				t.Fatal(err)
			}
		}
		if !reflect.DeepEqual(v, wantV) {
			t.Errorf("column %s = %#v, want %#v", col, v, wantV)
		}
	}
	if got["by_user"] != nil {
		t.Errorf("a nil embedded pointer's field binds %#v, want NULL", got["by_user"])
	}
	if got["attempt"] != 1 {
		t.Errorf("attempt %v, want 1", got["attempt"])
	}
}

func TestFieldWalkRefuses(t *testing.T) {
	type inner struct{ A, B string }
	cases := []struct {
		name string
		msg  any
		want string // the field the error must name
	}{
		{"nested struct", struct {
			Body  string `db:"body"`
			Inner inner  `db:"inner"`
		}{}, "Inner"},
		{"deep nested struct", struct {
			Base
			Meta struct {
				Note inner `db:"note"`
			} `db:"meta"`
		}{}, "Meta"},
		{"map", struct {
			M map[string]string `db:"m"`
		}{}, "M"},
		{"slice", struct {
			Tags []string `db:"tags"`
		}{}, "Tags"},
		{"pointer to struct", struct {
			P *inner `db:"p"`
		}{}, "P"},
		{"channel", struct {
			C chan int `db:"c"`
		}{}, "C"},
		{"interface holding a struct", struct {
			X any `db:"x"`
		}{X: inner{}}, "X"},
		{"map message holding a slice", map[string]any{"tags": []string{"a"}}, "tags"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, _, err := columnsOf(&Table{Name: "jobs"}, []any{c.msg})
			if err == nil {
				t.Fatalf("a message with an unbindable field %s was accepted", c.want)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %q does not name %s", err, c.want)
			}
		})
	}
}

func TestPublishParamsReadyAt(t *testing.T) {
	now := time.Date(2026, 12, 4, 1, 0, 0, 0, time.UTC)
	with := &Table{Name: "jobs", ReadyAt: "ready_at"}
	without := &Table{Name: "jobs"}
	for _, c := range []struct {
		name     string
		p        PublishParams
		t        *Table
		want     time.Time
		override bool
		err      string
	}{
		{"zero", PublishParams{}, with, now, false, ""},
		{"zero without ReadyAt", PublishParams{}, without, now, false, ""},
		{"delay", PublishParams{Delay: time.Minute}, with, now.Add(time.Minute), true, ""},
		{"ready at", PublishParams{ReadyAt: now.Add(time.Hour)}, with, now.Add(time.Hour), true, ""},
		{"both", PublishParams{Delay: time.Minute, ReadyAt: now}, with, time.Time{}, false, "Delay and PublishParams.ReadyAt are both set"},
		{"negative", PublishParams{Delay: -time.Minute}, with, time.Time{}, false, "negative"},
		{"delay without column", PublishParams{Delay: time.Minute}, without, time.Time{}, false, "PublishParams.Delay needs a ReadyAt column"},
		{"ready at without column", PublishParams{ReadyAt: now}, without, time.Time{}, false, "PublishParams.ReadyAt needs a ReadyAt column"},
	} {
		got, override, err := c.p.readyAt(c.t, now)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s: error %v, want one containing %q", c.name, err, c.err)
			}
			continue
		}
		if err != nil || !got.Equal(c.want) || override != c.override {
			t.Errorf("%s: %v %v %v, want %v %v", c.name, got, override, err, c.want, c.override)
		}
	}
}

func TestNoValue(t *testing.T) {
	var nilTime *time.Time
	var nilNull *sql.NullTime
	at := time.Now()
	for _, c := range []struct {
		v    any
		want bool
	}{
		{nil, true}, {time.Time{}, true}, {nilTime, true}, {&time.Time{}, true}, {sql.NullTime{}, true}, {nilNull, true},
		{at, false}, {&at, false}, {sql.NullTime{Time: at, Valid: true}, false}, {"2026-01-01", false}, {int64(0), false},
	} {
		if got, err := noValue(c.v); err != nil || got != c.want {
			t.Errorf("noValue(%#v) = %v, %v; want %v", c.v, got, err, c.want)
		}
	}
}
