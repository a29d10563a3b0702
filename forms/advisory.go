package forms

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"sync"

	"github.com/jmoiron/sqlx"
	"github.com/sqlxbroker/sqlxbroker/core"
)

// advisory: ready rows are read with their keys; each key's advisory lock is
// tried without waiting on the delivery's own connection; the row is taken
// (attempt counted) while it is still claimable; the handler runs with the
// key locked; completion runs on the same connection, then the key is
// released. No transaction stays open, but the connection stays with the
// delivery.
type advisory struct {
	base
	mu      sync.Mutex
	held    map[string]bool // keys this form holds
	release func() error
}

func newAdvisory(b base) *advisory { return &advisory{base: b, held: map[string]bool{}} }

func (f *advisory) Form() core.Form { return core.Advisory }

func (f *advisory) Start(ctx context.Context) error {
	if err := f.start(ctx, core.Advisory); err != nil {
		return err
	}
	if a := f.plan.Caps.AdvisoryAttacher; a != nil {
		rel, err := a.AttachAdvisory(ctx, f.db)
		if err != nil {
			return err
		}
		f.release = rel
	}
	return nil
}

func (f *advisory) Close() error {
	if f.release != nil {
		return f.release()
	}
	return nil
}

// candidates is how many rows per wanted claim are read: rows whose keys are
// held elsewhere are skipped, so a claim looks further than it needs.
const candidates = 4

// pages is how many pages of candidates one claim reads at most: the first
// rows of a busy table mostly have keys in work elsewhere.
const pages = 8

func (f *advisory) Claim(ctx context.Context, max int) ([]core.Claim, error) {
	p := f.plan
	where, args := p.Ready(p.Alias, core.Now())
	cols := p.Alias + "." + p.QID + ", " + p.Alias + "." + p.QOrder
	for _, k := range p.QKeyCols {
		cols += ", " + p.Alias + "." + k
	}
	limit := max * candidates
	page := fmt.Sprintf("SELECT %s FROM %s %s WHERE %s%%s ORDER BY %s LIMIT %d", cols, p.QTable, p.Alias, where, p.OrderBy(p.Alias), limit)
	var out []core.Claim
	var conn *sqlx.Conn // a spare connection, reused until a key is locked on it
	defer func() {
		if conn != nil {
			conn.Close()
		}
	}()
	tried := map[string]bool{}
	var after any // the order value the next page starts after
	for n := 0; n < pages && len(out) < max && ctx.Err() == nil; n++ {
		q, a := fmt.Sprintf(page, ""), args
		if after != nil {
			q, a = fmt.Sprintf(page, " AND "+p.Alias+"."+p.QOrder+" > ?"), append(append([]any{}, args...), after)
		}
		rs, err := f.db.QueryxContext(ctx, p.Rebind(q), a...)
		if err != nil {
			return out, fmt.Errorf("sqlxbroker: advisory candidates on %s: %w", p.Table.Name, err)
		}
		cands, err := readRows(rs)
		if err != nil {
			return out, fmt.Errorf("sqlxbroker: advisory candidates on %s: %w", p.Table.Name, err)
		}
		for i := range cands {
			if len(out) == max || ctx.Err() != nil {
				break
			}
			r := &cands[i]
			key := p.Key.Render(r.get)
			if tried[key] || !f.hold(key) {
				continue
			}
			tried[key] = true
			if conn == nil {
				if conn, err = f.db.Connx(ctx); err != nil {
					f.drop(key)
					return out, fmt.Errorf("sqlxbroker: advisory connection: %w", err)
				}
			}
			c, err := f.take(ctx, conn, key, r.vals[0])
			if err != nil {
				f.drop(key)
				conn.Close() // its session state is unknown
				conn = nil
				return out, err
			}
			if c == nil {
				f.drop(key)
				continue
			}
			out = append(out, c)
			conn = nil // it belongs to the delivery now
		}
		if len(cands) < limit {
			break
		}
		after = cands[len(cands)-1].vals[1]
	}
	return out, nil
}

// hold marks key as held by this form; false when it already is.
func (f *advisory) hold(key string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.held[key] {
		return false
	}
	f.held[key] = true
	return true
}

func (f *advisory) drop(key string) {
	f.mu.Lock()
	delete(f.held, key)
	f.mu.Unlock()
}

// take locks key on conn and takes row id if it is still claimable: nil, nil
// when the key is held elsewhere or the row is gone.
func (f *advisory) take(ctx context.Context, conn *sqlx.Conn, key string, id any) (*advisoryClaim, error) {
	p := f.plan
	locker := p.Caps.AdvisoryLocker
	ok, err := locker.TryAdvisoryLock(ctx, conn, key)
	if err != nil {
		return nil, fmt.Errorf("sqlxbroker: try advisory lock %q: %w", key, err)
	}
	if !ok {
		return nil, nil
	}
	unlock := func(err error) (*advisoryClaim, error) {
		return nil, errors.Join(err, locker.AdvisoryUnlock(context.WithoutCancel(ctx), conn, key))
	}
	r, err := f.count(ctx, conn, id)
	if err != nil {
		return unlock(fmt.Errorf("sqlxbroker: take advisory row %v: %w", id, err))
	}
	if r == nil {
		return unlock(nil)
	}
	attempt, err := f.attemptOf(r)
	if err != nil {
		return unlock(err)
	}
	return &advisoryClaim{f: f, conn: conn, key: key, d: f.delivery(r, attempt-1, key)}, nil
}

// count adds 1 to the row's attempt while it is still claimable and reads
// it back; nil when it is not claimable any more. For a FIFO table the
// dialect's group guard is held around the check in a short transaction.
func (f *advisory) count(ctx context.Context, conn *sqlx.Conn, id any) (*row, error) {
	p := f.plan
	where, args := p.Ready(p.QTable, core.Now())
	upd := "UPDATE " + p.QTable + " SET " + p.QAttempt + " = " + p.QAttempt + " + 1 WHERE " + p.QTable + "." + p.QID + " = ? AND " + where
	args = append([]any{id}, args...)
	var q interface {
		sqlx.ExecerContext
		sqlx.QueryerContext
	} = conn
	var tx *sqlx.Tx
	if p.QGroup != "" && p.Caps.GroupGuard != nil {
		var err error
		if tx, err = conn.BeginTxx(ctx, f.txOptions()); err != nil {
			return nil, err
		}
		defer tx.Rollback() //nolint:errcheck // no-op after Commit
		q = tx
		g, err := f.groupOf(ctx, tx, id)
		if err != nil || g == nil {
			return nil, err
		}
		ok, err := p.Caps.GroupGuard.GuardGroup(ctx, tx, &core.GroupGuardParams{Plan: p, Group: g})
		if err != nil || !ok {
			return nil, err
		}
	}
	var rows []row
	if p.Dialect.Features().UpdateReturning {
		rs, err := q.QueryxContext(ctx, p.Rebind(upd+" RETURNING *"), args...)
		if err != nil {
			return nil, err
		}
		if rows, err = readRows(rs); err != nil {
			return nil, err
		}
	} else {
		res, err := q.ExecContext(ctx, p.Rebind(upd), args...)
		if err != nil {
			return nil, err
		}
		if n, err := res.RowsAffected(); err != nil || n == 0 {
			return nil, err
		}
		rs, err := q.QueryxContext(ctx, p.Rebind("SELECT * FROM "+p.QTable+" WHERE "+p.QID+" = ?"), id)
		if err != nil {
			return nil, err
		}
		if rows, err = readRows(rs); err != nil {
			return nil, err
		}
	}
	if len(rows) == 0 {
		return nil, nil
	}
	if tx != nil {
		if err := tx.Commit(); err != nil {
			return nil, err
		}
	}
	return &rows[0], nil
}

func (f *advisory) groupOf(ctx context.Context, q sqlx.QueryerContext, id any) (any, error) {
	p := f.plan
	var g any
	err := q.QueryRowxContext(ctx, p.Rebind("SELECT "+p.QGroup+" FROM "+p.QTable+" WHERE "+p.QID+" = ?"), id).Scan(&g)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil // completed by another claim since the candidates were read
	}
	if err != nil {
		return nil, err
	}
	if g == nil {
		return "", nil // no group: any non-nil value lets the take go on unguarded
	}
	return g, nil
}

type advisoryClaim struct {
	f    *advisory
	conn *sqlx.Conn
	key  string
	d    *core.Delivery
}

func (c *advisoryClaim) Delivery() *core.Delivery { return c.d }
func (c *advisoryClaim) Lost() <-chan struct{}    { return nil }

// Complete records o on the delivery's connection, then releases the key
// and the connection. When the connection has failed, its session is gone
// and the database has dropped the key with it: the row, attempt counted,
// is claimable again.
func (c *advisoryClaim) Complete(ctx context.Context, o core.Outcome) error {
	f := c.f
	var err error
	if q, args := f.completion(o, false, false, ""); q != "" {
		if _, e := c.conn.ExecContext(ctx, q, append(args, c.d.ID())...); e != nil {
			err = fmt.Errorf("sqlxbroker: advisory completion (%s): %w", o.Kind, e)
		}
	}
	if e := f.plan.Caps.AdvisoryLocker.AdvisoryUnlock(ctx, c.conn, c.key); e != nil {
		err = errors.Join(err, fmt.Errorf("sqlxbroker: advisory unlock %q: %w", c.key, e))
		// The key may still be held: close the session rather than return it to the pool.
		_ = c.conn.Raw(func(any) error { return driver.ErrBadConn })
	}
	c.conn.Close()
	f.drop(c.key)
	return err
}
