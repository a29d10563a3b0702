package main

// The soak's audit. It reads every message table and ledger after the
// drain and checks each message:
//
//   - lost: a committed publish (published ledger) with no row; or a done
//     row with no successful processing recorded (lease, advisory: no run
//     that returned success in the runs ledger; row lock: no handler write
//     committed through the delivery transaction). In a table that deletes
//     done rows (lease-delete), a message without a row is completed when
//     a successful run was recorded, and lost when none was;
//   - pending: a row neither done nor dead after the drain (stuck);
//   - completed twice: a message with more than one finishing outcome
//     (succeeded or dead) that the library reported recorded (OnOutcome
//     with a nil error), or, in the row-lock form, more than one handler
//     write committed through delivery transactions;
//   - other violations: a row without a committed publish, two rows for one
//     message, a row both done and dead, an outcome recorded that the row
//     does not show, and (row lock) a handler write committed for a row
//     that is dead or unfinished.
//
// Allowed and counted: extra runs, handler runs that returned success
// beyond one per done row (and every such run of a row that ended dead). A
// worker killed, or whose session was terminated, after its handler
// returned but before the completion committed leaves the row to be claimed
// again: in the lease form when the lease runs out, in the advisory form
// when the session's end drops the key, in the row-lock form at once, where
// the run's writes through the delivery transaction roll back with it.
// Unrecorded outcomes (a worker killed between the completion's commit and
// the outcome's ledger row) are counted too.

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/jmoiron/sqlx"
	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/core"
)

// soakReport is the soak's result.
type soakReport struct {
	Driver      string       `json:"driver"`
	Server      string       `json:"server"`
	Workers     int          `json:"workers"`
	Concurrency int          `json:"concurrency"`
	Duration    string       `json:"fault_phase"`
	Calm        string       `json:"calm_phase"`
	Drain       string       `json:"drain_phase"`
	Took        string       `json:"took"`
	Faults      soakFaults   `json:"faults"`
	Forms       []formReport `json:"forms"`
	Total       formReport   `json:"total"`
	Violations  []string     `json:"violations"`
	LogDir      string       `json:"log_dir"`
}

// formReport is the audit of one form's table.
type formReport struct {
	Form           string `json:"form"`
	Published      int    `json:"published"`
	Rows           int    `json:"rows"`
	Completed      int    `json:"completed"`
	Dead           int    `json:"dead"`
	Pending        int    `json:"pending"`
	CompletedTwice int    `json:"completed_twice"`
	Lost           int    `json:"lost"`
	Other          int    `json:"other_violations"`
	Runs           int    `json:"handler_runs"`
	FailedRuns     int    `json:"failed_runs"`
	ExtraRuns      int    `json:"extra_runs"`
	Unrecorded     int    `json:"outcomes_unrecorded"`
}

func (r *formReport) add(o formReport) {
	r.Published += o.Published
	r.Rows += o.Rows
	r.Completed += o.Completed
	r.Dead += o.Dead
	r.Pending += o.Pending
	r.CompletedTwice += o.CompletedTwice
	r.Lost += o.Lost
	r.Other += o.Other
	r.Runs += o.Runs
	r.FailedRuns += o.FailedRuns
	r.ExtraRuns += o.ExtraRuns
	r.Unrecorded += o.Unrecorded
}

// rowState is one row of a message table.
type rowState struct{ done, dead bool }

// auditData is what the audit reads for one form, by message.
type auditData struct {
	published map[string]bool
	rows      map[string][]rowState
	okRuns    map[string]int
	failRuns  map[string]int
	effects   map[string]int            // row lock: writes committed through delivery transactions
	outcomes  map[string]map[string]int // kind -> count
}

func newAuditData() *auditData {
	return &auditData{published: map[string]bool{}, rows: map[string][]rowState{}, okRuns: map[string]int{},
		failRuns: map[string]int{}, effects: map[string]int{}, outcomes: map[string]map[string]int{}}
}

// loadAudit reads form f's table and ledger rows.
func loadAudit(ctx context.Context, db *sqlx.DB, d core.Dialect, c soakConfig, f soakVariant) (*auditData, error) {
	a := newAuditData()
	pub, runs, eff, outc := ledgers(c.Prefix)
	t := soakTable(c.Prefix, f, c.Lease, c.MaxAttempts)
	done := "0"
	if t.DoneAt != "" {
		done = "CASE WHEN done_at IS NULL THEN 0 ELSE 1 END"
	}
	q := func(s string, scan func(*sqlx.Rows) error, args ...any) error {
		rows, err := db.QueryxContext(ctx, sqlx.Rebind(d.BindType(), s), args...)
		if err != nil {
			return fmt.Errorf("soak audit: %s: %w", s, err)
		}
		defer rows.Close()
		for rows.Next() {
			if err := scan(rows); err != nil {
				return fmt.Errorf("soak audit: %s: %w", s, err)
			}
		}
		return rows.Err()
	}
	var (
		msg, kind    string
		x, y, n      int
		isDone, dead int
	)
	if err := q("SELECT msg FROM "+pub+" WHERE form = ?", func(r *sqlx.Rows) error {
		if err := r.Scan(&msg); err != nil {
			return err
		}
		a.published[msg] = true
		return nil
	}, f.String()); err != nil {
		return nil, err
	}
	if err := q("SELECT msg, "+done+", CASE WHEN dead_at IS NULL THEN 0 ELSE 1 END FROM "+t.Name, func(r *sqlx.Rows) error {
		if err := r.Scan(&msg, &isDone, &dead); err != nil {
			return err
		}
		a.rows[msg] = append(a.rows[msg], rowState{done: isDone == 1, dead: dead == 1})
		return nil
	}); err != nil {
		return nil, err
	}
	if err := q("SELECT msg, ok, COUNT(*) FROM "+runs+" WHERE form = ? GROUP BY msg, ok", func(r *sqlx.Rows) error {
		if err := r.Scan(&msg, &x, &n); err != nil {
			return err
		}
		if x == 1 {
			a.okRuns[msg] += n
		} else {
			a.failRuns[msg] += n
		}
		return nil
	}, f.String()); err != nil {
		return nil, err
	}
	if err := q("SELECT msg, COUNT(*) FROM "+eff+" WHERE form = ? GROUP BY msg", func(r *sqlx.Rows) error {
		if err := r.Scan(&msg, &y); err != nil {
			return err
		}
		a.effects[msg] += y
		return nil
	}, f.String()); err != nil {
		return nil, err
	}
	if err := q("SELECT msg, kind, COUNT(DISTINCT rec) FROM "+outc+" WHERE form = ? GROUP BY msg, kind", func(r *sqlx.Rows) error {
		if err := r.Scan(&msg, &kind, &n); err != nil {
			return err
		}
		if a.outcomes[msg] == nil {
			a.outcomes[msg] = map[string]int{}
		}
		a.outcomes[msg][kind] += n
		return nil
	}, f.String()); err != nil {
		return nil, err
	}
	return a, nil
}

// auditForm checks every message of one form; it returns the counts and
// one violation line per kind of violation found, with examples.
func auditForm(f soakVariant, a *auditData) (formReport, []string) {
	r := formReport{Form: f.String(), Published: len(a.published)}
	found := map[string][]string{}
	bad := func(what, msg string) { found[what] = append(found[what], msg) }
	msgs := map[string]bool{}
	for m := range a.published {
		msgs[m] = true
	}
	for m, rs := range a.rows {
		msgs[m] = true
		r.Rows += len(rs)
	}
	for m := range msgs {
		rs := a.rows[m]
		ok, effects := a.okRuns[m], a.effects[m]
		r.Runs += ok + a.failRuns[m]
		r.FailedRuns += a.failRuns[m]
		finishing := a.outcomes[m]["succeeded"] + a.outcomes[m]["dead"]
		processed := ok > 0
		if f.Form == sqlxbroker.RowLock {
			processed = effects > 0
		}
		// completed counts a finished row (deleted, or marked done) and
		// checks the ledger against it.
		completed := func(row string) {
			r.Completed++
			if a.outcomes[m]["dead"] > 0 {
				r.Other++
				bad("dead outcome recorded for a "+row+" row", m)
			}
			if finishing == 0 {
				r.Unrecorded++
			}
			r.ExtraRuns += max(0, ok-1)
		}
		if len(rs) == 0 {
			switch {
			case !f.Delete || !processed:
				r.Lost++
				bad("lost: published, no row (nor, where done rows are deleted, a successful run)", m)
			default: // completed and deleted
				if finishing > 1 || effects > 1 {
					r.CompletedTwice++
					bad("completed twice", m)
				}
				completed("deleted")
			}
			continue
		}
		if !a.published[m] {
			r.Other++
			bad("row without a committed publish", m)
		}
		if len(rs) > 1 {
			r.Other++
			bad("more than one row for a message", m)
		}
		row := rs[0]
		if finishing > 1 || effects > 1 {
			r.CompletedTwice++
			bad("completed twice", m)
		}
		switch {
		case row.done && row.dead:
			r.Other++
			bad("row both done and dead", m)
		case row.done:
			if !processed {
				r.Lost++
				bad("lost: done without a successful run recorded", m)
			}
			completed("done")
		case row.dead:
			r.Dead++
			if a.outcomes[m]["succeeded"] > 0 {
				r.Other++
				bad("success recorded for a dead row", m)
			}
			if effects > 0 {
				r.Other++
				bad("handler writes committed for a dead row", m)
			}
			if finishing == 0 {
				r.Unrecorded++
			}
			r.ExtraRuns += ok
		default:
			r.Pending++
			bad("pending after the drain", m)
			if effects > 0 {
				r.Other++
				bad("handler writes committed for an unfinished row", m)
			}
			if finishing > 0 {
				r.Other++
				bad("outcome recorded for an unfinished row", m)
			}
		}
	}
	var out []string
	for what, ms := range found {
		sort.Strings(ms)
		ex := ms[:min(3, len(ms))]
		out = append(out, fmt.Sprintf("%s: %d message(s) %s, e.g. %s", f, len(ms), what, strings.Join(ex, ", ")))
	}
	sort.Strings(out)
	return r, out
}

// auditSoak audits every form into rep.
func auditSoak(ctx context.Context, db *sqlx.DB, d core.Dialect, c soakConfig, forms []soakVariant, rep *soakReport) error {
	rep.Total = formReport{Form: "total"}
	for _, f := range forms {
		a, err := loadAudit(ctx, db, d, c, f)
		if err != nil {
			return err
		}
		fr, v := auditForm(f, a)
		rep.Forms = append(rep.Forms, fr)
		rep.Total.add(fr)
		rep.Violations = append(rep.Violations, v...)
	}
	return nil
}

// print writes the readable report.
func (r *soakReport) print(w io.Writer) {
	fmt.Fprintf(w, "\nsoak: %s (%s), %d workers x concurrency %d per form\n", r.Server, r.Driver, r.Workers, r.Concurrency)
	fmt.Fprintf(w, "phases: faults %s, calm %s, drain %s; took %s in all\n", r.Duration, r.Calm, r.Drain, r.Took)
	f := r.Faults
	fmt.Fprintf(w, "faults: %d worker kills (SIGKILL), %d session terminations (%d sessions), %d server restarts",
		f.Kills, f.SessionEvents, f.SessionsKilled, f.Restarts)
	if f.RestartTook != "" {
		fmt.Fprintf(w, " (took %s)", f.RestartTook)
	}
	fmt.Fprintf(w, ", %d network stalls, %d network cuts (%d connections)\n", f.NetStalls, f.NetCuts, f.ConnsCut)
	fmt.Fprintf(w, "\n%-12s %9s %9s %6s %7s %6s %5s %6s %7s %7s %6s %10s\n", "form", "published", "completed", "dead",
		"pending", "twice", "lost", "other", "runs", "failed", "extra", "unrecorded")
	for _, fr := range append(append([]formReport{}, r.Forms...), r.Total) {
		fmt.Fprintf(w, "%-12s %9d %9d %6d %7d %6d %5d %6d %7d %7d %6d %10d\n", fr.Form, fr.Published, fr.Completed, fr.Dead,
			fr.Pending, fr.CompletedTwice, fr.Lost, fr.Other, fr.Runs, fr.FailedRuns, fr.ExtraRuns, fr.Unrecorded)
	}
	fmt.Fprintln(w, `
pending, twice (completed twice), lost and other must be 0. extra: handler
runs that returned success beyond one per finished row, allowed: a worker
killed (or its session terminated) after the handler returned and before the
completion committed; the row came back (lease: when the lease ran out;
advisory: when the session's end dropped the key; row lock: at once, the
run's writes through Delivery.Tx rolled back). unrecorded: finishing
outcomes whose ledger row a killed worker never wrote.`)
	if len(r.Violations) == 0 {
		fmt.Fprintln(w, "\nviolations: none")
	} else {
		fmt.Fprintf(w, "\nviolations (%d):\n", len(r.Violations))
		for _, v := range r.Violations {
			fmt.Fprintf(w, "  - %s\n", v)
		}
	}
	fmt.Fprintf(w, "worker logs: %s\n", r.LogDir)
}
