package bench

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/core"
)

// floorLoops is how many claims the lease and advisory floors have in
// flight: the engine claims for a batching form once half a batch of
// handlers is free, so about two claims of half a batch each are in work
// at once; the advisory form runs two claims at once as well.
const floorLoops = 2

// floorClaimSize is the rows one claim of the lease and advisory floors
// asks for: half the batch (c.BatchSize, else c.Concurrency), as the
// engine asks once half a batch of handlers is free, at least one.
func floorClaimSize(c Config) int {
	b := c.BatchSize
	if b == 0 || b > c.Concurrency {
		b = c.Concurrency
	}
	return max(1, (b+1)/2)
}

// floorTable recreates and fills the floor's table for form f: the
// broker's own (the dialect's CreateTable, filled by Publish), and returns
// its plan.
func floorTable(ctx context.Context, c Config, db *sqlx.DB, f sqlxbroker.Form) (*core.Plan, func(), error) {
	b := sqlxbroker.OpenDialect(db, c.Dialect)
	t := Table(c.Table+"_floor", f)
	p, err := sqlxbroker.NewPlan(c.Dialect, t)
	if err != nil {
		return nil, nil, err
	}
	if err := recreate(ctx, b, t); err != nil {
		return nil, nil, err
	}
	cleanup := func() { drop(b, t.Name) }
	if err := fill(ctx, &c, b, t); err != nil {
		cleanup()
		return nil, nil, fmt.Errorf("fill: %w", err)
	}
	return p, cleanup, nil
}

// LeaseFloor drains a table of c.Rows rows with the lease form's own
// statements and nothing else: floorLoops connections each claim
// floorClaimSize rows with the dialect's ClaimLeases (the ready condition,
// from a cursor shared by the loops as the form keeps one, on the pool
// where the dialect's claim is one statement), then delete them with the
// form's fenced completion (the dialect's FenceLeases, in a transaction,
// with RETURNING where the dialect has it, else checked by rows affected),
// in a tight loop with no engine, handler, renewal or broker in between
// (the dialect's Starter run first, as for a subscription).
// Rows in work at once are about c.Concurrency, as in a drain. It returns
// the rate, the connections used and the process's CPU time over the
// drain, the fill left out.
func LeaseFloor(ctx context.Context, c Config, db *sqlx.DB) (float64, int, time.Duration, error) {
	if err := c.defaults(); err != nil {
		return 0, 0, 0, err
	}
	p, cleanup, err := floorTable(ctx, c, db, sqlxbroker.Lease)
	if err != nil {
		return 0, 0, 0, fmt.Errorf("bench: lease floor: %w", err)
	}
	defer cleanup()
	// Started as a subscription starts, so the dialect claims with the
	// statement it gives a subscription on this table (PostgreSQL's claims
	// by address on a plain table).
	if s := p.Caps.Starter; s != nil {
		stop, err := s.Start(ctx, core.NewPool(db, c.Dialect), p)
		if err != nil {
			return 0, 0, 0, fmt.Errorf("bench: lease floor: %w", err)
		}
		if stop != nil {
			defer stop() //nolint:errcheck // nothing to do about it
		}
	}
	size := floorClaimSize(c)
	loops := min(floorLoops, c.Concurrency)
	feats := p.Dialect.Features()
	opts := claimTxOptions(ctx, db, feats.ClaimIsolation)
	var cursor atomic.Int64 // the highest id claimed
	var total atomic.Int64
	elapsed, cpu, err := onConns(ctx, db, loops, func(conn *sqlx.Conn) error {
		for {
			var ids []any
			var token any
			for _, from := range []int64{cursor.Load(), 0} {
				err := floorRetry(p, func() (err error) {
					ids, token, err = leaseFloorClaim(ctx, conn, opts, p, from, size)
					return err
				})
				if err != nil {
					return err
				}
				if len(ids) > 0 || from == 0 {
					break
				}
			}
			if len(ids) == 0 {
				return nil // drained
			}
			if n, ok := asInt64(ids[len(ids)-1]); ok {
				for c := cursor.Load(); n > c && !cursor.CompareAndSwap(c, n); c = cursor.Load() {
				}
			}
			if err := floorRetry(p, func() error { return leaseFloorComplete(ctx, conn, p, feats, ids, token) }); err != nil {
				return err
			}
			total.Add(int64(len(ids)))
		}
	})
	if err != nil {
		return 0, 0, 0, fmt.Errorf("bench: lease floor: %w", err)
	}
	if n := total.Load(); n != int64(c.Rows) {
		return 0, 0, 0, fmt.Errorf("bench: lease floor: %d of %d rows deleted", n, c.Rows)
	}
	return float64(c.Rows) / elapsed.Seconds(), loops, cpu, nil
}

// floorRetry runs do again, up to floorRetries more times, while it fails
// with a conflict (core.ConflictDetector: a deadlock, a lost certification
// on a cluster), as the forms run their statements: a transaction that
// lost rolled back whole, so running it again is what the form would do.
func floorRetry(p *core.Plan, do func() error) error {
	err := do()
	for i := 0; i < floorRetries && err != nil && p.Caps.ConflictDetector != nil && p.Caps.ConflictDetector.Conflict(err); i++ {
		err = do()
	}
	return err
}

// floorRetries is how many times floorRetry runs a statement again.
const floorRetries = 6

// leaseFloorClaim claims up to size rows after id from with the form's
// claim and returns their ids, in claim order, and the lease deadline
// they hold (encoded), the token the form fences its completion with.
func leaseFloorClaim(ctx context.Context, conn *sqlx.Conn, opts *sql.TxOptions, p *core.Plan, from int64, size int) ([]any, any, error) {
	now := core.Now()
	where, args := p.Ready(p.Alias, now)
	if from > 0 {
		cond, ca := p.From(p.Alias, []any{from}, true)
		where, args = where+" AND "+cond, append(args, ca...)
	}
	deadline := p.Time(now.Add(p.Lease))
	params := &core.LeaseClaimParams{Plan: p, Where: where, Args: args, Limit: size, Deadline: deadline}
	var q sqlx.ExtContext = connExt{conn}
	var tx *sqlx.Tx
	if !p.Dialect.Features().LeaseClaimStatement {
		var err error
		if tx, err = conn.BeginTxx(ctx, opts); err != nil {
			return nil, nil, err
		}
		defer tx.Rollback() //nolint:errcheck // no-op after Commit
		q = tx
	}
	rows, err := p.Caps.Leaser.ClaimLeases(ctx, q, params)
	if err != nil {
		return nil, nil, err
	}
	ids, err := idsOf(rows, p.ID)
	if err != nil {
		return nil, nil, err
	}
	if tx != nil {
		if err := tx.Commit(); err != nil {
			return nil, nil, err
		}
	}
	return ids, deadline, nil
}

// claimTxOptions are the options of a claim transaction at level, as the
// broker begins one (core.Pool.BeginClaim): none when the level is the
// server's or the one the sessions start at (a MySQL DSN's tx_isolation).
func claimTxOptions(ctx context.Context, db *sqlx.DB, level sql.IsolationLevel) *sql.TxOptions {
	if level == sql.LevelDefault {
		return nil
	}
	if level == sql.LevelReadCommitted {
		for _, q := range []string{"SELECT @@SESSION.transaction_isolation", "SELECT @@SESSION.tx_isolation"} {
			var s string
			if err := db.QueryRowContext(ctx, q).Scan(&s); err == nil {
				if strings.EqualFold(s, "READ-COMMITTED") {
					return nil
				}
				break
			}
		}
	}
	return &sql.TxOptions{Isolation: level}
}

// leaseFloorComplete deletes the claimed rows with the form's fenced
// completion, failing unless every row matched.
func leaseFloorComplete(ctx context.Context, conn *sqlx.Conn, p *core.Plan, feats core.Features, ids []any, token any) error {
	tokens := make([]any, len(ids))
	for i := range tokens {
		tokens[i] = token
	}
	cond, args := p.Caps.Leaser.FenceLeases(p, ids, tokens)
	q := p.Rebind("DELETE FROM " + p.QTable + " WHERE " + cond)
	// As the form writes it: with RETURNING where the dialect reports no
	// conflicts, one statement that commits itself; else in a transaction.
	var on interface {
		sqlx.QueryerContext
		sqlx.ExecerContext
	} = conn
	var tx *sqlx.Tx
	if !feats.DeleteReturning || !p.Caps.ReturningAlone() {
		var err error
		if tx, err = conn.BeginTxx(ctx, nil); err != nil {
			return err
		}
		defer tx.Rollback() //nolint:errcheck // no-op after Commit
		on = tx
	}
	var n int64
	if feats.DeleteReturning {
		rows, err := on.QueryxContext(ctx, q+" RETURNING "+p.QID, args...)
		if err != nil {
			return err
		}
		got, err := idsOf(rows, p.ID)
		if err != nil {
			return err
		}
		n = int64(len(got))
	} else {
		res, err := on.ExecContext(ctx, q, args...)
		if err != nil {
			return err
		}
		if n, err = res.RowsAffected(); err != nil {
			return err
		}
	}
	if n != int64(len(ids)) {
		return fmt.Errorf("the fenced completion matched %d of %d rows", n, len(ids))
	}
	if tx != nil {
		return tx.Commit()
	}
	return nil
}

// idsOf reads the id column of rows and closes them.
func idsOf(rows *sqlx.Rows, id string) ([]any, error) {
	cols, err := columnsOf(rows, id)
	if err != nil {
		return nil, err
	}
	return cols[0], nil
}

// columnsOf reads the named columns of rows, byte slices as strings, one
// list per name, and closes them.
func columnsOf(rows *sqlx.Rows, names ...string) ([][]any, error) {
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		return nil, err
	}
	at := make([]int, len(names))
	for j, name := range names {
		at[j] = slices.Index(cols, name)
		if at[j] < 0 {
			return nil, fmt.Errorf("no %s column in the claimed rows", name)
		}
	}
	out := make([][]any, len(names))
	for rows.Next() {
		vals, err := rows.SliceScan()
		if err != nil {
			return nil, err
		}
		for j, i := range at {
			v := vals[i]
			if b, ok := v.([]byte); ok {
				v = string(b)
			}
			out[j] = append(out[j], v)
		}
	}
	return out, rows.Err()
}

// AdvisoryFloor drains a table of c.Rows rows with the advisory form's own
// statements and nothing else: one session holds the keys (its lock wait
// limit set as the form sets it) and floorLoops claim loops each, on a
// connection of its own, read a page of candidates (the ready condition,
// ORDER BY, LIMIT 4 per row wanted plus the keys held, up to 8 pages
// while rows are wanted and until a page leaves a quarter of them found,
// 64 at least, as the form reads them), try the keys of
// floorClaimSize of them in one statement on the key session (the
// form's: TryFirstAdvisoryLocks wanting them all where the dialect has it,
// else TryAdvisoryLocks), take the rows whose keys they got (the attempt
// counted while still claimable, read back), then delete the taken rows
// in one statement on the loop's connection (on the key session where the
// database has one writer), fenced by the attempts the take counted
// (core.Plan.AttemptFence), and park their keys, as the form's
// completions do: a parked key a later claim wants is taken with no
// statement, and the others are released together (AdvisoryUnlocks on the
// key session) once floorParkFor has passed since the last release; in a
// tight loop with no engine, handler or broker in between. It returns the
// rate, the connections used and the process's CPU time over the drain,
// the fill left out.
func AdvisoryFloor(ctx context.Context, c Config, db *sqlx.DB) (float64, int, time.Duration, error) {
	if err := c.defaults(); err != nil {
		return 0, 0, 0, err
	}
	p, cleanup, err := floorTable(ctx, c, db, sqlxbroker.Advisory)
	if err != nil {
		return 0, 0, 0, fmt.Errorf("bench: advisory floor: %w", err)
	}
	defer cleanup()
	pool := core.NewPool(db, c.Dialect)
	defer pool.Close()
	al := p.Caps.AdvisoryLocker
	keyConn, err := db.Connx(ctx)
	if err != nil {
		return 0, 0, 0, fmt.Errorf("bench: advisory floor: the key session: %w", err)
	}
	defer keyConn.Close()
	set, reset := al.LockWaitLimit(5 * time.Second)
	if set != "" {
		if _, err := keyConn.ExecContext(ctx, set); err != nil {
			return 0, 0, 0, fmt.Errorf("bench: advisory floor: %w", err)
		}
		defer keyConn.ExecContext(context.Background(), reset) //nolint:errcheck // the session closes next
	}
	k := &advisoryFloor{p: p, pool: pool, key: keyConn, size: floorClaimSize(c), held: map[string]bool{}, parked: map[string]struct{}{}}
	loops := min(floorLoops, c.Concurrency)
	elapsed, cpu, err := onConns(ctx, db, loops, k.loop)
	if err == nil {
		err = k.releaseParked(ctx)
	}
	if err != nil {
		return 0, 0, 0, fmt.Errorf("bench: advisory floor: %w", err)
	}
	if n := k.total.Load(); n != int64(c.Rows) {
		return 0, 0, 0, fmt.Errorf("bench: advisory floor: %d of %d rows deleted", n, c.Rows)
	}
	return float64(c.Rows) / elapsed.Seconds(), loops + 1, cpu, nil
}

// floorCandidates, floorPages and floorEnoughRows are the advisory form's
// candidates per row wanted, most pages per claim, and the fewest rows
// after which a claim that has a quarter of its rows reads no further
// page (forms/advisory.go).
const (
	floorCandidates = 4
	floorPages      = 8
	floorEnoughRows = 64
)

type advisoryFloor struct {
	p     *core.Plan
	pool  *core.Pool
	size  int
	total atomic.Int64

	keyMu  sync.Mutex // the key session runs one statement at a time
	key    *sqlx.Conn
	parked map[string]struct{} // keys of deleted rows, kept for the next claims
	swept  time.Time           // when the parked keys were last released

	mu   sync.Mutex
	held map[string]bool // keys held or being tried
}

type floorCand struct {
	id  any
	key string
}

func (k *advisoryFloor) loop(conn *sqlx.Conn) error {
	ctx := context.Background()
	p := k.p
	cols := p.Alias + "." + p.QID
	for _, o := range p.OrderKeys {
		cols += ", " + p.Alias + "." + o.Q
	}
	for _, kc := range p.QKeyCols {
		cols += ", " + p.Alias + "." + kc
	}
	idle := 0
	for {
		k.mu.Lock()
		limit := k.size*floorCandidates + len(k.held)
		k.mu.Unlock()
		page := fmt.Sprintf("SELECT %s FROM %s %s WHERE %%s ORDER BY %s LIMIT %d", cols, p.QTable, p.Alias, p.OrderBy(p.Alias), limit)
		var want []floorCand
		var after []any
		empty := false
		for n := 0; n < floorPages && len(want) < k.size; n++ {
			where, args := p.Ready(p.Alias, core.Now())
			if after != nil {
				cond, ca := p.From(p.Alias, after, true)
				where, args = where+" AND "+cond, append(args, ca...)
			}
			rows, err := conn.QueryxContext(ctx, p.Rebind(fmt.Sprintf(page, where)), args...)
			if err != nil {
				return fmt.Errorf("candidates: %w", err)
			}
			got, last, err := k.candidates(rows)
			if err != nil {
				return fmt.Errorf("candidates: %w", err)
			}
			if n == 0 && last == nil {
				empty = true
			}
			for _, cd := range got {
				if len(want) < k.size && k.hold(cd.key) {
					want = append(want, cd)
				}
			}
			if last == nil || len(got) < limit || len(want) >= floorEnoughRows && len(want)*4 >= k.size {
				break
			}
			after = last
		}
		if empty {
			return nil // drained: rows the other loop holds are its own to finish
		}
		if len(want) == 0 {
			// Every candidate's key is held by the other loop: its
			// completion frees them.
			if idle++; idle > 1 {
				time.Sleep(time.Millisecond)
			}
			continue
		}
		idle = 0
		if err := k.claimAndComplete(ctx, conn, want); err != nil {
			return err
		}
	}
}

// candidates reads a page: each row's id and key, and the order values of
// the last row (nil for an empty page).
func (k *advisoryFloor) candidates(rows *sqlx.Rows) ([]floorCand, []any, error) {
	defer rows.Close()
	p := k.p
	var out []floorCand
	var last []any
	nOrder := len(p.OrderKeys)
	keyCols := p.Key.Columns()
	for rows.Next() {
		vals, err := rows.SliceScan()
		if err != nil {
			return nil, nil, err
		}
		for i, v := range vals {
			if b, ok := v.([]byte); ok {
				vals[i] = string(b)
			}
		}
		byCol := map[string]any{}
		for i, kc := range keyCols {
			byCol[kc] = vals[1+nOrder+i]
		}
		out = append(out, floorCand{id: vals[0], key: p.Key.Render(func(col string) any { return byCol[col] })})
		last = vals[1 : 1+nOrder]
	}
	return out, last, rows.Err()
}

func (k *advisoryFloor) hold(key string) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.held[key] {
		return false
	}
	k.held[key] = true
	return true
}

func (k *advisoryFloor) drop(keys []string) {
	k.mu.Lock()
	for _, key := range keys {
		delete(k.held, key)
	}
	k.mu.Unlock()
}

// claimAndComplete tries the keys of want (taking parked ones as they
// are), takes the rows of those it got, deletes them (fenced by attempt,
// as the form's successes are) and parks every key it took.
func (k *advisoryFloor) claimAndComplete(ctx context.Context, conn *sqlx.Conn, want []floorCand) error {
	p := k.p
	keys := make([]string, len(want))
	for i, cd := range want {
		keys[i] = cd.key
	}
	defer k.drop(keys)
	k.keyMu.Lock()
	ok, err := k.tryOrTakeParked(ctx, keys)
	k.keyMu.Unlock()
	if err != nil {
		return fmt.Errorf("try keys: %w", err)
	}
	var ids []any
	var locked []string
	for i, got := range ok {
		if got {
			ids = append(ids, want[i].id)
			locked = append(locked, want[i].key)
		}
	}
	var taken, attempts []any
	if len(ids) > 0 {
		where, args := p.Ready(p.QTable, core.Now())
		in, inArgs := p.Caps.MatchIDs(p, p.QTable+"."+p.QID, ids)
		in += " AND " + where
		upd := "UPDATE " + p.QTable + " SET " + p.QAttempt + " = " + p.NextAttempt("") + " WHERE " + in
		args = append(inArgs, args...)
		var rows *sqlx.Rows
		if p.Dialect.Features().UpdateReturning {
			rows, err = conn.QueryxContext(ctx, p.Rebind(upd+" RETURNING *"), args...)
		} else if _, err = conn.ExecContext(ctx, p.Rebind(upd), args...); err == nil {
			rows, err = conn.QueryxContext(ctx, p.Rebind("SELECT * FROM "+p.QTable+" WHERE "+in), args...)
		}
		var cols [][]any
		if err == nil {
			cols, err = columnsOf(rows, p.ID, p.Attempt)
		}
		if err != nil {
			return fmt.Errorf("take: %w", err)
		}
		taken, attempts = cols[0], cols[1]
	}
	onKey := p.Caps.RowLocker == nil // the deletes run on the key session
	if onKey {
		k.keyMu.Lock()
		defer k.keyMu.Unlock()
	}
	if len(taken) > 0 {
		// As the form writes its successes: fenced by the attempt the
		// take counted, in one statement that commits itself, on a
		// connection of the pool (this loop's) where the database writes
		// side by side, else on the key session.
		cond, args := p.AttemptFence(taken, attempts)
		var on sqlx.ExecerContext = conn
		if onKey {
			on = k.key
		}
		res, err := on.ExecContext(ctx, p.Rebind("DELETE FROM "+p.QTable+" WHERE "+cond), args...)
		if err != nil {
			return fmt.Errorf("complete: %w", err)
		}
		if n, err := res.RowsAffected(); err != nil || n != int64(len(taken)) {
			return errors.Join(err, fmt.Errorf("complete: deleted %d of %d rows", n, len(taken)))
		}
		k.total.Add(int64(len(taken)))
	}
	if !onKey {
		k.keyMu.Lock()
		defer k.keyMu.Unlock()
	}
	// As the form's completions do: the keys are parked for the next
	// claims, and those no claim took are released together once
	// floorParkFor has passed since the last release.
	for _, key := range locked {
		k.parked[key] = struct{}{}
	}
	if time.Since(k.swept) >= floorParkFor {
		return k.releaseParked(ctx)
	}
	return nil
}

// floorParkFor is how long the advisory form parks the keys of finished
// deliveries at most (forms/keyholder.go, parkFor).
const floorParkFor = 10 * time.Millisecond

// releaseParked releases the parked keys, with keyMu held.
func (k *advisoryFloor) releaseParked(ctx context.Context) error {
	k.swept = time.Now()
	if len(k.parked) == 0 {
		return nil
	}
	keys := make([]string, 0, len(k.parked))
	for key := range k.parked {
		keys = append(keys, key)
	}
	clear(k.parked)
	for i := 0; i < len(keys); i += floorBatchKeys {
		if err := k.p.Caps.AdvisoryLocker.AdvisoryUnlocks(ctx, &core.AdvisoryParams{Pool: k.pool, Conn: k.key, Keys: keys[i:min(i+floorBatchKeys, len(keys))]}); err != nil {
			return fmt.Errorf("release keys: %w", err)
		}
	}
	return nil
}

// floorBatchKeys is the most keys one statement releases (the form's
// batchKeys).
const floorBatchKeys = 500

// tryOrTakeParked takes the keys of keys that are parked with no
// statement and tries the others, as the form's claims do.
func (k *advisoryFloor) tryOrTakeParked(ctx context.Context, keys []string) ([]bool, error) {
	ok := make([]bool, len(keys))
	var rest []string
	var at []int
	for i, key := range keys {
		if _, p := k.parked[key]; p {
			ok[i] = true
			delete(k.parked, key)
		} else {
			rest, at = append(rest, key), append(at, i)
		}
	}
	if len(rest) == 0 {
		return ok, nil
	}
	got, err := k.try(ctx, rest)
	if err != nil {
		return nil, err
	}
	for j, b := range got {
		ok[at[j]] = b
	}
	return ok, nil
}

// try tries every key of keys on the key session with the statement the
// form's claims use: where the dialect tries keys in order until as many as
// wanted are locked (core.AdvisoryFirstLocker), that one, wanting them all.
func (k *advisoryFloor) try(ctx context.Context, keys []string) ([]bool, error) {
	ap := &core.AdvisoryParams{Pool: k.pool, Conn: k.key, Keys: keys}
	first := k.p.Caps.AdvisoryFirstLocker
	if first == nil {
		return k.p.Caps.AdvisoryLocker.TryAdvisoryLocks(ctx, ap)
	}
	at, err := first.TryFirstAdvisoryLocks(ctx, ap, len(keys))
	if err != nil {
		return nil, err
	}
	ok := make([]bool, len(keys))
	for _, i := range at {
		ok[i] = true
	}
	return ok, nil
}

// connExt is a connection as the dialects' statements take one.
type connExt struct{ *sqlx.Conn }

func (c connExt) DriverName() string { return "" }

func (c connExt) BindNamed(q string, arg any) (string, []any, error) {
	return sqlx.BindNamed(sqlx.QUESTION, q, arg)
}
