package bench

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/core"
)

// floorChain is the most deliveries a loop of RowLockFloor chains in one
// transaction when statements are prepared, as the row-lock form does.
const floorChain = 64

// RowLockFloor drains a table of c.Rows rows with the row-lock form's own
// statements and nothing else: conns connections each claim one row with
// the form's claim (the ready condition, from a cursor shared by the loops,
// ORDER BY, LIMIT 1, the dialect's SKIP LOCKED), delete it and commit,
// chained and prepared where the dialect allows, in a tight loop with no
// engine, handler or broker in between. The table is the broker's own,
// created by the dialect's CreateTable and filled by Publish.
//
// Its rate is the most the database gives the form's statements: the raw
// commit rate bounds the form from above only as far as a delivery costs
// the database what one raw commit does, and the floor says how far that
// is. A drain's rate divided by the floor's is what the broker keeps of it.
// It also returns the process's CPU time over the drain, the fill left out.
func RowLockFloor(ctx context.Context, c Config, db *sqlx.DB, conns int) (float64, time.Duration, error) {
	if err := c.defaults(); err != nil {
		return 0, 0, err
	}
	if conns < 1 {
		return 0, 0, errors.New("bench: row-lock floor: conns must be at least 1")
	}
	b := sqlxbroker.OpenDialect(db, c.Dialect)
	t := Table(c.Table+"_floor", sqlxbroker.RowLock)
	if err := recreate(ctx, b, t); err != nil {
		return 0, 0, err
	}
	defer drop(b, t.Name)
	plain := c // the floor's table is plain: no adapter's publish context
	plain.Adapter = nil
	if err := fill(ctx, &plain, b, t); err != nil {
		return 0, 0, fmt.Errorf("bench: row-lock floor: fill: %w", err)
	}
	p, err := sqlxbroker.NewPlan(c.Dialect, t)
	if err != nil {
		return 0, 0, err
	}
	pool := core.NewPool(db, c.Dialect)
	defer pool.Close()
	rl, err := p.Caps.RowLocker.RowLock(ctx, pool)
	if err != nil {
		return 0, 0, fmt.Errorf("bench: row-lock floor: %w", err)
	}
	chain := rl.ChainCommit
	where, _ := p.Ready(p.Alias, time.Now())
	claim := p.Rebind("SELECT * FROM " + p.QTable + " " + p.Alias + " WHERE " + where + " AND " + p.Alias + "." + p.QID +
		" > ? ORDER BY " + p.OrderBy(p.Alias) + " LIMIT 1 " + rl.SkipLocked)
	del := p.Rebind("DELETE FROM " + p.QTable + " WHERE " + p.QID + " = ?")
	var stmts [2]*sqlx.Stmt
	if rl.Prepare {
		for i, q := range []string{claim, del} {
			if stmts[i], err = db.PreparexContext(ctx, q); err != nil {
				return 0, 0, fmt.Errorf("bench: row-lock floor: prepare: %w", err)
			}
			defer stmts[i].Close()
		}
	}

	var cursor, total atomic.Int64 // cursor: the highest id claimed
	elapsed, cpu, err := onConns(ctx, db, conns, func(conn *sqlx.Conn) error {
		var tx *sqlx.Tx
		defer func() {
			if tx != nil {
				_ = tx.Rollback()
			}
		}()
		chained := 0
		for {
			var err error
			if tx == nil {
				if tx, err = conn.BeginTxx(ctx, nil); err != nil {
					return err
				}
				chained = 0
			}
			var id any
			for _, from := range []int64{cursor.Load(), 0} {
				if id, err = floorClaim(ctx, tx, stmts[0], claim, p, from); err != nil || id != nil || from == 0 {
					break
				}
			}
			if err != nil {
				return err
			}
			if id == nil {
				return nil // drained
			}
			if n, ok := asInt64(id); ok {
				for c := cursor.Load(); n > c && !cursor.CompareAndSwap(c, n); c = cursor.Load() {
				}
			}
			if stmts[1] != nil {
				_, err = tx.StmtxContext(ctx, stmts[1]).ExecContext(ctx, id)
			} else {
				_, err = tx.ExecContext(ctx, del, id)
			}
			if err != nil {
				return err
			}
			if chained++; chain != "" && (stmts[1] == nil || chained < floorChain) {
				_, err = tx.ExecContext(ctx, chain)
			} else {
				err, tx = tx.Commit(), nil
			}
			if err != nil {
				return err
			}
			total.Add(1)
		}
	})
	if err != nil {
		return 0, 0, fmt.Errorf("bench: row-lock floor: %w", err)
	}
	if n := total.Load(); n != int64(c.Rows) {
		return 0, 0, fmt.Errorf("bench: row-lock floor: %d of %d rows deleted", n, c.Rows)
	}
	return float64(c.Rows) / elapsed.Seconds(), cpu, nil
}

// floorClaim runs the floor's claim from id from in tx and returns the id
// of the row it locked, nil for none.
func floorClaim(ctx context.Context, tx *sqlx.Tx, st *sqlx.Stmt, q string, p *core.Plan, from int64) (any, error) {
	_, args := p.Ready(p.Alias, core.Now())
	args = append(args, from)
	var rows *sqlx.Rows
	var err error
	if st != nil {
		rows, err = tx.StmtxContext(ctx, st).QueryxContext(ctx, args...)
	} else {
		rows, err = tx.QueryxContext(ctx, q, args...)
	}
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		return nil, err
	}
	if !rows.Next() {
		return nil, rows.Err()
	}
	vals, err := rows.SliceScan()
	if err != nil {
		return nil, err
	}
	for i, c := range cols {
		if c == p.ID {
			return vals[i], rows.Close()
		}
	}
	return nil, fmt.Errorf("no %s column in the claimed row", p.ID)
}

// asInt64 reads an id as drivers return it: an integer, or its digits.
func asInt64(v any) (int64, bool) {
	switch v := v.(type) {
	case int64:
		return v, true
	case []byte:
		n, err := strconv.ParseInt(string(v), 10, 64)
		return n, err == nil
	case string:
		n, err := strconv.ParseInt(v, 10, 64)
		return n, err == nil
	}
	return 0, false
}
