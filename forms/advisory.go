package forms

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strings"
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

// BatchesClaims: one candidate read and one take serve a batch
// (core.Batching).
func (f *advisory) BatchesClaims() bool { return true }

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
	// The rows of this form's own deliveries are still claimable (their
	// keys are what hold them) and come first: look past them too.
	f.mu.Lock()
	limit := max*candidates + len(f.held)
	f.mu.Unlock()
	page := fmt.Sprintf("SELECT %s FROM %s %s WHERE %s%%s ORDER BY %s LIMIT %d", cols, p.QTable, p.Alias, where, p.OrderBy(p.Alias), limit)
	var out []core.Claim
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
		// Lock the keys of as many candidates as are wanted, each on its
		// own connection, in waves of tries made at once; then take their
		// rows together.
		var locked []*advisoryClaim
		for i := 0; i < len(cands) && err == nil && ctx.Err() == nil; {
			var wave []*advisoryClaim
			for ; i < len(cands) && len(out)+len(locked)+len(wave) < max; i++ {
				r := &cands[i]
				key := p.Key.Render(r.get)
				if tried[key] || !f.hold(key) {
					continue
				}
				tried[key] = true
				wave = append(wave, &advisoryClaim{f: f, key: key, id: r.vals[0]})
			}
			if len(wave) == 0 {
				break
			}
			var got []*advisoryClaim
			got, err = f.tryLocks(ctx, wave)
			locked = append(locked, got...)
		}
		taken, terr := f.takeAll(ctx, locked)
		out = append(out, taken...)
		if err = errors.Join(err, terr); err != nil {
			return out, err
		}
		if len(cands) < limit {
			break
		}
		after = cands[len(cands)-1].vals[1]
	}
	return out, nil
}

// takeAll takes the rows of claims whose keys are locked: it counts each
// row's attempt while the row is still claimable and reads it, and returns
// the claims whose rows it took. The keys of the rest are released. A plain
// table takes every row in one statement on any connection (the keys stay
// locked on their own); a FIFO table takes each row under the dialect's
// group guard on its key's connection.
func (f *advisory) takeAll(ctx context.Context, claims []*advisoryClaim) ([]core.Claim, error) {
	if len(claims) == 0 {
		return nil, nil
	}
	var out []core.Claim
	var errs error
	keep := func(c *advisoryClaim, r *row, err error) {
		if err == nil && r != nil {
			var attempt int
			if attempt, err = f.attemptOf(r); err == nil {
				c.d = f.delivery(r, counted(attempt), c.key)
				out = append(out, c)
				return
			}
		}
		if err != nil {
			errs = errors.Join(errs, fmt.Errorf("sqlxbroker: take advisory row %v: %w", c.id, err))
		}
		c.release(ctx)
	}
	if f.plan.QGroup != "" && f.plan.Caps.GroupGuard != nil {
		for _, c := range claims {
			r, err := f.count(ctx, c.conn, c.id)
			keep(c, r, err)
		}
		return out, errs
	}
	rows, err := f.countAll(ctx, claims)
	if err != nil {
		for _, c := range claims {
			c.release(ctx)
		}
		return nil, fmt.Errorf("sqlxbroker: take advisory rows on %s: %w", f.plan.Table.Name, err)
	}
	byID := make(map[string]*row, len(rows))
	for i := range rows {
		byID[idKey(rows[i].get(f.plan.Table.IDColumn()))] = &rows[i]
	}
	for _, c := range claims {
		keep(c, byID[idKey(c.id)], nil)
	}
	return out, errs
}

// countAll adds 1 to the attempt of each row of claims that is still
// claimable and returns those rows as they now are: one UPDATE ..
// RETURNING, or where the dialect has none, an UPDATE per row and one read
// of the rows it changed, in one transaction.
func (f *advisory) countAll(ctx context.Context, claims []*advisoryClaim) ([]row, error) {
	p := f.plan
	ids := make([]any, len(claims))
	for i, c := range claims {
		ids[i] = c.id
	}
	where, args := p.Ready(p.QTable, core.Now())
	set := "UPDATE " + p.QTable + " SET " + p.QAttempt + " = " + p.NextAttempt("") + " WHERE "
	if p.Dialect.Features().UpdateReturning {
		in := p.QTable + "." + p.QID + " IN (?" + strings.Repeat(", ?", len(ids)-1) + ")"
		rs, err := f.db.QueryxContext(ctx, p.Rebind(set+in+" AND "+where+" RETURNING *"), append(ids, args...)...)
		if err != nil {
			return nil, err
		}
		return readRows(rs)
	}
	// Every row of a batch is nearly always still claimable (their keys
	// are held): one UPDATE of them all, kept when it changed them all;
	// otherwise an UPDATE per row tells which.
	changed, tx, err := f.allOrEach(ctx, len(ids),
		p.Rebind(set+p.QTable+"."+p.QID+" IN (?"+strings.Repeat(", ?", len(ids)-1)+") AND "+where), append(append([]any{}, ids...), args...),
		p.Rebind(set+p.QTable+"."+p.QID+" = ? AND "+where), func(i int) []any { return append([]any{ids[i]}, args...) })
	if err != nil {
		return nil, err
	}
	defer tx.Rollback() //nolint:errcheck // no-op after Commit
	var hit []any
	for i, ok := range changed {
		if ok {
			hit = append(hit, ids[i])
		}
	}
	var rows []row
	if len(hit) > 0 {
		rs, err := tx.QueryxContext(ctx, p.Rebind("SELECT * FROM "+p.QTable+" WHERE "+p.QID+" IN (?"+strings.Repeat(", ?", len(hit)-1)+")"), hit...)
		if err != nil {
			return nil, err
		}
		if rows, err = readRows(rs); err != nil {
			return nil, err
		}
	}
	return rows, tx.Commit()
}

// tryLocks tries the key of each claim at once, each on a connection of its
// own, and returns the claims whose keys it locked (their connections now
// hold them); the keys of the others are dropped and their connections go
// back to the pool, or are discarded when a try failed.
func (f *advisory) tryLocks(ctx context.Context, wave []*advisoryClaim) ([]*advisoryClaim, error) {
	locker := f.plan.Caps.AdvisoryLocker
	errs := make([]error, len(wave))
	ok := make([]bool, len(wave))
	var wg sync.WaitGroup
	for i, c := range wave {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := f.db.Connx(ctx)
			if err != nil {
				errs[i] = fmt.Errorf("sqlxbroker: advisory connection: %w", err)
				return
			}
			if ok[i], err = locker.TryAdvisoryLock(ctx, conn, c.key); err != nil {
				errs[i] = fmt.Errorf("sqlxbroker: try advisory lock %q: %w", c.key, err)
				_ = conn.Raw(func(any) error { return driver.ErrBadConn }) // its session state is unknown
			}
			if !ok[i] {
				conn.Close()
				return
			}
			c.conn = conn
		}()
	}
	wg.Wait()
	var out []*advisoryClaim
	for i, c := range wave {
		if ok[i] {
			out = append(out, c)
		} else {
			f.drop(c.key)
		}
	}
	return out, errors.Join(errs...)
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

// count adds 1 to the row's attempt while it is still claimable and reads
// it back; nil when it is not claimable any more. For a FIFO table the
// dialect's group guard is held around the check in a short transaction.
func (f *advisory) count(ctx context.Context, conn *sqlx.Conn, id any) (*row, error) {
	p := f.plan
	where, args := p.Ready(p.QTable, core.Now())
	upd := "UPDATE " + p.QTable + " SET " + p.QAttempt + " = " + p.NextAttempt("") + " WHERE " + p.QTable + "." + p.QID + " = ? AND " + where
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
	conn *sqlx.Conn // holds the key's lock
	key  string
	id   any
	d    *core.Delivery
}

// release unlocks the key of a claim whose row was not taken and lets the
// connection go (closed for good when the unlock failed: the session may
// still hold the key).
func (c *advisoryClaim) release(ctx context.Context) {
	if err := c.f.plan.Caps.AdvisoryLocker.AdvisoryUnlock(context.WithoutCancel(ctx), c.conn, c.key); err != nil {
		_ = c.conn.Raw(func(any) error { return driver.ErrBadConn })
	}
	c.conn.Close()
	c.f.drop(c.key)
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
