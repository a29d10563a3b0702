package forms

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/go-multierror"

	"github.com/jmoiron/sqlx"
	"github.com/sqlxbroker/sqlxbroker/core"
)

// rowLock: BEGIN; SELECT .. FOR UPDATE SKIP LOCKED; the handler runs with the
// transaction open; the completion statement, then COMMIT. One transaction,
// and so one connection, per delivery in work.
type rowLock struct {
	base
	life   context.Context
	cancel context.CancelFunc

	skip   string // the locking clause (core.RowLockSQL)
	chain  string // COMMIT AND CHAIN; "" for none
	mu     sync.Mutex
	spares []*claimTx // chained transactions waiting for their next claim

	byID  bool       // claims from the cursor lock by ID (core.RowLockSQL.ByID)
	cmu   sync.Mutex // guards cands
	cands []any      // with byID: candidate IDs read from the cursor, in claim order, not yet tried

	prepare  bool // the dialect lets forms prepare statements
	smu      sync.Mutex
	stmts    map[string]*sqlx.Stmt // prepared claims and completions, by text
	prepLate time.Time             // no preparing before: the last prepare failed
}

// claimTx is a claim transaction and the context its life is bound to.
type claimTx struct {
	tx      *sqlx.Tx
	ctx     context.Context
	cancel  context.CancelFunc
	chained int // deliveries this transaction has carried
}

// prepareAgain is how long statements run unprepared after a prepare
// failed, so a server or pooler that refuses them costs no extra round trip
// per delivery.
const prepareAgain = time.Minute

// maxChained is the most deliveries one chained transaction carries when
// statements are prepared: database/sql keeps every statement used in a
// transaction until it ends, so a chain that never ended would grow.
const maxChained = 64

func (t *claimTx) rollback() {
	_ = t.tx.Rollback()
	t.cancel()
}

func newRowLock(b base) *rowLock {
	f := &rowLock{base: b}
	f.life, f.cancel = newLife()
	return f
}

// Traits: claims row by row, each worker claiming its next row itself.
func (f *rowLock) Traits() core.Traits { return core.Traits{} }

func (f *rowLock) Start(ctx context.Context) error {
	rl, err := f.plan.Caps.RowLocker.RowLock(ctx, f.pool)
	if err != nil {
		return fmt.Errorf("sqlxbroker: row-lock form on %s: %w", f.plan.Table, err)
	}
	f.skip, f.chain, f.prepare = rl.SkipLocked, rl.ChainCommit, rl.Prepare
	// By ID only in ID order: a statement whose order is not the key's
	// would lock every candidate it reads before it sorts them, and keep
	// all but the first locked.
	f.byID = rl.ByID && f.plan.OrderIsID()
	return nil
}

// Close rolls back every claim transaction still open: those rows are
// claimable again at once, their attempts uncounted.
func (f *rowLock) Close() error {
	f.cancel()
	f.dropSpares()
	f.smu.Lock()
	defer f.smu.Unlock()
	for q, st := range f.stmts {
		st.Close()
		delete(f.stmts, q)
	}
	return nil
}

// prepared returns q prepared, nil when statements are not prepared or q
// could not be (it then runs unprepared, and reports its own error; no
// statement is prepared for prepareAgain).
func (f *rowLock) prepared(ctx context.Context, q string) *sqlx.Stmt {
	if !f.prepare {
		return nil
	}
	f.smu.Lock()
	defer f.smu.Unlock()
	if st := f.stmts[q]; st != nil {
		return st
	}
	if f.life.Err() != nil || time.Now().Before(f.prepLate) {
		return nil
	}
	st, err := f.db.PreparexContext(ctx, q)
	if err != nil {
		f.prepLate = time.Now().Add(prepareAgain)
		return nil
	}
	if f.stmts == nil {
		f.stmts = map[string]*sqlx.Stmt{}
	}
	f.stmts[q] = st
	return st
}

// evict drops a prepared statement that failed: it is prepared again on its
// next use (a table altered since, a session that lost it).
func (f *rowLock) evict(q string, st *sqlx.Stmt) {
	f.smu.Lock()
	defer f.smu.Unlock()
	if f.stmts[q] == st {
		delete(f.stmts, q)
		st.Close()
	}
}

// query runs q in t, prepared where the dialect allows, and reads its rows.
func (f *rowLock) query(ctx context.Context, t *claimTx, q string, args []any) ([]row, error) {
	st := f.prepared(ctx, q)
	if st == nil {
		r, err := t.tx.QueryxContext(ctx, q, args...)
		if err != nil {
			return nil, err
		}
		return readRows(r)
	}
	ts := t.tx.StmtxContext(ctx, st)
	defer ts.Close()
	r, err := ts.QueryxContext(ctx, args...)
	var rows []row
	if err == nil {
		rows, err = readRows(r)
	}
	if err != nil {
		f.evict(q, st)
	}
	return rows, err
}

// exec runs q in t, prepared where the dialect allows.
func (f *rowLock) exec(ctx context.Context, t *claimTx, q string, args []any) error {
	st := f.prepared(ctx, q)
	if st == nil {
		_, err := t.tx.ExecContext(ctx, q, args...)
		return err
	}
	ts := t.tx.StmtxContext(ctx, st)
	defer ts.Close()
	_, err := ts.ExecContext(ctx, args...)
	if err != nil {
		f.evict(q, st)
	}
	return err
}

// spare returns a chained transaction waiting for a claim, or nil.
func (f *rowLock) spare() *claimTx {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := len(f.spares)
	if n == 0 {
		return nil
	}
	t := f.spares[n-1]
	f.spares = f.spares[:n-1]
	return t
}

// keep keeps a chained transaction for the next claim.
func (f *rowLock) keep(t *claimTx) {
	f.mu.Lock()
	if f.life.Err() == nil {
		f.spares = append(f.spares, t)
		t = nil
	}
	f.mu.Unlock()
	if t != nil {
		t.rollback()
	}
}

// dropSpares rolls back every chained transaction waiting for a claim: the
// table had nothing ready, so their connections go back to the pool.
func (f *rowLock) dropSpares() {
	f.mu.Lock()
	spares := f.spares
	f.spares = nil
	f.mu.Unlock()
	for _, t := range spares {
		t.rollback()
	}
}

const savepoint = "sqlxbroker_handler"

// claimers is the most row-lock claims made at once, each in its own
// transaction on its own connection: a claim is a few round trips, so
// claiming one row after another would bound a subscription's rate by
// their latency rather than by the database.
const claimers = 8

// Claim claims up to max rows, one transaction each. It starts with one
// claimer and adds another with each row found, up to claimers at once, so
// an empty or nearly empty table costs one connection, not claimers. It
// stops once a claim finds nothing.
func (f *rowLock) Claim(ctx context.Context, max int) ([]core.Claim, error) {
	var mu sync.Mutex
	var out []core.Claim
	_, err := f.ClaimEach(ctx, max, func(c core.Claim) {
		mu.Lock()
		out = append(out, c)
		mu.Unlock()
	})
	return out, err
}

// ClaimEach is Claim handing each row to found as its claimer takes it
// (core.ClaimStreamer): the first row's handler starts while the other
// claimers still open their connections.
func (f *rowLock) ClaimEach(ctx context.Context, max int, found func(core.Claim)) (int, error) {
	var (
		mu      sync.Mutex
		n       int
		errs    error
		left    = max   // claims not yet started
		running = 0     // claimers at work
		dry     = false // a claim found nothing
		wg      sync.WaitGroup
	)
	var claimer func()
	// next reports whether the calling claimer should claim once more.
	next := func() bool {
		mu.Lock()
		defer mu.Unlock()
		if dry || errs != nil || left == 0 {
			running--
			return false
		}
		left--
		return true
	}
	claimer = func() {
		defer wg.Done()
		for next() {
			c, err := f.claimOne(ctx)
			mu.Lock()
			switch {
			case err != nil:
				errs = multierror.Append(errs, err)
			case c == nil:
				dry = true
			default:
				n++
				// A row found: another claimer may find the next.
				if running < claimers && left > running {
					running++
					wg.Add(1)
					go claimer()
				}
			}
			mu.Unlock()
			if c != nil {
				found(c)
			}
		}
	}
	running = 1
	wg.Add(1)
	claimer()
	wg.Wait()
	return n, errs
}

func (f *rowLock) claimOne(ctx context.Context) (core.Claim, error) {
	if err := ctx.Err(); err != nil {
		return nil, nil
	}
	// A chained transaction saves a BEGIN; one that fails (its session
	// ended while it waited) is dropped for a new transaction.
	if t := f.spare(); t != nil {
		c, err := f.claimIn(ctx, t)
		if err == nil {
			return c, nil
		}
		if ctx.Err() != nil {
			return nil, nil
		}
	}
	t := &claimTx{}
	t.ctx, t.cancel = context.WithCancel(f.life)
	tx, err := f.begin(t.ctx)
	if err != nil {
		t.cancel()
		return nil, fmt.Errorf("sqlxbroker: begin claim: %w", err)
	}
	t.tx = tx
	return f.claimIn(ctx, t)
}

// claimIn claims one row in t. It rolls t back when it finds none, and then
// every chained transaction waiting too: nothing is ready.
func (f *rowLock) claimIn(ctx context.Context, t *claimTx) (core.Claim, error) {
	p := f.plan
	fail := func(err error) (core.Claim, error) {
		t.rollback()
		if err == nil {
			f.dropSpares()
		}
		return nil, err
	}
	where, args := p.Ready(p.Alias, core.Now())
	var rows []row
	var err error
	if p.QGroup != "" {
		rows, err = f.claimHead(ctx, t.tx, where, args)
	} else {
		// From the cursor first; when that finds nothing, from the start
		// (or the floor, read in the claim's transaction: the pool may
		// have no connection to spare while claims hold theirs).
		f.scan.refreshFloor(ctx, t.tx, p)
		var keep rescanOf
		for retry := false; ; retry = true {
			var from string
			var fromArgs []any
			var full bool
			from, fromArgs, keep, full = f.scan.from(p, p.Alias, retry)
			if f.byID && !full {
				rows, err = f.claimByID(ctx, t, where, args, from, fromArgs)
			} else {
				if f.byID {
					// The cursor may move back: candidates are read anew.
					f.dropCandidates()
				}
				rows, err = f.query(ctx, t, p.Rebind("SELECT * FROM "+p.QTable+" "+p.Alias+" WHERE "+where+from+
					" ORDER BY "+p.OrderBy(p.Alias)+" LIMIT 1 "+f.skip), append(args, fromArgs...))
			}
			if err != nil || len(rows) > 0 || full {
				break
			}
		}
		switch {
		case keep != 0 && err == nil && len(rows) == 0:
			f.scan.rescanned(p, keep, nil, false)
		case keep != 0 && len(rows) > 0:
			f.scan.rescanned(p, keep, p.OrderValues(rows[0].get), true)
		case len(rows) > 0:
			f.scan.advance(p.OrderValues(rows[0].get))
		}
	}
	if err != nil {
		return fail(fmt.Errorf("sqlxbroker: row-lock claim on %s: %w", p.Table, err))
	}
	if len(rows) == 0 {
		return fail(nil)
	}
	r := &rows[0]
	attempt, err := f.attemptOf(r)
	if err != nil {
		return fail(err)
	}
	c := &rowLockClaim{f: f, t: t, row: f.delivery(r, attempt, "")}
	// Under c.mu: a check that runs before AfterFunc returns (a claimer
	// descheduled for pingEvery) resets the timer under c.mu too.
	c.mu.Lock()
	c.watch = time.AfterFunc(pingEvery, c.check)
	c.mu.Unlock()
	return c, nil
}

// byIDPage is how many candidate IDs one read from the cursor takes
// (core.RowLockSQL.ByID), and byIDTry how many of them one statement tries
// to lock: the first candidates are mostly locked by the other claims
// running, or gone.
const (
	byIDPage = 128
	byIDTry  = 4
)

// claimByID claims, from the cursor (from), the first row it can lock among
// the candidates read so far, a few at a time by ID; when they run out it
// reads a page more without locks, once. Nil: none from the cursor (the
// caller then scans from the first row). A claimable row the candidates
// passed over (committed since, or made claimable again behind them) is
// the next full scan's, as it is without ByID.
func (f *rowLock) claimByID(ctx context.Context, t *claimTx, where string, args []any, from string, fromArgs []any) ([]row, error) {
	p := f.plan
	read := false
	for {
		ids := f.popCandidates()
		if len(ids) == 0 {
			if read {
				return nil, nil
			}
			read = true
			if err := f.readCandidates(ctx, t, where+from, append(append([]any{}, args...), fromArgs...)); err != nil {
				return nil, err
			}
			continue
		}
		// Always byIDTry IDs (the last repeated), so one statement text
		// serves every claim (prepared once per connection).
		try := ids
		for len(try) < byIDTry {
			try = append(try, ids[len(ids)-1])
		}
		in, inArgs := p.Caps.MatchIDs(p, p.Alias+"."+p.QID, try)
		rows, err := f.query(ctx, t, p.Rebind("SELECT * FROM "+p.QTable+" "+p.Alias+" WHERE "+in+" AND "+where+
			" ORDER BY "+p.OrderBy(p.Alias)+" LIMIT 1 "+f.skip), append(inArgs, args...))
		if err != nil || len(rows) > 0 {
			if len(rows) > 0 {
				f.returnCandidates(ids, rows[0].get(p.ID))
				if byIDHook != nil {
					byIDHook()
				}
			}
			return rows, err
		}
	}
}

// byIDHook, when set (by tests), runs for each row claimed by ID.
var byIDHook func()

// readCandidates reads a page of candidate IDs over where, without locks,
// in t; they become the candidates unless a claim running meanwhile read
// some first.
func (f *rowLock) readCandidates(ctx context.Context, t *claimTx, where string, args []any) error {
	p := f.plan
	rows, err := f.query(ctx, t, p.Rebind("SELECT "+p.Alias+"."+p.QID+" FROM "+p.QTable+" "+p.Alias+" WHERE "+where+
		" ORDER BY "+p.OrderBy(p.Alias)+" LIMIT "+strconv.Itoa(byIDPage)), args)
	if err != nil {
		return err
	}
	ids := make([]any, len(rows))
	for i := range rows {
		ids[i] = rows[i].vals[0]
	}
	// As the cursor keeps its positions: bytes as strings (an ID is
	// never NULL).
	ids = orderPosition(ids)
	f.cmu.Lock()
	if len(f.cands) == 0 {
		f.cands = ids
	}
	f.cmu.Unlock()
	return nil
}

// popCandidates takes the next byIDTry candidates.
func (f *rowLock) popCandidates() []any {
	f.cmu.Lock()
	defer f.cmu.Unlock()
	n := min(byIDTry, len(f.cands))
	ids := f.cands[:n:n]
	f.cands = f.cands[n:]
	return ids
}

// returnCandidates puts back the candidates of ids after got, the one
// claimed: the statement named them, but its LIMIT 1 ended before it
// locked them or found them gone.
func (f *rowLock) returnCandidates(ids []any, got any) {
	k := idKey(got)
	for i, id := range ids {
		if idKey(id) == k {
			if rest := ids[i+1:]; len(rest) > 0 {
				f.cmu.Lock()
				f.cands = append(rest[:len(rest):len(rest)], f.cands...)
				f.cmu.Unlock()
			}
			return
		}
	}
}

// dropCandidates forgets the candidates read.
func (f *rowLock) dropCandidates() {
	f.cmu.Lock()
	f.cands = nil
	f.cmu.Unlock()
}

// claimHead claims the head of one FIFO group under the dialect's group
// guard: candidate heads are read without locks, the group is guarded, and
// the head is then locked and checked again.
func (f *rowLock) claimHead(ctx context.Context, tx *sqlx.Tx, where string, args []any) ([]row, error) {
	p := f.plan
	r, err := tx.QueryxContext(ctx, p.Rebind("SELECT "+p.Alias+"."+p.QID+", "+p.Alias+"."+p.QGroup+" FROM "+p.QTable+" "+p.Alias+
		" WHERE "+where+" ORDER BY "+p.OrderBy(p.Alias)+" LIMIT 16"), args...)
	if err != nil {
		return nil, err
	}
	cands, err := readRows(r)
	if err != nil {
		return nil, err
	}
	lockSQL := p.Rebind("SELECT * FROM " + p.QTable + " " + p.Alias + " WHERE " + where + " AND " + p.Alias + "." + p.QID + " = ? " + f.skip)
	// Guard one group at a time and stop at the first head locked: the
	// guard lasts as long as the delivery's transaction, so guarding more
	// groups than the one delivered would hold them all up.
	for _, c := range cands {
		if g := c.vals[1]; g != nil {
			ok, err := p.Caps.GroupGuard.GuardGroup(ctx, tx, &core.GroupGuardParams{Plan: p, Group: g})
			if err != nil {
				return nil, fmt.Errorf("guard FIFO group %v: %w", g, err)
			}
			if !ok {
				continue
			}
		}
		r, err := tx.QueryxContext(ctx, lockSQL, append(args, c.vals[0])...)
		if err != nil {
			return nil, err
		}
		rows, err := readRows(r)
		if err != nil || len(rows) > 0 {
			return rows, err
		}
	}
	return nil, nil
}

type rowLockClaim struct {
	f   *rowLock
	t   *claimTx
	row core.Row

	mu     sync.Mutex
	txUsed bool  // the handler asked for the transaction
	sealed bool  // the completion started: the handler's access ended
	txErr  error // the savepoint's error

	watch  *time.Timer // the next check of the transaction's connection
	lost   error       // the check failed: the server has ended the transaction
	onLost func()
}

func (c *rowLockClaim) Row() *core.Row { return &c.row }

// OnLost runs fn when the claim transaction's connection is found broken
// (check): the server has rolled the transaction back, so the row is
// another claim's to take.
func (c *rowLockClaim) OnLost(fn func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.lost != nil {
		fn()
		return
	}
	c.onLost = fn
}

// check runs a statement in the claim transaction every pingEvery while
// the handler runs without having asked for the transaction (a handler that
// did learns of a broken connection from its own statements): a connection
// cut or a session ended leaves the transaction rolled back on the server
// and the row claimable at once, so the handler is told (OnLost) rather than
// running on for a row it no longer holds. The statement has no deadline of
// its own: cancelling it would cancel the session's statement in progress,
// which may be the handler's; a stalled network holds it, and the row lock
// with it, until the connection ends or recovers.
func (c *rowLockClaim) check() {
	c.mu.Lock()
	if c.sealed || c.txUsed {
		c.mu.Unlock()
		return
	}
	c.mu.Unlock()
	_, err := c.t.tx.ExecContext(c.t.ctx, "SELECT 1")
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.sealed || c.t.ctx.Err() != nil:
	case err != nil:
		c.lost = fmt.Errorf("sqlxbroker: row-lock claim on %s: the claim transaction's connection failed: %v: %w", c.f.plan.Table, err, core.ErrLeaseLost)
		if c.onLost != nil {
			c.onLost()
		}
	default:
		c.watch.Reset(pingEvery)
	}
}

// Tx hands the handler the claim transaction. The first call takes a
// savepoint, so a failed handler's writes can be rolled back while its
// attempt is still counted in the same commit.
func (c *rowLockClaim) Tx() (*sqlx.Tx, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sealed {
		return nil, sql.ErrTxDone
	}
	if !c.txUsed {
		c.txUsed = true
		_, c.txErr = c.t.tx.ExecContext(c.t.ctx, "SAVEPOINT "+savepoint)
	}
	if c.txErr != nil {
		return nil, c.txErr
	}
	return c.t.tx, nil
}

// seal ends the handler's access to the transaction and reports whether
// it asked for it: a handler that kept its delivery cannot write into the
// transaction once it carries another delivery (chained commits).
func (c *rowLockClaim) seal() (used bool, lost error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sealed = true
	c.watch.Stop()
	return c.txUsed, c.lost
}

// Complete records o (complete) and calls done before it returns.
func (c *rowLockClaim) Complete(ctx context.Context, o core.Outcome, done func(error)) {
	done(c.complete(ctx, o))
}

// complete runs the completion statement in the delivery's transaction and
// commits. A failed handler's writes through Delivery.Tx are rolled back to
// the savepoint first. Any error rolls everything back: the row is
// claimable again with its attempt unchanged. A claim whose connection
// check failed is rolled back and reports ErrLeaseLost: its row may be
// another claim's by now. When the dialect chains
// commits and the handler never asked for the transaction, the commit
// chains and the transaction waits for the worker's next claim.
func (c *rowLockClaim) complete(ctx context.Context, o core.Outcome) error {
	t := c.t
	used, lost := c.seal()
	if lost != nil {
		t.rollback()
		return lost
	}
	if o.Kind == core.Released {
		defer t.cancel()
		return t.tx.Rollback()
	}
	if o.Kind != core.Succeeded && used {
		if _, err := t.tx.ExecContext(ctx, "ROLLBACK TO SAVEPOINT "+savepoint); err != nil {
			t.rollback()
			return fmt.Errorf("sqlxbroker: roll back handler writes: %w", err)
		}
	}
	q, args := c.f.completion(o, true, false, "")
	if err := c.f.exec(ctx, t, q, append(args, c.row.ID)); err != nil {
		t.rollback()
		return fmt.Errorf("sqlxbroker: row-lock completion (%s): %w", o.Kind, err)
	}
	if t.chained++; c.f.chain != "" && !used && (!c.f.prepare || t.chained < maxChained) {
		if _, err := t.tx.ExecContext(ctx, c.f.chain); err != nil {
			t.rollback()
			return fmt.Errorf("sqlxbroker: row-lock commit (%s): %w", o.Kind, err)
		}
		c.f.keep(t)
		return nil
	}
	defer t.cancel()
	if err := t.tx.Commit(); err != nil {
		return fmt.Errorf("sqlxbroker: row-lock commit (%s): %w", o.Kind, err)
	}
	return nil
}
