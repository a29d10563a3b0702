package dashboard_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/conformance/provision"
	_ "github.com/sqlxbroker/sqlxbroker/dialects/mysql"
	_ "github.com/sqlxbroker/sqlxbroker/dialects/postgres"
	"github.com/sqlxbroker/sqlxbroker/dialects/sqlite"
)

// backend opens a database the dashboard tests may create tables in.
type backend struct {
	name string
	open func(t *testing.T) *sqlx.DB
}

// backends are SQLite (always), PostgreSQL and MariaDB (their DSN
// variables, else a container where Docker runs, else a skip naming the
// variable, a failure under SQLXBROKER_REQUIRE_DB=1).
func backends() []backend {
	return []backend{
		{"sqlite", openSQLite},
		{"postgres", func(t *testing.T) *sqlx.DB { return openDSN(t, "postgres", provision.Postgres.Get(t)) }},
		{"mariadb", func(t *testing.T) *sqlx.DB { return openDSN(t, "mysql", provision.MariaDB.Get(t)) }},
	}
}

func openSQLite(t *testing.T) *sqlx.DB {
	t.Helper()
	db, err := sqlite.Open(filepath.Join(t.TempDir(), "dash.db"))
	if err != nil {
		t.Fatalf("open sqlite: %v", err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func openDSN(t *testing.T, driver, dsn string) *sqlx.DB {
	t.Helper()
	db, err := sqlx.Open(driver, dsn)
	if err != nil {
		t.Fatalf("open %s: %v", driver, err)
	}
	t.Cleanup(func() { db.Close() })
	if err := db.Ping(); err != nil {
		t.Fatalf("ping %s: %v", driver, err)
	}
	return db
}

// eachBackend runs f on each backend as a subtest.
func eachBackend(t *testing.T, f func(t *testing.T, b *sqlxbroker.Broker)) {
	for _, be := range backends() {
		t.Run(be.name, func(t *testing.T) {
			db := be.open(t)
			b, err := sqlxbroker.Open(db)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = b.Close(context.Background()) })
			f(t, b)
		})
	}
}

// newTable creates a fresh, randomly named table on b (dropped when the
// test ends) with every column the dashboard shows and a body payload.
func newTable(t *testing.T, b *sqlxbroker.Broker, form sqlxbroker.Form) sqlxbroker.Table {
	t.Helper()
	return newTableNamed(t, b, "dash", form)
}

// newTableNamed is newTable with a name starting prefix_.
func newTableNamed(t *testing.T, b *sqlxbroker.Broker, prefix string, form sqlxbroker.Form) sqlxbroker.Table {
	t.Helper()
	var rnd [3]byte
	_, _ = rand.Read(rnd[:])
	tb := sqlxbroker.Table{Name: prefix + "_" + hex.EncodeToString(rnd[:]), ReadyAt: "ready_at", DeadAt: "dead_at",
		DoneAt: "done_at", LastError: "last_error", MaxAttempts: 3}
	switch form {
	case sqlxbroker.Lease:
		tb.LockedUntil = "locked_until"
	case sqlxbroker.Advisory:
		tb.AdvisoryLock = "k-{body}"
	}
	if err := b.CreateTable(context.Background(), tb, [2]string{"body", "text"}); err != nil {
		t.Fatalf("create table: %v", err)
	}
	t.Cleanup(func() { _, _ = b.DB().Exec("DROP TABLE " + b.Dialect().QuoteIdent(tb.Name)) })
	return tb
}

// notLease is a form other than the lease that b offers: row lock, else
// advisory (SQLite).
func notLease(b *sqlxbroker.Broker) sqlxbroker.Form {
	if _, err := b.Plan(sqlxbroker.Table{Name: "x"}); err == nil {
		return sqlxbroker.RowLock
	}
	return sqlxbroker.Advisory
}

var quiet = slog.New(slog.DiscardHandler)

// seed publishes n rows in a state set through the state's columns; dead
// rows get attempt 3 and lastErr.
func seed(t *testing.T, b *sqlxbroker.Broker, tb sqlxbroker.Table, st sqlxbroker.State, n int, body, lastErr string) {
	t.Helper()
	now := time.Now().UTC().Truncate(time.Microsecond)
	enc := b.Dialect().EncodeTime
	var msgs []any
	for i := 0; i < n; i++ {
		m := map[string]any{"body": fmt.Sprintf("%s %d", body, i)}
		switch st {
		case sqlxbroker.StateReady:
			m["ready_at"] = enc(now.Add(-time.Minute))
		case sqlxbroker.StateScheduled:
			m["ready_at"] = enc(now.Add(time.Hour))
		case sqlxbroker.StateDead:
			m["dead_at"], m["attempt"], m["last_error"] = enc(now.Add(-time.Minute)), 3, lastErr
		case sqlxbroker.StateDone:
			m["done_at"] = enc(now.Add(-time.Minute))
		default:
			t.Fatalf("seed: no way to seed %s rows", st)
		}
		msgs = append(msgs, m)
	}
	if err := b.Publish(context.Background(), b.DB(), tb, msgs...); err != nil {
		t.Fatalf("publish %s rows: %v", st, err)
	}
}

// ids lists the ids of tb's rows in st.
func ids(t *testing.T, b *sqlxbroker.Broker, tb sqlxbroker.Table, st sqlxbroker.State) []string {
	t.Helper()
	page, err := b.List(context.Background(), tb, sqlxbroker.ListParams{State: st, Limit: 1000})
	if err != nil {
		t.Fatalf("list %s: %v", st, err)
	}
	var out []string
	for _, r := range page.Rows {
		out = append(out, fmt.Sprint(r.ID))
	}
	return out
}

func counts(t *testing.T, b *sqlxbroker.Broker, tb sqlxbroker.Table) sqlxbroker.Counts {
	t.Helper()
	c, err := b.Counts(context.Background(), tb)
	if err != nil {
		t.Fatalf("counts: %v", err)
	}
	return c
}

// get runs a GET through h and returns the status and body.
func get(t *testing.T, h http.Handler, target string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, target, nil))
	body, _ := io.ReadAll(rec.Result().Body)
	return rec.Code, string(body)
}

// post runs a form POST through h, with extra headers, and returns the
// response.
func post(t *testing.T, h http.Handler, target string, form url.Values, headers ...string) *http.Response {
	t.Helper()
	req := httptest.NewRequest(http.MethodPost, target, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Result()
}

var tokenRE = regexp.MustCompile(`name="token" value="([0-9a-f]+)"`)

// token reads the CSRF token from a page.
func token(t *testing.T, page string) string {
	t.Helper()
	m := tokenRE.FindStringSubmatch(page)
	if m == nil {
		t.Fatalf("no token in the page:\n%s", page)
	}
	return m[1]
}

// tablePath is the path of tb's page for st below the mount point.
func tablePath(tb sqlxbroker.Table, st sqlxbroker.State) string {
	return "/t/" + url.PathEscape(tb.Name) + "?state=" + string(st)
}
