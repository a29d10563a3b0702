// Package leaseonly is the worked example of docs/implementing-a-dialect.md:
// a dialect written from the documentation alone, for SQLite under a new
// driver name ("example-sqlite"), offering the lease form only. Its test
// runs the conformance suite with conformance.Run, and
// cmd/leaseonly-conformance is its ten-line command (conformance.Main).
package leaseonly

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/glebarez/go-sqlite"
	"github.com/jmoiron/sqlx"
	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/core"
)

// Dialect offers the lease form only. The suite asks it what it can do: it
// runs every lease scenario and checks that the row-lock and advisory forms
// fail with ErrFormUnavailable.
type Dialect struct{}

func (Dialect) Name() string               { return "example lease-only SQLite" }
func (Dialect) QuoteIdent(s string) string { return `"` + s + `"` }
func (Dialect) BindType() int              { return sqlx.QUESTION }
func (Dialect) EncodeTime(t time.Time) any { return t.UTC().Format("2006-01-02 15:04:05.000000") }
func (Dialect) Features() core.Features {
	return core.Features{DeleteReturning: true, UpdateReturning: true}
}

// ClaimLeases is the one capability: an UPDATE .. RETURNING of the rows the
// form's condition selects.
func (Dialect) ClaimLeases(ctx context.Context, on sqlx.ExtContext, p *core.LeaseClaimParams) (*sqlx.Rows, error) {
	pl := p.Plan
	q := fmt.Sprintf(`UPDATE %[1]s SET %[2]s = ?, %[3]s = %[9]s
WHERE %[4]s IN (SELECT %[5]s.%[4]s FROM %[1]s %[5]s WHERE %[6]s ORDER BY %[7]s LIMIT %[8]d) RETURNING *`,
		pl.QTable, pl.QLockedUntil, pl.QAttempt, pl.QID, pl.Alias, p.Where, pl.OrderBy(pl.Alias), p.Limit, pl.NextAttempt(""))
	return on.QueryxContext(ctx, q, append([]any{p.Deadline}, p.Args...)...)
}

// FenceLeases matches a batch of leased rows the portable way.
func (Dialect) FenceLeases(p *core.Plan, ids, tokens []any) (string, []any) {
	return core.FencePairs(p, ids, tokens)
}

// SkipDuplicates is the optional duplicate skipping of
// PublishParams.SkipDuplicates: SQLite's upsert clause that does nothing.
func (d Dialect) SkipDuplicates(_ context.Context, p *core.SkipDuplicatesParams) (*core.InsertSQL, error) {
	return &core.InsertSQL{Suffix: "ON CONFLICT (" + d.QuoteIdent(p.Column) + ") DO NOTHING"}, nil
}

// CreateTable lets the suite make its tables.
func (d Dialect) CreateTable(p *core.DDLParams) ([]string, error) {
	cols := []string{`"id" INTEGER PRIMARY KEY`, `"attempt" INTEGER NOT NULL DEFAULT 1`}
	for _, c := range []string{p.Plan.LockedUntil, p.Plan.ReadyAt, p.Plan.DeadAt, p.Plan.DoneAt, p.Plan.Group, p.Plan.LastError, p.Plan.Metadata} {
		if c != "" {
			cols = append(cols, d.QuoteIdent(c)+" TEXT")
		}
	}
	for _, c := range p.Payload {
		if c[0] != p.Plan.Group {
			cols = append(cols, d.QuoteIdent(c[0])+" TEXT")
		}
	}
	stmts := []string{"CREATE TABLE " + p.Plan.QTable + " (" + strings.Join(cols, ", ") + ")"}
	// Indexes for the operations' counts (Broker.Counts): dead and done
	// rows by their columns.
	name := strings.ReplaceAll(p.Plan.Table, ".", "_")
	for _, c := range [][2]string{{"dead", p.Plan.QDeadAt}, {"done", p.Plan.QDoneAt}} {
		if c[1] != "" {
			stmts = append(stmts, "CREATE INDEX "+d.QuoteIdent(name+"_"+c[0])+" ON "+p.Plan.QTable+" ("+c[1]+") WHERE "+c[1]+" IS NOT NULL")
		}
	}
	return stmts, nil
}

// DriverName is the database/sql driver this package registers (SQLite's,
// under a name of its own) and the dialect for it.
const DriverName = "example-sqlite"

func init() {
	sql.Register(DriverName, &sqlite.Driver{})
	sqlxbroker.Register(DriverName, Dialect{})
}
