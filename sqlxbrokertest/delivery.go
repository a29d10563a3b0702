package sqlxbrokertest

import (
	"context"
	"database/sql/driver"
	"fmt"
	"strings"

	"github.com/jmoiron/sqlx"
	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/core"
)

// DeliveryParams describe a delivery NewDelivery builds.
type DeliveryParams struct {
	// Row is the row's content: a struct whose fields carry `db` tags (or
	// a pointer to one) or a map[string]any, read as Publish reads a
	// message (sqlxbroker.MessageColumns). Values become what a driver
	// returns (int64, float64, bool, []byte, string, time.Time or nil; a
	// driver.Valuer's Value), so Scan converts them as it converts a
	// claimed row's. Nil: a row of the ID and attempt columns only.
	Row any
	// Table names the ID and attempt columns (defaults "id" and
	// "attempt"); the rest of the description is not used.
	Table sqlxbroker.Table
	// ID is the delivery's ID; nil: the Row's ID column when it is not
	// zero, else int64(1). The row's ID column holds it.
	ID any
	// Attempt is the delivery's attempt; 0: the Row's attempt column when
	// it gives one, else 1. The row's attempt column holds it.
	Attempt int
	// Key is the advisory key the delivery reports (Delivery.Key).
	Key string
	// Tx is what Delivery.Tx returns, as the row-lock form returns its
	// claim transaction; nil: sqlxbroker.ErrNoTx, as in the lease and
	// advisory forms. The caller commits or rolls it back.
	Tx *sqlx.Tx
}

// NewDelivery returns a delivery built from p, to call a handler with
// directly. A Row that Publish would refuse, a negative Attempt, or a
// value no driver returns fails the test (Fatalf) naming the problem.
func NewDelivery(t TB, p DeliveryParams) *sqlxbroker.Delivery {
	t.Helper()
	c, err := newClaim(p)
	if err != nil {
		t.Fatalf("sqlxbrokertest: NewDelivery: %v", err)
	}
	return sqlxbroker.NewDelivery(c)
}

func newClaim(p DeliveryParams) (*claim, error) {
	if p.Attempt < 0 {
		return nil, fmt.Errorf("Attempt %d is negative (1 is the first delivery)", p.Attempt)
	}
	idCol, attCol := p.Table.IDColumn(), p.Table.AttemptColumn()
	var cols []string
	var vals []any
	if p.Row != nil {
		var err error
		if cols, vals, err = sqlxbroker.MessageColumns(p.Table, p.Row); err != nil {
			return nil, fmt.Errorf("Row: %w", err)
		}
	}
	row := core.Row{ID: p.ID, Attempt: p.Attempt, Key: p.Key}
	for i, c := range cols {
		v, err := driverValue(vals[i])
		if err != nil {
			return nil, fmt.Errorf("Row: column %q: %w", c, err)
		}
		switch {
		case strings.EqualFold(c, idCol):
			if row.ID == nil {
				row.ID = v
			}
			continue // set below
		case strings.EqualFold(c, attCol):
			if row.Attempt == 0 {
				var n int64
				if n, err = toInt64(v); err != nil {
					return nil, fmt.Errorf("Row: attempt column %q: %w", c, err)
				}
				row.Attempt = int(n)
			}
			continue
		}
		row.Columns = append(row.Columns, c)
		row.Values = append(row.Values, v)
	}
	if row.ID == nil {
		row.ID = int64(1)
	} else {
		id, err := driverValue(row.ID)
		if err != nil {
			return nil, fmt.Errorf("ID: %w", err)
		}
		row.ID = id
	}
	if row.Attempt == 0 {
		row.Attempt = 1
	}
	row.Columns = append([]string{idCol, attCol}, row.Columns...)
	row.Values = append([]any{row.ID, int64(row.Attempt)}, row.Values...)
	return &claim{row: row, tx: p.Tx}, nil
}

// driverValue turns v into a value a driver returns, as database/sql
// converts an argument.
func driverValue(v any) (any, error) {
	return driver.DefaultParameterConverter.ConvertValue(v)
}

func toInt64(v any) (int64, error) {
	switch n := v.(type) {
	case int64:
		return n, nil
	case float64:
		if n == float64(int64(n)) {
			return int64(n), nil
		}
	}
	return 0, fmt.Errorf("%v (%T) is not a whole number", v, v)
}

// claim is a core.Claim made by hand: it holds nothing in a database.
type claim struct {
	row core.Row
	tx  *sqlx.Tx
}

func (c *claim) Row() *core.Row { return &c.row }

func (c *claim) Tx() (*sqlx.Tx, error) {
	if c.tx == nil {
		return nil, sqlxbroker.ErrNoTx
	}
	return c.tx, nil
}

func (c *claim) OnLost(func()) {}

func (c *claim) Complete(_ context.Context, _ core.Outcome, done func(error)) { done(nil) }

// BeginTx begins a transaction on db for a test, to pass as
// DeliveryParams.Tx or to publish in: it is rolled back when the test ends
// unless the test committed or rolled it back before. An error fails the
// test.
func BeginTx(t TB, db *sqlx.DB) *sqlx.Tx {
	t.Helper()
	if db == nil {
		t.Fatalf("sqlxbrokertest: BeginTx: nil db")
	}
	tx, err := db.Beginx()
	if err != nil {
		t.Fatalf("sqlxbrokertest: BeginTx: %v", err)
	}
	t.Cleanup(func() { _ = tx.Rollback() })
	return tx
}
