package sqlxbroker_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/core"
)

type fakeDialect struct{}

func (fakeDialect) Name() string               { return "fake" }
func (fakeDialect) QuoteIdent(s string) string { return s }
func (fakeDialect) BindType() int              { return 0 }
func (fakeDialect) EncodeTime(t time.Time) any { return t }
func (fakeDialect) Features() core.Features    { return core.Features{} }

func mustPanic(t *testing.T, what string, f func()) {
	t.Helper()
	defer func() {
		if recover() == nil {
			t.Errorf("%s did not panic", what)
		}
	}()
	f()
}

func TestRegister(t *testing.T) {
	mustPanic(t, "Register(nil)", func() { sqlxbroker.Register("fake-nil", nil) })
	mustPanic(t, "Register(\"\")", func() { sqlxbroker.Register("", fakeDialect{}) })
	sqlxbroker.Register("fake-once", fakeDialect{})
	mustPanic(t, "a second Register", func() { sqlxbroker.Register("fake-once", fakeDialect{}) })
	if d, err := sqlxbroker.Lookup("fake-once"); err != nil || d.Name() != "fake" {
		t.Errorf("Lookup(fake-once) = %v, %v", d, err)
	}
	names := sqlxbroker.Dialects()
	for i := 1; i < len(names); i++ {
		if names[i-1] >= names[i] {
			t.Errorf("Dialects() not sorted: %v", names)
		}
	}
}

func TestLookupUnknown(t *testing.T) {
	_, err := sqlxbroker.Lookup("postgres")
	if !errors.Is(err, sqlxbroker.ErrUnknownDialect) {
		t.Fatalf("Lookup of an unimported dialect: %v", err)
	}
	if !strings.Contains(err.Error(), `import _ "github.com/sqlxbroker/sqlxbroker/dialects/postgres"`) {
		t.Errorf("error %q does not say what to import", err)
	}
	_, err = sqlxbroker.Lookup("oracle")
	if !errors.Is(err, sqlxbroker.ErrUnknownDialect) || !strings.Contains(err.Error(), "sqlxbroker.Register") {
		t.Errorf("error %q for an unknown name does not say how to register one", err)
	}
}

func TestTableValidate(t *testing.T) {
	for _, c := range []struct {
		t    sqlxbroker.Table
		want string
	}{
		{sqlxbroker.Table{}, "empty"},
		{sqlxbroker.Table{Name: `jobs"; DROP TABLE x; --`}, "must match"},
		{sqlxbroker.Table{Name: "a.b.c"}, "schema"},
		{sqlxbroker.Table{Name: "jobs", LockedUntil: "lu", Lease: 1500 * time.Millisecond}, "whole number of seconds"},
		{sqlxbroker.Table{Name: "jobs", Lease: time.Second}, "LockedUntil"},
		{sqlxbroker.Table{Name: "jobs", AdvisoryLock: "k-{a"}, "unclosed"},
		{sqlxbroker.Table{Name: "jobs", AdvisoryLock: "constant"}, "no column"},
		{sqlxbroker.Table{Name: "jobs", AdvisoryLock: "k-{a b}"}, "must match"},
		{sqlxbroker.Table{Name: "jobs", AdvisoryLock: "k-{a}", LockedUntil: "lu"}, "one claim form"},
		{sqlxbroker.Table{Name: "jobs", MaxAttempts: 3}, "DeadAt"},
	} {
		err := c.t.Validate()
		if !errors.Is(err, sqlxbroker.ErrInvalidTable) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want ErrInvalidTable naming %q", c.t, err, c.want)
		}
	}
	k, err := core.ParseKeyTemplate("acct-{account}-{{x}}-{region}")
	if err != nil {
		t.Fatal(err)
	}
	got := k.Render(func(c string) any { return map[string]any{"account": int64(7), "region": []byte("eu")}[c] })
	if got != "acct-7-{x}-eu" {
		t.Errorf("Render = %q", got)
	}
}

type dollarDialect struct{ fakeDialect }

func (dollarDialect) BindType() int { return sqlx.DOLLAR }

// TestRegisterBindsDriver: a dialect registered under a driver name sqlx
// does not know makes sqlx rebind that name's statements (a handler's
// Delivery.Tx().Rebind) with the dialect's placeholders; a name sqlx binds
// otherwise is refused.
func TestRegisterBindsDriver(t *testing.T) {
	if sqlx.BindType("fake-dollar") != sqlx.UNKNOWN {
		t.Fatal("fake-dollar is known to sqlx before it is registered")
	}
	sqlxbroker.Register("fake-dollar", dollarDialect{})
	if got := sqlx.Rebind(sqlx.BindType("fake-dollar"), "SELECT ? + ?"); got != "SELECT $1 + $2" {
		t.Errorf("after Register, a fake-dollar statement rebinds as %q", got)
	}
	mustPanic(t, "Register of a $-dialect under sqlx's ?-bound mysql", func() { sqlxbroker.Register("mysql", dollarDialect{}) })
	if _, err := sqlxbroker.Lookup("mysql"); err == nil {
		t.Error("a refused registration was kept")
	}
}
