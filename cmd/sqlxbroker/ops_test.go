package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/conformance/provision"
	"github.com/sqlxbroker/sqlxbroker/dialects/sqlite"
)

// opsDB is a database the operations commands are tested on.
type opsDB struct {
	driver, dsn string
	db          *sqlx.DB
	b           *sqlxbroker.Broker
}

// opsDatabases runs f on SQLite always, and on PostgreSQL and MariaDB
// when their DSNs are set (SQLXBROKER_POSTGRES_DSN, SQLXBROKER_MYSQL_DSN;
// without one the subtest skips, or fails under SQLXBROKER_REQUIRE_DB=1).
func opsDatabases(t *testing.T, f func(t *testing.T, d *opsDB)) {
	open := func(t *testing.T, driver, dsn, connDSN string) *opsDB {
		db, err := sqlx.Open(driver, connDSN)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		b, err := sqlxbroker.Open(db)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close(context.Background()) })
		return &opsDB{driver: driver, dsn: dsn, db: db, b: b}
	}
	t.Run("sqlite", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "ops.db")
		f(t, open(t, "sqlite", path, sqlite.DSN(path)))
	})
	t.Run("postgres", func(t *testing.T) {
		dsn := provision.Postgres.Get(t)
		f(t, open(t, "postgres", dsn, dsn))
	})
	t.Run("mysql", func(t *testing.T) {
		dsn := provision.MariaDB.Get(t)
		f(t, open(t, "mysql", dsn, dsn))
	})
}

// run runs an operations command in-process.
func run(args ...string) (stdout, stderr string, err error) {
	var out, errOut bytes.Buffer
	cmd, ok := opsCommands[args[0]]
	if !ok {
		return "", "", fmt.Errorf("no command %q", args[0])
	}
	err = cmd(context.Background(), args[1:], &out, &errOut)
	return out.String(), errOut.String(), err
}

// opsTestTable is the tables' description: lease form, every state column.
func opsTestTable(name string) sqlxbroker.Table {
	return sqlxbroker.Table{Name: name, LockedUntil: "locked_until", ReadyAt: "ready_at", DeadAt: "dead_at",
		DoneAt: "done_at", LastError: "last_error", Metadata: "meta", MaxAttempts: 3}
}

// describeArgs are the flags describing opsTestTable(name).
func describeArgs(d *opsDB, name string) []string {
	return []string{"--driver", d.driver, "--dsn", d.dsn, "--table", name, "--locked-until", "locked_until",
		"--ready-at", "ready_at", "--dead-at", "dead_at", "--done-at", "done_at", "--last-error", "last_error", "--metadata", "meta", "--max-attempts", "3"}
}

func randName(prefix string) string {
	return fmt.Sprintf("%s_%s", prefix, randHex(4))
}

// fill creates a table and publishes rows in each state.
func fill(t *testing.T, d *opsDB, n map[sqlxbroker.State]int) sqlxbroker.Table {
	t.Helper()
	ctx := context.Background()
	tb := opsTestTable(randName("sxb_cli"))
	if err := d.b.CreateTable(ctx, tb, [2]string{"body", "text"}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.db.Exec("DROP TABLE IF EXISTS " + d.b.Dialect().QuoteIdent(tb.Name)) })
	now := time.Now().UTC().Truncate(time.Microsecond)
	enc := func(at time.Time) any { return d.b.Dialect().EncodeTime(at) }
	for _, st := range sqlxbroker.States {
		var msgs []any
		for i := range n[st] {
			m := map[string]any{"body": fmt.Sprintf("%s-%d", st, i), "ready_at": enc(now.Add(-time.Hour))}
			switch st {
			case sqlxbroker.StateScheduled:
				m["ready_at"] = enc(now.Add(time.Hour))
			case sqlxbroker.StateInWork:
				m["locked_until"] = enc(now.Add(20 * time.Second))
			case sqlxbroker.StateDead:
				m["dead_at"], m["last_error"], m["attempt"] = enc(now.Add(-time.Minute)), "boom "+fmt.Sprint(i), 3
			case sqlxbroker.StateDone:
				m["done_at"] = enc(now.Add(-2 * time.Hour))
			}
			msgs = append(msgs, m)
		}
		if len(msgs) > 0 {
			if err := d.b.Publish(ctx, d.db, tb, msgs...); err != nil {
				t.Fatalf("publish %s rows: %v", st, err)
			}
		}
	}
	return tb
}

// statsOf runs stats --json on the table.
func statsOf(t *testing.T, d *opsDB, name string) statsJSON {
	t.Helper()
	out, _, err := run(append([]string{"stats", "--json"}, describeArgs(d, name)...)...)
	if err != nil {
		t.Fatalf("stats: %v", err)
	}
	var s statsJSON
	if err := json.Unmarshal([]byte(out), &s); err != nil {
		t.Fatalf("stats --json: %v\n%s", err, out)
	}
	return s
}

// countsOf is stats' counts in States order.
func countsOf(t *testing.T, d *opsDB, name string) []int64 {
	s := statsOf(t, d, name)
	v := func(p *int64) int64 {
		if p == nil {
			return -1
		}
		return *p
	}
	return []int64{s.Ready, v(s.Scheduled), v(s.InWork), v(s.Dead), v(s.Done)}
}

func rowCount(t *testing.T, d *opsDB, name string) int {
	var n int
	if err := d.db.Get(&n, "SELECT COUNT(*) FROM "+d.b.Dialect().QuoteIdent(name)); err != nil {
		t.Fatal(err)
	}
	return n
}

// listIDs runs list --json and returns the ids and the next cursor.
func listIDs(t *testing.T, d *opsDB, name string, args ...string) (ids []string, rows []map[string]any, next string) {
	t.Helper()
	out, errOut, err := run(append(append([]string{"list", "--json"}, describeArgs(d, name)...), args...)...)
	if err != nil {
		t.Fatalf("list %v: %v", args, err)
	}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if line == "" {
			continue
		}
		var r map[string]any
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("list --json: %v\n%s", err, line)
		}
		ids = append(ids, fmt.Sprint(r["id"]))
		rows = append(rows, r)
	}
	if _, after, ok := strings.Cut(errOut, "--after "); ok {
		next = strings.TrimSpace(after)
	}
	return ids, rows, next
}

func TestOpsCommands(t *testing.T) {
	opsDatabases(t, func(t *testing.T, d *opsDB) {
		want := map[sqlxbroker.State]int{sqlxbroker.StateReady: 7, sqlxbroker.StateScheduled: 4,
			sqlxbroker.StateInWork: 3, sqlxbroker.StateDead: 5, sqlxbroker.StateDone: 6}
		tb := fill(t, d, want)
		name := tb.Name

		// stats: the counts per state, and the oldest ready row's age.
		s := statsOf(t, d, name)
		if got := countsOf(t, d, name); !slices.Equal(got, []int64{7, 4, 3, 5, 6}) {
			t.Fatalf("stats counts %v, want [7 4 3 5 6] (ready, scheduled, in work, dead, done)", got)
		}
		if s.OldestReadyAge == nil || *s.OldestReadyAge < 3500 || *s.OldestReadyAge > 3700 {
			t.Errorf("oldest ready age %v s, want about 3600", s.OldestReadyAge)
		}
		out, _, err := run(append([]string{"stats"}, describeArgs(d, name)...)...)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out, name) || !strings.Contains(out, "in work") || !strings.Contains(out, "1h0m") { // an hour and the seconds the test took
			t.Errorf("stats table:\n%s", out)
		}

		// list: dead rows in pages of 2, by id, with attempt and last error.
		var all []string
		next := ""
		for page := 0; ; page++ {
			args := []string{"--state", "dead", "--limit", "2"}
			if next != "" {
				args = append(args, "--after", next)
			}
			ids, rows, n := listIDs(t, d, name, args...)
			if len(ids) > 2 || page > 5 {
				t.Fatalf("page %d: %d rows", page, len(ids))
			}
			for _, r := range rows {
				if !strings.HasPrefix(fmt.Sprint(r["last_error"]), "boom") || fmt.Sprint(r["attempt"]) != "3" {
					t.Errorf("dead row %v: last error %q, attempt %v", r["id"], r["last_error"], r["attempt"])
				}
			}
			all = append(all, ids...)
			if n == "" {
				break
			}
			next = n
		}
		if len(all) != 5 {
			t.Fatalf("listed %d dead rows in pages, want 5: %v", len(all), all)
		}
		out, _, err = run(append([]string{"list", "--state", "dead"}, describeArgs(d, name)...)...)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out, "last error") || !strings.Contains(out, "body") || !strings.Contains(out, "dead-0") ||
			strings.Contains(out, "locked_until") {
			t.Errorf("list table (want id, attempt, last error, body):\n%s", out)
		}

		// requeue one dead row by id: it becomes ready, as new.
		out, _, err = run(append([]string{"requeue", "--id", all[0]}, describeArgs(d, name)...)...)
		if err != nil || !strings.Contains(out, "requeued 1 ") {
			t.Fatalf("requeue --id %s: %q, %v", all[0], out, err)
		}
		if got := countsOf(t, d, name); !slices.Equal(got, []int64{8, 4, 3, 4, 6}) {
			t.Fatalf("after requeue: counts %v, want [8 4 3 4 6]", got)
		}
		ids, rows, _ := listIDs(t, d, name, "--state", "ready", "--limit", "1000")
		i := slices.Index(ids, all[0])
		if i < 0 {
			t.Fatalf("requeued row %s is not ready: %v", all[0], ids)
		}
		if rows[i]["last_error"] != "" || fmt.Sprint(rows[i]["attempt"]) != "1" {
			t.Errorf("requeued row: last error %q, attempt %v; want none and 1", rows[i]["last_error"], rows[i]["attempt"])
		}
		// requeue a list, one of which is no longer dead.
		out, _, err = run(append([]string{"requeue", "--id", all[0] + "," + all[1], "--id", all[2]}, describeArgs(d, name)...)...)
		if err != nil || !strings.Contains(out, "requeued 2 ") {
			t.Fatalf("requeue of a list: %q, %v", out, err)
		}

		// delete: the remaining dead rows, all of them.
		out, _, err = run(append([]string{"delete", "--state", "dead", "--all", "--batch", "1"}, describeArgs(d, name)...)...)
		if err != nil || !strings.Contains(out, "deleted 2 dead") {
			t.Fatalf("delete --all: %q, %v", out, err)
		}
		// delete one scheduled row by id.
		sched, _, _ := listIDs(t, d, name, "--state", "scheduled")
		out, _, err = run(append([]string{"delete", "--state", "scheduled", "--id", sched[0]}, describeArgs(d, name)...)...)
		if err != nil || !strings.Contains(out, "deleted 1 scheduled") {
			t.Fatalf("delete --id: %q, %v", out, err)
		}
		if got := countsOf(t, d, name); !slices.Equal(got, []int64{10, 3, 3, 0, 6}) {
			t.Fatalf("after delete: counts %v, want [10 3 3 0 6]", got)
		}

		// prune: done rows older than an hour go, newer ones stay.
		out, _, err = run(append([]string{"prune", "--older-than", "3h"}, describeArgs(d, name)...)...)
		if err != nil || !strings.Contains(out, "pruned 0 ") {
			t.Fatalf("prune --older-than 3h: %q, %v", out, err)
		}
		out, _, err = run(append([]string{"prune", "--older-than", "1h", "--batch", "4"}, describeArgs(d, name)...)...)
		if err != nil || !strings.Contains(out, "pruned 6 ") {
			t.Fatalf("prune --older-than 1h: %q, %v", out, err)
		}
		if got := countsOf(t, d, name); !slices.Equal(got, []int64{10, 3, 3, 0, 0}) {
			t.Fatalf("after prune: counts %v, want [10 3 3 0 0]", got)
		}
	})
}

// TestOpsBadInput: every bad input is an error naming the problem, and
// nothing changes.
func TestOpsBadInput(t *testing.T) {
	opsDatabases(t, func(t *testing.T, d *opsDB) {
		tb := fill(t, d, map[sqlxbroker.State]int{sqlxbroker.StateReady: 2, sqlxbroker.StateDead: 3, sqlxbroker.StateDone: 2})
		base := describeArgs(d, tb.Name)
		with := func(args []string, flag, value string) []string {
			out := slices.Clone(args)
			i := slices.Index(out, flag)
			out[i+1] = value
			return out
		}
		missing := randName("sxb_cli_missing")
		dir := t.TempDir()
		badKey := filepath.Join(dir, "bad.json")
		os.WriteFile(badKey, []byte(`[{"name":"`+tb.Name+`","dead_at":"dead_at","deadat":"x"}]`), 0o644)
		cases := []struct {
			name string
			args []string
			want []string // in the error
		}{
			{"unknown table", append([]string{"delete", "--state", "dead", "--all"}, with(base, "--table", missing)...), []string{missing}},
			{"unknown table, stats", append([]string{"stats"}, with(base, "--table", missing)...), []string{missing}},
			{"missing column", append([]string{"requeue", "--all"}, with(base, "--last-error", "why_it_failed")...), []string{"why_it_failed", "LastError"}},
			{"missing column, prune", append([]string{"prune", "--older-than", "0s"}, with(base, "--done-at", "finished_at")...), []string{"finished_at"}},
			{"unknown state", append([]string{"delete", "--state", "deceased", "--all"}, base...), []string{`unknown state "deceased"`}},
			{"unknown state, list", append([]string{"list", "--state", "zombie"}, base...), []string{`unknown state "zombie"`}},
			{"missing dsn", append([]string{"delete", "--state", "dead", "--all"}, with(base, "--dsn", "")...), []string{"--dsn is required"}},
			{"no selection", append([]string{"requeue"}, base...), []string{"--id", "--all"}},
			{"in work", append([]string{"delete", "--state", "in-work", "--all"}, base...), []string{"in work"}},
			{"unknown key", []string{"delete", "--driver", d.driver, "--dsn", d.dsn, "--tables", badKey, "--state", "dead", "--all"}, []string{`"deadat"`}},
			{"description twice", append([]string{"stats", "--tables", badKey}, base...), []string{"--tables"}},
		}
		rows, counts := rowCount(t, d, tb.Name), countsOf(t, d, tb.Name)
		for _, c := range cases {
			_, _, err := run(c.args...)
			if err == nil {
				t.Errorf("%s: no error", c.name)
				continue
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%s: error %q does not name %q", c.name, err, w)
				}
			}
			if n, got := rowCount(t, d, tb.Name), countsOf(t, d, tb.Name); n != rows || !slices.Equal(got, counts) {
				t.Errorf("%s changed the table: %d rows %v, was %d %v", c.name, n, got, rows, counts)
			}
		}
		// The library check the commands use, directly.
		ctx := context.Background()
		if err := d.b.CheckTable(ctx, tb); err != nil {
			t.Errorf("CheckTable of the live table: %v", err)
		}
		bad := tb
		bad.ReadyAt = "ready_when"
		err := d.b.CheckTable(ctx, bad)
		var te *sqlxbroker.TableError
		if !errors.As(err, &te) || te.Field != "ReadyAt" || !strings.Contains(err.Error(), "ready_when") {
			t.Errorf("CheckTable with a missing column: %v, want a TableError naming ReadyAt and ready_when", err)
		}
		bad = tb
		bad.Name = missing
		if err := d.b.CheckTable(ctx, bad); !errors.As(err, &te) || te.Field != "Name" {
			t.Errorf("CheckTable of a missing table: %v, want a TableError on Name", err)
		}
	})
}

// TestStatsTables: a --tables file with several tables gives a row each.
func TestStatsTables(t *testing.T) {
	opsDatabases(t, func(t *testing.T, d *opsDB) {
		a := fill(t, d, map[sqlxbroker.State]int{sqlxbroker.StateReady: 2, sqlxbroker.StateDead: 1})
		b := fill(t, d, map[sqlxbroker.State]int{sqlxbroker.StateReady: 5})
		file := filepath.Join(t.TempDir(), "tables.json")
		desc := `[
  {"name": "` + a.Name + `", "locked_until": "locked_until", "lease": "30s", "ready_at": "ready_at", "dead_at": "dead_at", "done_at": "done_at", "last_error": "last_error", "max_attempts": 3},
  {"name": "` + b.Name + `", "ready_at": "ready_at", "dead_at": "dead_at"}
]`
		if err := os.WriteFile(file, []byte(desc), 0o644); err != nil {
			t.Fatal(err)
		}
		if d.driver == "sqlite" {
			// SQLite has no row locks: the second table as a lease table.
			desc = strings.Replace(desc, `"ready_at": "ready_at", "dead_at": "dead_at"}`, `"locked_until": "locked_until", "ready_at": "ready_at", "dead_at": "dead_at"}`, 1)
			os.WriteFile(file, []byte(desc), 0o644)
		}
		out, _, err := run("stats", "--driver", d.driver, "--dsn", d.dsn, "--tables", file, "--json")
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) != 2 {
			t.Fatalf("stats --json of two tables: %d lines\n%s", len(lines), out)
		}
		var sa, sb statsJSON
		json.Unmarshal([]byte(lines[0]), &sa)
		json.Unmarshal([]byte(lines[1]), &sb)
		if sa.Table != a.Name || sa.Ready != 2 || sa.Dead == nil || *sa.Dead != 1 || sb.Table != b.Name || sb.Ready != 5 || sb.Done != nil {
			t.Errorf("stats --json:\n%s", out)
		}
		if d.driver != "sqlite" && (sb.InWork != nil || sb.Form != "row-lock") {
			t.Errorf("row-lock table: in work %v (want null), form %s", sb.InWork, sb.Form)
		}
		out, _, err = run("stats", "--driver", d.driver, "--dsn", d.dsn, "--tables", file)
		if err != nil {
			t.Fatal(err)
		}
		if lines := strings.Split(strings.TrimSpace(out), "\n"); len(lines) != 3 || !strings.Contains(lines[2], " - ") {
			t.Errorf("stats table of two tables (a header, a row each, '-' for what a table cannot tell):\n%s", out)
		}
		// One table of the file, by name; list needs one.
		if _, _, err := run("list", "--driver", d.driver, "--dsn", d.dsn, "--tables", file, "--state", "ready"); err == nil ||
			!strings.Contains(err.Error(), "--table NAME") {
			t.Errorf("list of two tables: %v, want an error asking for --table", err)
		}
		ids, _, _ := func() ([]string, []map[string]any, string) {
			out, _, err := run("list", "--driver", d.driver, "--dsn", d.dsn, "--tables", file, "--table", b.Name, "--state", "ready", "--json")
			if err != nil {
				t.Fatal(err)
			}
			return strings.Split(strings.TrimSpace(out), "\n"), nil, ""
		}()
		if len(ids) != 5 {
			t.Errorf("list --tables --table %s: %d rows, want 5", b.Name, len(ids))
		}
	})
}

// TestStatsWatch: --watch refreshes until its context ends.
func TestStatsWatch(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ops.db")
	d := &opsDB{driver: "sqlite", dsn: path}
	db, err := sqlx.Open("sqlite", sqlite.DSN(path))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	d.db = db
	d.b, _ = sqlxbroker.Open(db)
	tb := fill(t, d, map[sqlxbroker.State]int{sqlxbroker.StateReady: 1})
	ctx, cancel := context.WithCancel(context.Background())
	var out bytes.Buffer
	done := make(chan error, 1)
	go func() {
		done <- statsCmd(ctx, append([]string{"--watch", "20ms", "--json"}, describeArgs(d, tb.Name)...), &out, &bytes.Buffer{})
	}()
	time.Sleep(300 * time.Millisecond)
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("stats --watch: %v", err)
	}
	if n := strings.Count(out.String(), "\n"); n < 2 {
		t.Errorf("stats --watch printed %d lines before it was stopped, want several", n)
	}
}

// TestDDLGoose: the goose migration applies and rolls back on the database.
func TestDDLGoose(t *testing.T) {
	opsDatabases(t, func(t *testing.T, d *opsDB) {
		name := randName("sxb_cli_ddl")
		args := append([]string{"ddl", "--format", "goose", "--payload", "body:text", "--payload", "n:bigint"}, describeArgs(d, name)...)
		out, _, err := run(args...)
		if err != nil {
			t.Fatal(err)
		}
		upText, downText, ok := strings.Cut(out, "-- +goose Down\n")
		if !ok || !strings.HasPrefix(upText, "-- +goose Up\n") {
			t.Fatalf("goose output:\n%s", out)
		}
		t.Cleanup(func() { d.db.Exec("DROP TABLE IF EXISTS " + d.b.Dialect().QuoteIdent(name)) })
		exec := func(text string) {
			for _, stmt := range strings.Split(strings.TrimPrefix(text, "-- +goose Up\n"), ";\n") {
				if strings.TrimSpace(stmt) == "" {
					continue
				}
				if _, err := d.db.Exec(stmt); err != nil {
					t.Fatalf("%v\n%s", err, stmt)
				}
			}
		}
		exec(upText)
		tb := opsTestTable(name)
		if err := d.b.CheckTable(context.Background(), tb); err != nil {
			t.Fatalf("the table the Up part made: %v", err)
		}
		if err := d.b.Publish(context.Background(), d.db, tb, map[string]any{"body": "x", "n": 1}); err != nil {
			t.Fatal(err)
		}
		if got := countsOf(t, d, name); !slices.Equal(got, []int64{1, 0, 0, 0, 0}) {
			t.Errorf("counts of the migrated table: %v", got)
		}
		exec(downText)
		if err := d.b.CheckTable(context.Background(), tb); err == nil {
			t.Errorf("the table is still there after the Down part")
		}
		// migrate --out writes the two files.
		dir := t.TempDir()
		out, _, err = run(append([]string{"ddl", "--format", "migrate", "--out", dir, "--name", "0001_jobs"}, describeArgs(d, name)...)...)
		if err != nil {
			t.Fatal(err)
		}
		up, err1 := os.ReadFile(filepath.Join(dir, "0001_jobs.up.sql"))
		down, err2 := os.ReadFile(filepath.Join(dir, "0001_jobs.down.sql"))
		if err1 != nil || err2 != nil || !strings.Contains(string(up), "CREATE TABLE") || !strings.Contains(string(down), "DROP TABLE") {
			t.Errorf("migrate files: %v %v\n%s\n%s", err1, err2, up, down)
		}
		if _, _, err := run(append([]string{"ddl", "--format", "migrate", "--out", dir, "--name", "0001_jobs"}, describeArgs(d, name)...)...); err == nil {
			t.Errorf("ddl --out over existing files: no error")
		}
	})
}
