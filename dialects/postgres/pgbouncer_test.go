package postgres_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/conformance"
	"github.com/sqlxbroker/sqlxbroker/core"
	"github.com/sqlxbroker/sqlxbroker/dialects/postgres"
	"github.com/sqlxbroker/sqlxbroker/internal/testreport"
)

// The PgBouncer tests run through the two poolers scripts/pgbouncer.sh
// starts in front of the local PostgreSQL:
//
//	eval "$(bash scripts/pgbouncer.sh)"   # SQLXBROKER_PGBOUNCER_SESSION_DSN, SQLXBROKER_PGBOUNCER_TX_DSN
//	go test ./dialects/postgres -run PgBouncer -count=1
//
// Without the variables they skip, or fail when
// SQLXBROKER_REQUIRE_PGBOUNCER=1 (CI). SQLXBROKER_PGBOUNCER_SHORT=1 runs a
// subset of the suite's scenarios through each pooler (quickScenarios).

const (
	sessionEnv = "SQLXBROKER_PGBOUNCER_SESSION_DSN"
	txEnv      = "SQLXBROKER_PGBOUNCER_TX_DSN"
)

// pgbouncerDSN returns the DSN in env var name, set by scripts/pgbouncer.sh.
func pgbouncerDSN(t *testing.T, name string) string {
	t.Helper()
	what := "PgBouncer session mode"
	if name == txEnv {
		what = "PgBouncer transaction mode"
	}
	dsn := strings.TrimSpace(os.Getenv(name))
	if dsn == "" {
		msg := name + " is not set; run eval \"$(bash scripts/pgbouncer.sh)\" to start the poolers"
		if os.Getenv("SQLXBROKER_REQUIRE_PGBOUNCER") == "1" {
			t.Fatal(msg + " (SQLXBROKER_REQUIRE_PGBOUNCER=1)")
		}
		testreport.Skip(t, what, msg)
	}
	testreport.Tested(t, what, name)
	return dsn
}

// quickScenarios are the scenarios SQLXBROKER_PGBOUNCER_SHORT=1 runs (CI):
// those that hold a session or a transaction across statements, or end
// sessions or cut connections, where a pooler's routing shows. The full run is recorded in
// docs/compatibility.md.
var quickScenarios = []string{
	"ExactlyOnce", "SkipLocked", "CrashRecovery", "LeaseLoss", "FIFO", "Outcomes",
	"AdvisoryKeys", "AdvisoryBatch", "HolderLost", "SessionLoss", "SessionCrash",
	"HandlerTx", "TxAfterCompletion", "PublishDuplicates", "HostileKeys", "NetworkCut",
}

// pgbouncerTarget is target(dsn) at Short volumes, limited to
// quickScenarios when SQLXBROKER_PGBOUNCER_SHORT=1.
func pgbouncerTarget(dsn string) conformance.Target {
	tg := target(dsn)
	tg.Short = true
	if os.Getenv("SQLXBROKER_PGBOUNCER_SHORT") == "1" {
		tg.Scenarios = quickScenarios
	}
	return tg
}

// withApp adds application_name=app to a URL DSN.
func withApp(dsn, app string) string {
	if strings.Contains(dsn, "?") {
		return dsn + "&application_name=" + app
	}
	return dsn + "?application_name=" + app
}

// TestConformancePgBouncerSession runs the suite through PgBouncer in
// session mode with the plain dialect: every form passes, as direct. A
// client connection keeps its server session, so the suite ends sessions
// by their pg_backend_pid as on a direct connection (PgBouncer then drops
// the client). Short volumes: the main server runs the full ones;
// SQLXBROKER_PGBOUNCER_SHORT=1 runs quickScenarios only.
func TestConformancePgBouncerSession(t *testing.T) {
	conformance.Run(t, pgbouncerTarget(pgbouncerDSN(t, sessionEnv)))
}

// TestConformancePgBouncerTransaction runs the suite through PgBouncer in
// transaction mode with Dialect{TransactionPooling: true}: the row-lock
// and lease forms pass every scenario, and the advisory form is refused at
// subscribe time with a *sqlxbroker.FormError (the Refused scenario).
// Subscriptions poll (no LISTEN), and the row-lock form prepares nothing:
// PgBouncer 1.18 forwards no prepared statement. A pool's server sessions
// are not its own here, so the suite's session kill ends the server
// sessions that serve the pool's client connections, found by the pool's
// application_name (PgBouncer sets it on each server session it links).
// Short volumes, and quickScenarios only with SQLXBROKER_PGBOUNCER_SHORT=1.
func TestConformancePgBouncerTransaction(t *testing.T) {
	dsn := pgbouncerDSN(t, txEnv)
	tg := pgbouncerTarget(dsn)
	tg.Dialect = postgres.Dialect{TransactionPooling: true}
	tg.Refuses = []sqlxbroker.Form{sqlxbroker.Advisory}
	tg.Sessions = appSessions(dsn)
	conformance.Run(t, tg)
}

// appSessions is a Target.Sessions for a transaction-mode pooler: the pool
// gets an application_name of its own, and kill terminates every server
// session that carries it (those linked to its client connections now,
// its transactions among them, and idle ones it used last), from a second
// pool. It may end none when no client connection holds a server session.
func appSessions(dsn string) func(t conformance.TB) (*sqlx.DB, func(t conformance.TB) int) {
	return func(t conformance.TB) (*sqlx.DB, func(t conformance.TB) int) {
		t.Helper()
		var rnd [4]byte
		_, _ = rand.Read(rnd[:])
		app := "pgbouncer_kill_" + hex.EncodeToString(rnd[:])
		db, err := sqlx.Open("postgres", withApp(dsn, app))
		if err != nil {
			t.Fatalf("open: %v", err)
		}
		admin, err := sqlx.Open("postgres", dsn)
		if err != nil {
			t.Fatalf("open: %v", err)
		}
		t.Cleanup(func() { db.Close(); admin.Close() })
		return db, func(t conformance.TB) int {
			t.Helper()
			var n int
			if err := admin.QueryRow(`SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&n); err != nil {
				t.Fatalf("end the pool's server sessions: %v", err)
			}
			return n
		}
	}
}

// TestPgBouncerDetect: without TransactionPooling, a pool through the
// transaction-mode pooler is found by its probe: an advisory subscription
// is refused with a FormError that says how the pooler was found, and the
// row-lock form prepares nothing. Through the session-mode pooler and on a
// direct connection the probe finds nothing: advisory subscriptions start
// and the row-lock form prepares.
func TestPgBouncerDetect(t *testing.T) {
	cases := []struct {
		name, env string
		pooled    bool
	}{
		{"transaction", txEnv, true},
		{"session", sessionEnv, false},
		{"direct", "SQLXBROKER_POSTGRES_DSN", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var s string
			if c.env == "SQLXBROKER_POSTGRES_DSN" {
				s = dsn(t)
			} else {
				s = pgbouncerDSN(t, c.env)
			}
			db := sqlx.MustOpen("postgres", s)
			t.Cleanup(func() { db.Close() })
			b := sqlxbroker.OpenDialect(db, postgres.Dialect{})
			t.Cleanup(func() { b.Close(context.Background()) })
			tbl := sqlxbroker.Table{Name: uniq("pgbouncer_detect_"), AdvisoryLock: "acct-{account}"}
			createTable(t, b, tbl)
			sub, serr := b.Subscribe(context.Background(), tbl, func(context.Context, *sqlxbroker.Delivery) error { return nil },
				sqlxbroker.SubscribeParams{PollInterval: 50 * time.Millisecond, Logger: slog.New(&logLines{})})
			var fe *sqlxbroker.FormError
			switch {
			case c.pooled && (!errors.As(serr, &fe) || fe.Form != sqlxbroker.Advisory):
				t.Fatalf("advisory subscription through the transaction-mode pooler: %v, want a FormError", serr)
			case c.pooled && !strings.Contains(fe.Reason, "one server process"):
				t.Errorf("the refusal %q does not say the probe found the pooler", fe.Reason)
			case !c.pooled && serr != nil:
				t.Fatalf("advisory subscription: %v", serr)
			}
			if sub != nil {
				stopAll(t, []*sqlxbroker.Subscription{sub})
			}
			pool := core.NewPool(db, postgres.Dialect{})
			defer pool.Close()
			rl, err := postgres.Dialect{}.RowLock(context.Background(), pool)
			if err != nil {
				t.Fatal(err)
			}
			if rl.Prepare == c.pooled {
				t.Errorf("RowLock prepares: %v, want %v", rl.Prepare, !c.pooled)
			}
			t.Logf("advisory subscription: %v; row lock prepares: %v", serr, rl.Prepare)
		})
	}
}

// TestPgBouncerWakeups: through the session-mode pooler a subscription
// LISTENs, so rows published by another pool while it waits for its next
// poll (an hour away) are delivered on the wake-ups alone, one after the
// other. Through the transaction-mode pooler (TransactionPooling) it does
// not LISTEN: Subscribe says so at Info, warns of nothing, and the rows
// are delivered by polling.
func TestPgBouncerWakeups(t *testing.T) {
	for _, c := range []struct {
		name, env string
		dialect   postgres.Dialect
		poll      time.Duration
	}{
		{"session", sessionEnv, postgres.Dialect{}, time.Hour},
		{"transaction", txEnv, postgres.Dialect{TransactionPooling: true}, 100 * time.Millisecond},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := pgbouncerDSN(t, c.env)
			db, pdb := sqlx.MustOpen("postgres", s), sqlx.MustOpen("postgres", s)
			t.Cleanup(func() { db.Close(); pdb.Close() })
			b, pub := sqlxbroker.OpenDialect(db, c.dialect), sqlxbroker.OpenDialect(pdb, c.dialect)
			t.Cleanup(func() { b.Close(context.Background()); pub.Close(context.Background()) })
			tbl := sqlxbroker.Table{Name: uniq("pgbouncer_wake_"), LockedUntil: "locked_until", Lease: 5 * time.Second}
			createTable(t, pub, tbl)
			logs := &logLines{}
			var mu sync.Mutex
			got := 0
			sub, err := b.Subscribe(context.Background(), tbl, func(context.Context, *sqlxbroker.Delivery) error {
				mu.Lock()
				got++
				mu.Unlock()
				return nil
			}, sqlxbroker.SubscribeParams{PollInterval: c.poll, MinPollInterval: c.poll, Logger: slog.New(logs)})
			if err != nil {
				t.Fatal(err)
			}
			defer stopAll(t, []*sqlxbroker.Subscription{sub})
			// A publish that meets the claim right after a delivery is
			// claimed without a wake-up; three in a row cannot all be.
			for i := range 3 {
				publish(t, pub, tbl, accounts(i, 1))
				waitFor(t, 15*time.Second, "the published row delivered", func() bool {
					mu.Lock()
					defer mu.Unlock()
					return got == i+1
				})
			}
			info, warn := logs.find(slog.LevelInfo, "no wake-ups"), logs.find(slog.LevelWarn, "")
			switch {
			case c.dialect.TransactionPooling && (info == "" || !strings.Contains(info, "transaction mode")):
				t.Errorf("no Info line saying the subscription polls behind the pooler; logged: %v", logs.all())
			case !c.dialect.TransactionPooling && info != "":
				t.Errorf("the session-mode subscription does not listen: %s", info)
			case warn != "":
				t.Errorf("warned: %s", warn)
			}
			t.Logf("logged: %v; %+v", logs.all(), sub.Stats())
		})
	}
}

// logLines is a slog.Handler that keeps each record as level and text.
type logLines struct {
	mu    sync.Mutex
	lines []string
	level []slog.Level
}

func (l *logLines) Enabled(context.Context, slog.Level) bool { return true }
func (l *logLines) Handle(_ context.Context, r slog.Record) error {
	s := r.Message
	r.Attrs(func(a slog.Attr) bool { s += " " + a.String(); return true })
	l.mu.Lock()
	l.lines, l.level = append(l.lines, s), append(l.level, r.Level)
	l.mu.Unlock()
	return nil
}
func (l *logLines) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logLines) WithGroup(string) slog.Handler      { return l }

// find returns the first line at level containing sub, or "".
func (l *logLines) find(level slog.Level, sub string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, s := range l.lines {
		if l.level[i] == level && strings.Contains(s, sub) {
			return s
		}
	}
	return ""
}

func (l *logLines) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.lines...)
}

// TestWithBinaryParameters: the postgres-txpool driver adds
// binary_parameters=yes to URL and key=value DSNs that do not set it, and
// keeps a DSN that does.
func TestWithBinaryParameters(t *testing.T) {
	for in, want := range map[string]string{
		"postgres://u@h:6433/db":                 "postgres://u@h:6433/db?binary_parameters=yes",
		"postgresql://u@h/db?sslmode=disable":    "postgresql://u@h/db?binary_parameters=yes&sslmode=disable",
		"postgres://u@h/db?binary_parameters=no": "postgres://u@h/db?binary_parameters=no",
		"host=h port=6433 dbname=db":             "host=h port=6433 dbname=db binary_parameters=yes",
		"host=h binary_parameters=yes":           "host=h binary_parameters=yes",
		"":                                       "binary_parameters=yes",
	} {
		if got := postgres.WithBinaryParameters(in); got != want {
			t.Errorf("WithBinaryParameters(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestPgBouncerTxPoolDriver: a pool opened with the driver name
// postgres-txpool on the transaction-mode DSN without binary_parameters
// gets the transaction-pooling dialect from sqlxbroker.Open: an advisory
// subscription is refused, and a lease subscription with 16 handlers
// drains 500 rows, each once, with no failed claim or completion (every
// statement with arguments went in one round trip).
func TestPgBouncerTxPoolDriver(t *testing.T) {
	s := strings.Replace(strings.Replace(pgbouncerDSN(t, txEnv), "&binary_parameters=yes", "", 1), "binary_parameters=yes&", "", 1)
	if strings.Contains(s, "binary_parameters") {
		t.Fatalf("cannot take binary_parameters out of %q", s)
	}
	db, err := sqlx.Open(postgres.TxPoolDriver, s)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	db.SetMaxIdleConns(32)
	b := openBroker(t, db)
	t.Cleanup(func() { b.Close(context.Background()) })
	if d, ok := b.Dialect().(postgres.Dialect); !ok || !d.TransactionPooling {
		t.Fatalf("dialect %#v, want TransactionPooling", b.Dialect())
	}
	quiet := slog.New(&logLines{})
	adv := sqlxbroker.Table{Name: uniq("pgbouncer_drv_adv_"), AdvisoryLock: "acct-{account}"}
	createTable(t, b, adv)
	if _, err := b.Subscribe(context.Background(), adv, func(context.Context, *sqlxbroker.Delivery) error { return nil },
		sqlxbroker.SubscribeParams{Logger: quiet}); !errors.Is(err, sqlxbroker.ErrFormUnavailable) {
		t.Fatalf("advisory subscription: %v, want ErrFormUnavailable", err)
	}
	tbl := sqlxbroker.Table{Name: uniq("pgbouncer_drv_"), LockedUntil: "locked_until", Lease: 30 * time.Second}
	createTable(t, b, tbl)
	const n = 500
	publish(t, b, tbl, accounts(0, n))
	var mu sync.Mutex
	done := map[int64]int{}
	sub, err := b.Subscribe(context.Background(), tbl, func(context.Context, *sqlxbroker.Delivery) error { return nil },
		sqlxbroker.SubscribeParams{Concurrency: 16, BatchSize: 4, PollInterval: 50 * time.Millisecond, Logger: quiet,
			OnOutcome: func(d *sqlxbroker.Delivery, o sqlxbroker.Outcome, err error) {
				if err == nil && o.Kind == sqlxbroker.Succeeded {
					mu.Lock()
					done[idOf(d)]++
					mu.Unlock()
				}
			}})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "every row completed", func() bool { return count(t, db, tbl.Name) == 0 })
	stopAll(t, []*sqlxbroker.Subscription{sub})
	st := sub.Stats()
	mu.Lock()
	defer mu.Unlock()
	if len(done) != n {
		t.Errorf("%d rows completed, want %d", len(done), n)
	}
	for id, k := range done {
		if k != 1 {
			t.Errorf("row %d completed %d times", id, k)
		}
	}
	if st.ClaimErrors != 0 || st.CompleteErrors != 0 {
		t.Errorf("stats %+v: want no failed claim or completion", st)
	}
	t.Logf("%+v", st)
}
