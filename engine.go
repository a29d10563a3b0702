package sqlxbroker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sqlxbroker/sqlxbroker/core"
	"github.com/sqlxbroker/sqlxbroker/internal/wake"
)

// SubscribeParams tunes a subscription. The zero value is usable.
type SubscribeParams struct {
	// Concurrency is the most handlers running at once; default 10.
	Concurrency int
	// BatchSize is the most rows one claim takes; default Concurrency.
	BatchSize int
	// PollInterval is the longest wait between claims while the table is
	// idle; default 1s. Idle waits double from MinPollInterval up to it,
	// and a wake-up (Waker, Subscription.Wake) cuts them short.
	PollInterval time.Duration
	// MinPollInterval is the first idle wait; default 10ms.
	MinPollInterval time.Duration
	// RetryDelay gives the delay before attempt+1 after attempt failed
	// with err, applied where the table has a ReadyAt column; default
	// DefaultRetryDelay. A handler's RetryAfter overrides it.
	RetryDelay func(attempt int, err error) time.Duration
	// CompleteTimeout bounds one completion; default 30s.
	CompleteTimeout time.Duration
	// Wake, when set, makes the subscription claim at once on each receive.
	Wake <-chan struct{}
	// OnOutcome, when set, is called after each completion with the
	// outcome asked for and the completion's error (nil when recorded).
	// It runs on the goroutine that learnt the result: the handler's, or
	// for a form that writes completions in batches (lease, advisory) the
	// form's, so it should not block.
	OnOutcome func(d *Delivery, o Outcome, err error)
	// OnClaim, when set, is called after each claim the subscription makes
	// (one statement round of the form: a batch, or one row in the
	// row-lock form) with how long it took, how many rows it handed to
	// handlers and its error. It runs on the claiming goroutine (several
	// may claim at once), so it should not block, and before the rows'
	// handlers start, except after a row-lock subscription's claims of
	// several rows, which hand each row to its handler as soon as it is
	// claimed (core.ClaimStreamer). The rows of every call
	// sum to Stats.Claimed; the calls with an error count ClaimErrors,
	// or Conflicts when the error is ErrConflict.
	OnClaim func(ClaimInfo)
	// Logger receives claim and completion errors and failed deliveries;
	// default slog.Default().
	Logger *slog.Logger
	// FailureLevel is the level of the line logged for each failed
	// delivery (a handler error or panic, with the panic's stack); default
	// slog.LevelWarn. Set it below the Logger's level to log none.
	FailureLevel slog.Leveler
	// FailureLogLimit is the most failure lines per second; beyond it the
	// failures are counted and summed up in one line per second (how many,
	// how many panicked or went dead, the last error). Default 10.
	FailureLogLimit int
}

func (p *SubscribeParams) defaults() error {
	if p.Concurrency < 0 || p.BatchSize < 0 || p.PollInterval < 0 || p.MinPollInterval < 0 || p.FailureLogLimit < 0 {
		return fmt.Errorf("sqlxbroker: SubscribeParams: negative Concurrency, BatchSize, poll interval or FailureLogLimit")
	}
	if p.Concurrency == 0 {
		p.Concurrency = 10
	}
	if p.BatchSize == 0 || p.BatchSize > p.Concurrency {
		p.BatchSize = p.Concurrency
	}
	if p.PollInterval == 0 {
		p.PollInterval = time.Second
	}
	if p.MinPollInterval == 0 {
		p.MinPollInterval = 10 * time.Millisecond
	}
	if p.MinPollInterval > p.PollInterval {
		p.MinPollInterval = p.PollInterval
	}
	if p.RetryDelay == nil {
		p.RetryDelay = DefaultRetryDelay
	}
	if p.CompleteTimeout == 0 {
		p.CompleteTimeout = 30 * time.Second
	}
	if p.Logger == nil {
		p.Logger = slog.Default()
	}
	if p.FailureLevel == nil {
		p.FailureLevel = slog.LevelWarn
	}
	if p.FailureLogLimit == 0 {
		p.FailureLogLimit = 10
	}
	return nil
}

// DefaultRetryDelay is 1s after the first attempt, doubling up to 10
// minutes, whatever the error.
func DefaultRetryDelay(attempt int, _ error) time.Duration {
	if attempt < 1 {
		attempt = 1
	}
	if attempt > 10 {
		return 10 * time.Minute
	}
	d := time.Second << (attempt - 1)
	return min(d, 10*time.Minute)
}

// ClaimInfo is what SubscribeParams.OnClaim learns of one claim.
type ClaimInfo struct {
	Duration time.Duration // the claim's time, from the form's Claim (or ClaimEach) call to its return
	Rows     int           // the rows claimed and handed to handlers
	Asked    int           // the most rows the claim asked for
	// Err is the claim's error, counted in Stats.ClaimErrors, or in
	// Stats.Conflicts when it is ErrConflict (the claim lost to a
	// concurrent transaction and is made again); nil when it succeeded or
	// was only cut short by the subscription's stop. Rows may be claimed
	// along with an error.
	Err error
}

// Stats counts what a subscription did.
type Stats struct {
	Claimed        int64 // deliveries handed to handlers
	Succeeded      int64 // completed rows
	Retried        int64 // rows returned for another attempt
	Dead           int64 // rows moved to the dead state
	Released       int64 // rows given back at stop
	Snoozed        int64 // rows a handler snoozed (Snooze)
	LeaseLost      int64 // completions that found the hold lost
	ClaimErrors    int64 // failed claims
	Conflicts      int64 // claims that lost to a concurrent transaction (ErrConflict), made again; not in ClaimErrors
	CompleteErrors int64 // completions that failed otherwise
	Panics         int64 // handler panics (counted as failures too)
}

// Subscription runs a handler for the rows a claim form claims.
type Subscription struct {
	form  core.ClaimForm
	table Table
	h     Handler
	p     SubscribeParams
	log   *slog.Logger
	fails *failureLog

	stopClaims context.CancelFunc // ends the claim loop
	claimCtx   context.Context
	hardCtx    context.Context // handler contexts derive from it
	hardCancel context.CancelFunc

	completeBy sharedDeadline // completion contexts: CompleteTimeout
	batching   bool           // the form claims batches (core.Traits)
	claimers   int            // claim loops (core.Traits.ClaimsAtOnce)
	halves     bool           // claims take at most half a large batch (core.Traits.HalfBatches)
	dry        atomic.Bool    // a worker's next claim found nothing, and no rows were started since

	wake       chan struct{}
	wakeIn     chan struct{}      // where wake-ups arrive: wake, or the forwarder's (rescan)
	rescan     core.Rescanner     // the form's, when its claims must rescan on a wake-up
	stream     core.ClaimStreamer // the form's, when it hands rows on as it claims them (row by row only)
	freed      chan struct{}
	unreserved chan struct{} // a claim gave back handlers it reserved
	queueMu    sync.Mutex
	queue      []core.Claim // claimed, waiting for a worker (start, take)
	sending    bool         // a worker is on its way to the queue
	idleMu     sync.Mutex
	idle       []idler        // idle workers, the first idle first
	idleClosed bool           // claims have stopped: workers end
	inflight   atomic.Int64   // deliveries whose handler or completion runs
	reserveMu  sync.Mutex     // a claim loop's look at free handlers and its reservation
	reserved   atomic.Int64   // handlers claims in progress may fill
	pending    atomic.Int64   // completions the form has not answered yet
	handlers   sync.WaitGroup // workers
	queued     sync.WaitGroup // completions the form has not answered yet
	loops      sync.WaitGroup // claim loops
	done       chan struct{}
	stopOnce   sync.Once
	stopErr    error

	claimed, succeeded, retried, dead, released, snoozed, lost atomic.Int64
	claimErrs, completeErrs, panics, conflicts                 atomic.Int64
}

// subscribe starts form and runs h for every row it claims from table t
// until Stop, or until ctx ends (which stops it as Stop does, letting work in
// progress finish).
func subscribe(ctx context.Context, form core.ClaimForm, t Table, h Handler, p SubscribeParams) (*Subscription, error) {
	if h == nil {
		return nil, errors.New("sqlxbroker: Subscribe: nil handler")
	}
	if err := p.defaults(); err != nil {
		return nil, err
	}
	if err := form.Start(ctx); err != nil {
		return nil, err
	}
	s := &Subscription{form: form, table: t, h: h, p: p, log: p.Logger,
		fails: newFailureLog(p.Logger, p.FailureLevel, p.FailureLogLimit, t.Name, t.Form().String()),
		wake:  make(chan struct{}, 1), freed: make(chan struct{}, 1), unreserved: make(chan struct{}, 1),
		done: make(chan struct{}), completeBy: sharedDeadline{d: p.CompleteTimeout}}
	tr := form.Traits()
	s.batching, s.claimers, s.halves = tr.Batches, 1, tr.Batches && tr.HalfBatches
	if s.batching {
		s.claimers = max(1, tr.ClaimsAtOnce)
		if tr.ClaimsAtOnceBelow > 0 && s.p.BatchSize >= tr.ClaimsAtOnceBelow {
			s.claimers = 1
		}
	}
	if !s.batching {
		s.stream = core.ClaimStreamerOf(form)
	}
	s.claimCtx, s.stopClaims = context.WithCancel(context.Background())
	s.hardCtx, s.hardCancel = context.WithCancel(context.Background())
	s.wakeIn = s.wake
	if s.rescan = core.RescannerOf(form); s.rescan != nil {
		// Every wake-up, busy or idle, goes through forwardWakes, which
		// tells the form before it wakes the claim loop.
		s.wakeIn = make(chan struct{}, 1)
		go s.forwardWakes(s.wakeIn, s.p.Wake)
		s.p.Wake = nil
	}
	for i := range s.claimers {
		s.loops.Add(1)
		go s.loop(i == 0)
	}
	go s.trimIdle()
	go func() {
		select {
		case <-ctx.Done():
			_ = s.Stop(context.Background())
		case <-s.done:
		}
	}()
	return s, nil
}

// Wake makes an idle subscription claim at once.
func (s *Subscription) Wake() { wake.Signal(s.wakeIn) }

// forwardWakes passes the wake-ups of in and ext on to the claim loop, each
// after telling the form (core.Rescanner), until claims stop.
func (s *Subscription) forwardWakes(in, ext <-chan struct{}) {
	for {
		select {
		case <-in:
		case _, ok := <-ext:
			if !ok {
				ext = nil
				continue
			}
		case <-s.claimCtx.Done():
			return
		}
		s.rescan.Rescan()
		wake.Signal(s.wake)
	}
}

// Done is closed once the subscription has stopped.
func (s *Subscription) Done() <-chan struct{} { return s.done }

// Stats returns the counts so far.
func (s *Subscription) Stats() Stats {
	return Stats{Claimed: s.claimed.Load(), Succeeded: s.succeeded.Load(), Retried: s.retried.Load(),
		Dead: s.dead.Load(), Released: s.released.Load(), Snoozed: s.snoozed.Load(), LeaseLost: s.lost.Load(),
		ClaimErrors: s.claimErrs.Load(), Conflicts: s.conflicts.Load(), CompleteErrors: s.completeErrs.Load(), Panics: s.panics.Load()}
}

// InFlight is the number of deliveries whose handler or completion runs.
func (s *Subscription) InFlight() int { return int(s.inflight.Load() + s.pending.Load()) }

// Stop stops claiming and waits for the handlers in work to finish and their
// outcomes to be recorded. When ctx ends first, the handlers' contexts are
// cancelled; a handler that then returns an error has its row released
// rather than failed, and Stop waits for every completion before it returns
// ctx's error. Nothing in work is dropped: each row is completed, released,
// or left to the form's own recovery (rollback, lease expiry, session end).
func (s *Subscription) Stop(ctx context.Context) error {
	s.stopOnce.Do(func() {
		s.stopClaims()
		s.loops.Wait()
		s.closeIdle()
		finished := make(chan struct{})
		go func() { s.handlers.Wait(); s.queued.Wait(); close(finished) }()
		select {
		case <-finished:
		case <-ctx.Done():
			s.stopErr = ctx.Err()
			s.hardCancel()
			<-finished
		}
		s.hardCancel()
		s.completeBy.stop()
		s.fails.flush()
		if err := s.form.Close(); err != nil && s.stopErr == nil {
			s.stopErr = err
		}
		close(s.done)
	})
	<-s.done
	return s.stopErr
}

// loop claims for free handlers until claims stop. A form that runs
// several claims at once (core.Traits.ClaimsAtOnce) has several loops: each reserves the handlers it
// claims for, so together they never claim more than Concurrency. Only the
// first polls an idle table; the others claim again when a handler is
// freed.
func (s *Subscription) loop(first bool) {
	defer s.loops.Done()
	idle := s.p.MinPollInterval
	conflicts := 0 // claims in a row that ended in ErrConflict
	// A form that claims a batch in one statement claims once enough
	// handlers are free while work is in flight (claimLeast), so claims
	// are not made a few rows at a time (and, with HalfBatches, for at
	// most half a large batch: claimMost); but it waits for them at most
	// about as long as its last claim took (claimWait), and then claims
	// for the handlers that are free: handlers busy with long deliveries
	// do not keep the others idle. A form that claims row by row claims
	// as soon as a handler is free, and its workers claim their next row
	// themselves while rows keep coming (see worker).
	least, most := 1, s.p.BatchSize
	if s.batching {
		least = claimLeast(s.p.BatchSize)
		if s.halves {
			most = claimMost(s.p.BatchSize)
		}
	}
	var took time.Duration // the last claim's
	var waiting time.Time  // since when free handlers wait for more (zero: none wait)
	var wait *time.Timer   // ends that wait; made once, reset for each
	for s.claimCtx.Err() == nil {
		s.reserveMu.Lock()
		busy := s.busy()
		free := s.p.Concurrency - int(busy)
		if free < 1 {
			s.reserveMu.Unlock()
			waiting = time.Time{}
			select {
			case <-s.freed:
			case <-s.unreserved:
			case <-s.claimCtx.Done():
			}
			continue
		}
		if free < least && busy > 0 {
			now := time.Now()
			if waiting.IsZero() {
				waiting = now
			}
			if left := claimWait(took) - now.Sub(waiting); left > 0 {
				s.reserveMu.Unlock()
				if wait == nil {
					wait = time.NewTimer(left)
				} else {
					wait.Reset(left)
				}
				select {
				case <-s.freed:
				case <-s.unreserved:
				case <-wait.C:
				case <-s.claimCtx.Done():
				}
				wait.Stop()
				continue
			}
		}
		waiting = time.Time{}
		n := min(free, most)
		s.reserved.Add(int64(n))
		s.reserveMu.Unlock()
		began := time.Now()
		got, err := s.claimStart(n)
		took = time.Since(began)
		s.reserved.Add(-int64(n))
		if got < n && s.claimers > 1 {
			// Handlers reserved and not filled are free again for a loop
			// that waits for them.
			wake.Signal(s.unreserved)
		}
		if !first && (err != nil || got < n) {
			if err != nil && s.claimCtx.Err() == nil {
				s.claimFailed(err)
			}
			select {
			case <-s.freed:
			case <-s.claimCtx.Done():
			}
			continue
		}
		if err != nil && s.claimCtx.Err() == nil {
			// A claim that lost to a concurrent transaction delivered
			// nothing: claim again at once, a few times in a row, then
			// wait as after any error.
			if s.claimFailed(err) && conflicts < conflictsAtOnce {
				conflicts++
				continue
			}
			conflicts = 0
			s.sleep(idle, nil)
			idle = min(idle*2, s.p.PollInterval)
			continue
		}
		conflicts = 0
		switch {
		case got == n:
			idle = s.p.MinPollInterval
		case got > 0:
			// Fewer rows than asked: more may become ready when work in
			// flight completes (a FIFO group's next head, a freed key).
			idle = s.p.MinPollInterval
			s.sleep(idle, s.freed)
		default:
			// Nothing ready. Work in flight may be what holds the rest (a
			// key, a FIFO group): its completion ends the wait too.
			s.sleep(idle, s.freed)
			idle = min(idle*2, s.p.PollInterval)
		}
	}
}

// claimLeast is how many of a batch of b handlers a batching form waits
// to be free before it claims while work is in flight: four fifths of the
// batch, but no more than claimAmortized unless half the batch is more
// (four fifths up to 250, 200 up to 400, half from there). Small
// batches gain from the wait (half a batch made a quarter more claims per
// delivery: 3-42% slower at 8 to 64 handlers, and four processes of 250
// on one table a tenth slower); from a few hundred rows on, a claim's own
// cost is spread thin, and a larger claim keeps more handlers idle while
// it runs than it saves (at 1,000 handlers four fifths drained MariaDB 18%
// slower than half, PostgreSQL 3%).
func claimLeast(b int) int {
	return max((b+1)/2, min((b*4+4)/5, claimAmortized))
}

// claimMost is the most rows a claim of a form with core.Traits.HalfBatches
// asks for, of a batch of b: of a batch of several hundred, the half that
// claimLeast waits for (handlers freed while the claim runs wait for the
// next one), else the whole batch. At 1,000 handlers claims of half the
// batch drained faster than claims of every free handler's row (850-950
// of them, as idle handlers free themselves within microseconds): medians
// of four or five pairs in turn, the lease form 5-6% faster on PostgreSQL
// and 14-16% on MariaDB, the advisory form, whose two claims then both
// run, 9-25% and 13-17%, with drain latency (p50) 30-50% lower; at 500
// alike, with latency lower. On SQLite (one writer) larger claims were
// 7-26% faster, so its forms do not halve their batches; nor do small
// batches (claimLeast's four fifths, or 200), where capping a claim at
// what claimLeast waits for was a fifth slower (250 and 64 handlers).
func claimMost(b int) int {
	if l := claimLeast(b); 2*l <= b+1 {
		return l
	}
	return b
}

// claimAmortized is the most free handlers a batching form waits for
// before it claims, unless half its batch is more (claimLeast).
const claimAmortized = 200

// claimWait is the longest free handlers wait for more to be free before
// a batching form claims for them (see loop): as long as the last claim
// took, within [minClaimWait, maxClaimWait]. Waiting longer than a claim
// costs would lose more than the larger claim saves.
func claimWait(last time.Duration) time.Duration {
	return min(max(last, minClaimWait), maxClaimWait)
}

const (
	minClaimWait = 500 * time.Microsecond
	maxClaimWait = 20 * time.Millisecond
)

// claim asks the form for up to n rows, reporting to OnClaim when set.
func (s *Subscription) claim(n int) ([]core.Claim, error) {
	if s.p.OnClaim == nil {
		return s.form.Claim(s.claimCtx, n)
	}
	start := time.Now()
	claims, err := s.form.Claim(s.claimCtx, n)
	s.reportClaim(start, len(claims), n, err)
	return claims, err
}

// claimStart claims up to n rows for free handlers and starts them: each
// as soon as it is claimed where the form hands its rows on one by one
// (core.ClaimStreamer), else all of them once the claim returns. It
// reports to OnClaim when set, and returns how many rows it started.
func (s *Subscription) claimStart(n int) (int, error) {
	if s.stream == nil {
		claims, err := s.claim(n)
		s.start(claims)
		return len(claims), err
	}
	var start time.Time
	if s.p.OnClaim != nil {
		start = time.Now()
	}
	got, err := s.stream.ClaimEach(s.claimCtx, n, func(c core.Claim) { s.start([]core.Claim{c}) })
	if s.p.OnClaim != nil {
		s.reportClaim(start, got, n, err)
	}
	return got, err
}

// reportClaim reports a claim that began at start, asked for n rows and
// handed got to handlers, to OnClaim.
func (s *Subscription) reportClaim(start time.Time, got, n int, err error) {
	info := ClaimInfo{Duration: time.Since(start), Rows: got, Asked: n}
	if err != nil && s.claimCtx.Err() == nil {
		info.Err = err
	}
	s.p.OnClaim(info)
}

// conflictsAtOnce is how many claims in a row that end in ErrConflict are
// made again at once.
const conflictsAtOnce = 3

// claimFailed counts and logs a failed claim, and reports whether it was a
// conflict (ErrConflict: counted apart, logged at debug level).
func (s *Subscription) claimFailed(err error) bool {
	if errors.Is(err, ErrConflict) {
		s.conflicts.Add(1)
		s.log.Debug("sqlxbroker: claim lost to a concurrent transaction, claiming again", "table", s.table.Name, "form", s.table.Form().String(), "err", err)
		return true
	}
	s.claimErrs.Add(1)
	s.log.Error("sqlxbroker: claim failed", "table", s.table.Name, "form", s.table.Form().String(), "err", err)
	return false
}

// next claims the next row for a worker whose delivery just completed, in
// a form that claims row by row, while the last claims found rows: the
// worker goes on at once instead of waiting for the claim loop. nil when
// nothing was claimed, or when completions not yet answered are more than
// Concurrency (busy); the loop then takes over (and polls).
func (s *Subscription) next() core.Claim {
	if s.batching || s.dry.Load() || s.claimCtx.Err() != nil || s.pending.Load() > int64(s.p.Concurrency) {
		return nil
	}
	cs, err := s.claim(1)
	if err != nil && s.claimCtx.Err() == nil {
		s.claimFailed(err)
	}
	if len(cs) == 0 {
		s.dry.Store(true)
		return nil
	}
	s.claimed.Add(1)
	return cs[0]
}

// sleep waits d or until a wake-up, a receive on also, or stop.
func (s *Subscription) sleep(d time.Duration, also <-chan struct{}) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-s.wake:
	case <-s.p.Wake:
	case <-also:
	case <-s.claimCtx.Done():
	}
}

// start queues claims for the workers and sees that one is on its way to
// them. Workers take claims from the queue (take): a worker that takes
// one while more wait sends the next worker on (an idle one, or a new
// one), and a worker whose delivery completes takes the next claim before
// it goes idle. So a batch of claims reaches as many workers as its
// handlers keep busy, one woken after another, while handlers that finish
// at once run the batch on the few workers already awake instead of
// waking a goroutine per claim. Workers stay for the next claim, so a busy
// subscription does not start a goroutine (and grow its stack) per
// delivery; a worker idle for idleWorker ends. Idle workers wait on
// channels of their own.
func (s *Subscription) start(claims []core.Claim) {
	if len(claims) == 0 {
		return
	}
	// Rows found: their workers claim their next rows themselves (next),
	// even those done before the claim that found them has ended.
	s.dry.Store(false)
	s.claimed.Add(int64(len(claims)))
	s.inflight.Add(int64(len(claims)))
	s.queueMu.Lock()
	s.queue = append(s.queue, claims...)
	if !s.batching {
		// A form that claims row by row holds each row with a
		// transaction of its own, and every delivery waits on the
		// database for its completion and its next row (next): each
		// claim gets a worker at once.
		s.queueMu.Unlock()
		for range claims {
			s.sendWorker()
		}
		return
	}
	send := !s.sending
	s.sending = true
	s.queueMu.Unlock()
	if send {
		s.sendWorker()
	}
}

// take returns the next queued claim, nil when none waits. sent is true
// for the worker sendWorker sent: it is on its way no more. In a form that
// claims batches, a worker that leaves claims waiting sends the next one
// on, unless one is on its way.
func (s *Subscription) take(sent bool) core.Claim {
	s.queueMu.Lock()
	if sent {
		s.sending = false
	}
	if len(s.queue) == 0 {
		s.queueMu.Unlock()
		return nil
	}
	c := s.queue[0]
	s.queue[0] = nil
	s.queue = s.queue[1:]
	send := s.batching && len(s.queue) > 0 && !s.sending
	if send {
		s.sending = true
	}
	s.queueMu.Unlock()
	if send {
		s.sendWorker()
	}
	return c
}

// sendWorker wakes an idle worker to take from the queue, or starts one.
func (s *Subscription) sendWorker() {
	s.idleMu.Lock()
	if n := len(s.idle); n > 0 {
		w := s.idle[n-1]
		s.idle = s.idle[:n-1]
		s.idleMu.Unlock()
		w.c <- true // its buffer is free: the worker took the last signal sent
		return
	}
	s.idleMu.Unlock()
	s.handlers.Add(1)
	go s.worker()
}

// idleWorker is how long a worker waits for its next claim.
const idleWorker = 10 * time.Second

func (s *Subscription) worker() {
	defer s.handlers.Done()
	// The worker's context ends with the subscription's hard stop; it then
	// cancels the handler context of the delivery in work.
	base, cancel := context.WithCancel(s.hardCtx)
	defer cancel()
	var mu sync.Mutex
	var cur *handlerCtx
	stop := context.AfterFunc(base, func() {
		mu.Lock()
		defer mu.Unlock()
		if cur != nil {
			cur.cancel(base.Err())
		}
	})
	defer stop()
	me := make(chan bool, 1)
	sent := true // started by sendWorker
	for {
		c := s.take(sent)
		sent = false
		for c != nil {
			ctx := &handlerCtx{Context: base}
			mu.Lock()
			cur = ctx
			mu.Unlock()
			if err := base.Err(); err != nil {
				ctx.cancel(err)
			}
			s.run(ctx, c)
			ctx.cancel(context.Canceled)
			if c = s.next(); c == nil {
				s.inflight.Add(-1)
				wake.Signal(s.freed)
				c = s.take(false)
			}
		}
		s.idleMu.Lock()
		if s.idleClosed {
			s.idleMu.Unlock()
			return
		}
		s.idle = append(s.idle, idler{me, time.Now()})
		s.idleMu.Unlock()
		if !await(me) { // idle too long, or the subscription stops
			return
		}
		sent = true
	}
}

// parkedStack is the stack an idle worker keeps in use while it waits
// for its next claim (await). The garbage collector halves the stack of a
// goroutine that uses less than a quarter of it, and a worker's stack is
// as deep as its handlers go (an instrumented handler's tracing SDK, an
// HTTP client): without it, every collection cycle would halve the stacks
// of the idle workers and their next deliveries would copy them back up,
// once per worker per cycle. With it a worker keeps a stack of up to four
// times this.
const parkedStack = 4 << 10

// await waits, in a frame of parkedStack bytes, to be sent to the queue
// (true) or ended (false).
//
//go:noinline
func await(me chan bool) bool {
	var frame [parkedStack]byte
	inUse(&frame)
	return <-me
}

// inUse keeps frame on the stack: the compiler cannot drop it.
//
//go:noinline
func inUse(frame *[parkedStack]byte) { frame[0] = 1 }

// idler is an idle worker's channel and when it went idle.
type idler struct {
	c     chan bool
	since time.Time
}

// trimIdle ends the workers idle for longer than idleWorker, every half
// of it, until claims stop. The first idle are the first in the list.
func (s *Subscription) trimIdle() {
	t := time.NewTicker(idleWorker / 2)
	defer t.Stop()
	for {
		select {
		case <-s.claimCtx.Done():
			return
		case <-t.C:
		}
		old := time.Now().Add(-idleWorker)
		s.idleMu.Lock()
		n := 0
		for n < len(s.idle) && s.idle[n].since.Before(old) {
			s.idle[n].c <- false
			n++
		}
		s.idle = s.idle[n:]
		s.idleMu.Unlock()
	}
}

// closeIdle ends the idle workers once claims have stopped, and no worker
// goes idle again: the queue's last claims are taken by the workers that
// are busy or on their way.
func (s *Subscription) closeIdle() {
	s.idleMu.Lock()
	defer s.idleMu.Unlock()
	s.idleClosed = true
	for _, w := range s.idle {
		w.c <- false
	}
	s.idle = nil
}

// run runs the handler of c with ctx, which is cancelled when the claim's
// hold is lost, and records the outcome. Completions the form answers
// later (it writes them in batches) free the handler at once, so claims go
// on meanwhile; beyond Concurrency of them, each counts as a busy handler
// until it is answered (busy).
func (s *Subscription) run(ctx *handlerCtx, c core.Claim) {
	d := &Delivery{row: c.Row(), claim: c, table: &s.table}
	c.OnLost(func() { ctx.cancel(context.Canceled) })
	err := s.call(ctx, d)
	o, note := s.outcome(d, err)
	if o.Kind == Retry || o.Kind == Dead {
		s.fails.failed(d, o, note)
	}
	cctx := s.completeBy.get()
	s.pending.Add(1)
	s.queued.Add(1)
	c.Complete(cctx, o, func(cerr error) {
		s.record(d, o, cerr)
		if s.pending.Add(-1) >= int64(s.p.Concurrency) {
			// One of the completions beyond Concurrency: a handler's
			// worth of room for the claim loops (busy).
			wake.Signal(s.freed)
		}
		s.queued.Done()
	})
}

// busy is how many handlers the claim loops count as taken: those running
// or reserved by a claim in progress, and one for each completion the form
// has not answered beyond Concurrency. So the rows a subscription holds,
// in handlers and in completions not yet written, are at most twice
// Concurrency, and no handler waits for its own completion: a worker
// that did would keep its goroutine parked, and the next rows would wake
// another.
func (s *Subscription) busy() int64 {
	return s.inflight.Load() + s.reserved.Load() + max(0, s.pending.Load()-int64(s.p.Concurrency))
}

// record counts and logs a delivery's completion.
func (s *Subscription) record(d *Delivery, o Outcome, cerr error) {
	switch {
	case cerr == nil:
		switch o.Kind {
		case Succeeded:
			s.succeeded.Add(1)
		case Retry:
			s.retried.Add(1)
		case Dead:
			s.dead.Add(1)
		case Released:
			s.released.Add(1)
		case Snoozed:
			s.snoozed.Add(1)
		}
	case errors.Is(cerr, ErrLeaseLost):
		s.lost.Add(1)
		s.log.Warn("sqlxbroker: lease lost before completion", "table", s.table.Name, "id", d.ID(), "outcome", o.Kind.String())
	default:
		s.completeErrs.Add(1)
		s.log.Error("sqlxbroker: completion failed", "table", s.table.Name, "id", d.ID(), "outcome", o.Kind.String(), "err", cerr)
	}
	if s.p.OnOutcome != nil {
		s.p.OnOutcome(d, o, cerr)
	}
}

// call runs the handler, turning a panic into an error.
func (s *Subscription) call(ctx context.Context, d *Delivery) (err error) {
	defer func() {
		if r := recover(); r != nil {
			s.panics.Add(1)
			err = &PanicError{Value: r, Stack: debug.Stack()}
		}
	}()
	return s.h(ctx, d)
}

// outcome decides what the handler's result does to the row, and says
// why an outcome error could not have its way (a column it needs missing).
func (s *Subscription) outcome(d *Delivery, err error) (Outcome, string) {
	t := &s.table
	if err == nil {
		return Outcome{Kind: Succeeded}, ""
	}
	if s.hardCtx.Err() != nil {
		return Outcome{Kind: Released, Err: err}, ""
	}
	var note string
	if delay, ok := asSnooze(err); ok {
		if t.ReadyAt != "" {
			return Outcome{Kind: Snoozed, RetryAt: core.Now().Add(delay), Err: err}, ""
		}
		note = "Snooze needs a ReadyAt column: retried as a failure"
	}
	if asPermanent(err) {
		if t.DeadAt != "" {
			return Outcome{Kind: Dead, Err: err}, ""
		}
		note = "Permanent needs a DeadAt column: retried as a failure"
	}
	if t.MaxAttempts > 0 && d.Attempt() >= t.MaxAttempts {
		return Outcome{Kind: Dead, Err: err}, note
	}
	o := Outcome{Kind: Retry, Err: err}
	delay, after := asRetryAfter(err)
	switch {
	case t.ReadyAt == "" && after:
		note = "RetryAfter needs a ReadyAt column: retried at once"
	case t.ReadyAt == "":
	case after:
		o.RetryAt = core.Now().Add(delay)
	default:
		o.RetryAt = core.Now().Add(s.p.RetryDelay(d.Attempt(), err))
	}
	return o, note
}
