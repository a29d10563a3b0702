package bench

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/sqlxbroker/sqlxbroker"
)

// Sample is one interval of a steady run (Config.Interval).
type Sample struct {
	At        float64 `json:"at_s"`      // the interval's end, seconds from the steady phase's start
	Published int64   `json:"published"` // steady messages published in the interval
	Delivered int64   `json:"delivered"` // steady messages handled in the interval
	PerSecond float64 `json:"deliveries_per_sec"`
	P50Ms     float64 `json:"p50_ms"` // publish-to-handler of the interval's steady messages
	P99Ms     float64 `json:"p99_ms"`
	Behind    int64   `json:"behind"`                 // steady messages published and not yet handled, at the end
	Backlog   int64   `json:"backlog_left,omitempty"` // backlog rows not yet handled
	// The table, as the server tells it: PostgreSQL pg_stat_user_tables
	// (n_live_tup, n_dead_tup, updated by the statistics system within a
	// second or so) and pg_total_relation_size; MariaDB
	// information_schema.tables (table_rows and data_length +
	// index_length, estimates InnoDB refreshes as rows change) and, for
	// DeadRows, the InnoDB history list length (undo records not yet
	// purged, over the whole server). -1: not known.
	LiveRows int64   `json:"live_rows"`
	DeadRows int64   `json:"dead_rows"`
	TableMB  float64 `json:"table_mb"`
	Vacuums  int64   `json:"vacuums,omitempty"` // PostgreSQL: (auto)vacuums of the table so far
	// HOTShare is PostgreSQL's share of the table's row updates so far
	// that were heap-only (n_tup_hot_upd / n_tup_upd): claims and
	// renewals that found room on their page and wrote no index entry.
	HOTShare float64 `json:"hot_share,omitempty"`
	HeapMB   float64 `json:"heap_mb"`          // this process's Go heap in use
	RSSMB    float64 `json:"rss_mb"`           // this process's resident set
	Pruned   int64   `json:"pruned,omitempty"` // rows pruned so far (Config.PruneEvery)
}

// Window is what a steady run measured over a span of its samples.
type Window struct {
	From      float64 `json:"from_s"`
	To        float64 `json:"to_s"`
	PerSecond float64 `json:"deliveries_per_sec"`
	P50Ms     float64 `json:"p50_ms"`
	P99Ms     float64 `json:"p99_ms"`
	DeadRows  int64   `json:"dead_rows_max"`
	TableMB   float64 `json:"table_mb_max"`
	RSSMB     float64 `json:"rss_mb_max"`
	HeapMB    float64 `json:"heap_mb_max"`
}

// steadyMessage is a steady message of a prioritized table.
type steadyMessage struct {
	Acct  string `db:"acct"`
	PubNS int64  `db:"pub_ns"`
	Prio  int    `db:"prio"`
}

// steady publishes c.Rate messages per second for c.Duration from a
// second broker (its own pool, as another process would publish) and
// measures publish-to-handler latency. Messages due together are published
// in one statement (one at a time up to about 1,000 a second), so the rate
// holds at tens of thousands a second. With c.Backlog the table is first
// filled with older rows; with c.Interval the run is sampled; with
// c.PruneEvery done rows are pruned; with c.HoldTx a transaction stays
// open throughout.
func steady(ctx context.Context, c Config, b *sqlxbroker.Broker, t sqlxbroker.Table, r *Result) error {
	if c.Backlog > 0 {
		c.Logf("filling a backlog of %d rows", c.Backlog)
		if err := fillRows(ctx, &c, b, t, c.Backlog, false); err != nil {
			return fmt.Errorf("bench: backlog: %w", err)
		}
		r.BacklogRows = c.Backlog
	}
	db, err := open(c)
	if err != nil {
		return err
	}
	defer db.Close()
	sb := sqlxbroker.OpenDialect(db, c.Dialect)
	st := newServerStats(ctx, b.DB(), t.Name)
	r.Autovacuum = st.autovacuum(ctx)

	var lat hist
	var got, backlogGot atomic.Int64
	var begin time.Time
	var backlogDrained atomic.Int64 // ns after begin
	h := func(ctx context.Context, d *sqlxbroker.Delivery) error {
		var m message
		if err := d.Scan(&m); err != nil {
			return err
		}
		if m.PubNS == 0 {
			if backlogGot.Add(1) == int64(c.Backlog) {
				backlogDrained.Store(int64(time.Since(begin)))
			}
			return nil
		}
		lat.Record(time.Since(time.Unix(0, m.PubNS)))
		got.Add(1)
		return nil
	}
	p := sqlxbroker.SubscribeParams{Concurrency: c.Concurrency, BatchSize: c.BatchSize, Logger: quiet()}
	h, p = c.wrap(t, h, p)

	var held *sqlx.Tx
	if c.HoldTx {
		if held, err = st.hold(ctx, b.DB(), t.Name); err != nil {
			return err
		}
		defer held.Rollback()
		c.Logf("holding a transaction open for the run")
	}

	w := startWatch(db, c)
	begin = time.Now()
	s, err := sb.Subscribe(ctx, t, h, p)
	if err != nil {
		w.end(r)
		return err
	}
	defer s.Stop(context.Background())

	var pruned atomic.Int64
	var pruneErr error
	var bg sync.WaitGroup
	stopBg := make(chan struct{})
	if c.PruneEvery > 0 {
		bg.Add(1)
		go func() {
			defer bg.Done()
			tk := time.NewTicker(c.PruneEvery)
			defer tk.Stop()
			for {
				select {
				case <-stopBg:
					return
				case <-tk.C:
				}
				n, err := b.Prune(ctx, t, sqlxbroker.PruneParams{OlderThan: c.PruneAge})
				pruned.Add(n)
				if err != nil && pruneErr == nil {
					pruneErr = err
				}
			}
		}()
	}
	var sent atomic.Int64
	var samples []Sample
	var snaps []*[nBuckets]int64 // the latency histogram at each sample
	if c.Interval > 0 {
		snaps = append(snaps, lat.snapshot())
		bg.Add(1)
		go func() {
			defer bg.Done()
			tk := time.NewTicker(c.Interval)
			defer tk.Stop()
			var lastSent, lastGot int64
			for {
				select {
				case <-stopBg:
					return
				case <-tk.C:
				}
				snap := lat.snapshot()
				s := Sample{At: time.Since(begin).Seconds(), Pruned: pruned.Load()}
				ns, ng := sent.Load(), got.Load()
				s.Published, s.Delivered, s.Behind = ns-lastSent, ng-lastGot, ns-ng
				lastSent, lastGot = ns, ng
				s.PerSecond = float64(s.Delivered) / c.Interval.Seconds()
				s.P50Ms = quantileOf(snaps[len(snaps)-1], snap, 0.50).Seconds() * 1000
				s.P99Ms = quantileOf(snaps[len(snaps)-1], snap, 0.99).Seconds() * 1000
				if c.Backlog > 0 {
					s.Backlog = int64(c.Backlog) - backlogGot.Load()
				}
				s.LiveRows, s.DeadRows, s.TableMB, s.Vacuums, s.HOTShare = st.read(ctx)
				s.HeapMB, s.RSSMB = memory()
				samples = append(samples, s)
				snaps = append(snaps, snap)
				c.Logf("%6.0fs  %8.0f/s  p50 %6.2f ms  p99 %7.2f ms  behind %6d  backlog %7d  live %9d  dead %9d  %8.1f MB  vacuums %d  hot %.2f  heap %6.1f MB  rss %6.1f MB  pruned %d",
					s.At, s.PerSecond, s.P50Ms, s.P99Ms, s.Behind, s.Backlog, s.LiveRows, s.DeadRows, s.TableMB, s.Vacuums, s.HOTShare, s.HeapMB, s.RSSMB, s.Pruned)
			}
		}()
	}

	// The messages are due from now on, once the subscription has
	// started, not from begin: the messages due while Subscribe ran would
	// go out in one statement, a burst the handlers take one after
	// another rather than a steady rate.
	sched := time.Now()
	r.SubscribeMs = float64(sched.Sub(begin).Microseconds()) / 1000
	c.Logf("subscribed in %.1f ms; publishing %d/s for %v", r.SubscribeMs, c.Rate, c.Duration)
	var pubErr error
	msgs := make([]any, 0, 1000)
	// Rate x Duration messages in all: those due by now (the first at
	// once), so a publish that took long is caught up by the next one,
	// the last included; sleep until the next is due when none is.
	total := int64(float64(c.Rate) * c.Duration.Seconds())
	for i := 0; int64(i) < total; {
		el := time.Since(sched)
		due := min(int64(float64(c.Rate)*el.Seconds())+1, total) - int64(i)
		if due <= 0 {
			next := time.Duration(float64(i) / float64(c.Rate) * float64(time.Second))
			time.Sleep(next - el)
			continue
		}
		msgs = msgs[:0]
		now := time.Now().UnixNano()
		for range min(due, 1000) {
			acct := strconv.Itoa(i % c.Keys)
			if c.Prioritized {
				msgs = append(msgs, steadyMessage{Acct: acct, PubNS: now, Prio: 1})
			} else {
				msgs = append(msgs, message{Acct: acct, PubNS: now})
			}
			i++
		}
		pctx, end := c.publishCtx(ctx)
		err := b.Publish(pctx, b.DB(), t, msgs...)
		end()
		if err != nil {
			pubErr = fmt.Errorf("bench: publish: %w", err)
			break
		}
		sent.Add(int64(len(msgs)))
	}
	published := time.Since(begin)
	deadline := time.Now().Add(30 * time.Second)
	for (got.Load() < sent.Load() || backlogGot.Load() < int64(c.Backlog)) && time.Now().Before(deadline) && pubErr == nil {
		time.Sleep(time.Millisecond)
	}
	elapsed := time.Since(begin)
	close(stopBg)
	bg.Wait()
	_ = s.Stop(context.Background())
	w.end(r)
	if pubErr != nil {
		return pubErr
	}
	if pruneErr != nil {
		return fmt.Errorf("bench: prune: %w", pruneErr)
	}
	fillResult(r, s.Stats(), &lat)
	r.Rows = int(sent.Load())
	r.Deliveries = got.Load()
	w.perDelivery(r)
	r.Seconds = elapsed.Seconds()
	r.PerSecond = float64(r.Deliveries) / r.Seconds
	r.Pruned = pruned.Load()
	if d := backlogDrained.Load(); d > 0 {
		r.BacklogDrained = time.Duration(d).Seconds()
	}
	r.Samples = samples
	r.First, r.Last = windows(samples, snaps, published.Seconds())
	if r.Deliveries < int64(r.Rows) {
		return &UndeliveredError{What: "published messages", Left: int64(r.Rows) - r.Deliveries, Total: int64(r.Rows)}
	}
	if n := backlogGot.Load(); n < int64(c.Backlog) {
		return &UndeliveredError{What: "backlog rows", Left: int64(c.Backlog) - n, Total: int64(c.Backlog)}
	}
	return nil
}

// windows returns the first and last five minutes of the samples taken
// while messages were published (a fifth of that time each, when it is
// shorter than 25 minutes); nil without samples.
func windows(samples []Sample, snaps []*[nBuckets]int64, published float64) (first, last *Window) {
	n := 0
	for n < len(samples) && samples[n].At <= published+0.5 {
		n++
	}
	if n == 0 {
		return nil, nil
	}
	span := min(300, published/5)
	var i0, i1 int // first: samples [0, i0); last: samples [i1, n)
	for i0 < n && samples[i0].At <= span+0.5 {
		i0++
	}
	i1 = n
	for i1 > 0 && samples[i1-1].At > samples[n-1].At-span+0.5 {
		i1--
	}
	return window(samples, snaps, 0, max(i0, 1)), window(samples, snaps, min(i1, n-1), n)
}

// window sums samples [i, j): snaps[k] is the histogram before sample k.
func window(samples []Sample, snaps []*[nBuckets]int64, i, j int) *Window {
	w := &Window{To: samples[j-1].At}
	if i > 0 {
		w.From = samples[i-1].At
	}
	var delivered int64
	for _, s := range samples[i:j] {
		delivered += s.Delivered
		w.DeadRows = max(w.DeadRows, s.DeadRows)
		w.TableMB = max(w.TableMB, s.TableMB)
		w.RSSMB = max(w.RSSMB, s.RSSMB)
		w.HeapMB = max(w.HeapMB, s.HeapMB)
	}
	w.PerSecond = float64(delivered) / (w.To - w.From)
	w.P50Ms = quantileOf(snaps[i], snaps[j], 0.50).Seconds() * 1000
	w.P99Ms = quantileOf(snaps[i], snaps[j], 0.99).Seconds() * 1000
	return w
}

// snapshot copies the histogram's buckets.
func (h *hist) snapshot() *[nBuckets]int64 {
	var out [nBuckets]int64
	for i := range h.buckets {
		out[i] = h.buckets[i].Load()
	}
	return &out
}

// quantileOf is the q-quantile of what was recorded between snapshots a
// and b; 0 when nothing was.
func quantileOf(a, b *[nBuckets]int64, q float64) time.Duration {
	var n int64
	for i := range b {
		n += b[i] - a[i]
	}
	if n == 0 {
		return 0
	}
	rank := int64(float64(n)*q + 0.999999)
	var seen int64
	for i := range b {
		seen += b[i] - a[i]
		if seen >= rank {
			return upper(i)
		}
	}
	return upper(nBuckets - 1)
}

// memory returns this process's Go heap in use and resident set, in MB.
func memory() (heap, rss float64) {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return float64(ms.HeapInuse) / (1 << 20), float64(procStatusKB("VmRSS:")) / 1024
}

// serverStats reads what the server tells of a table: which server it
// is, found by asking.
type serverStats struct {
	db    *sqlx.DB
	table string
	kind  string // "postgres", "mysql" or "" (nothing known)
}

func newServerStats(ctx context.Context, db *sqlx.DB, table string) *serverStats {
	s := &serverStats{db: db, table: table}
	var one int
	// As the contention sampler of RunProcs asks: pg_stat_activity always
	// has the asking session's row.
	if db.QueryRowContext(ctx, "SELECT 1 FROM pg_stat_activity LIMIT 1").Scan(&one) == nil {
		s.kind = "postgres"
	} else if db.QueryRowContext(ctx, "SELECT count(*) FROM information_schema.innodb_metrics").Scan(&one) == nil {
		s.kind = "mysql"
	}
	return s
}

// read returns the table's live and dead rows, its size in MB, its
// vacuums so far and the share of its updates that were heap-only; -1
// (and 0 MB) where the server tells nothing.
func (s *serverStats) read(ctx context.Context) (live, dead int64, mb float64, vacuums int64, hot float64) {
	live, dead = -1, -1
	var bytes sql.NullInt64
	switch s.kind {
	case "postgres":
		_ = s.db.QueryRowContext(ctx, `SELECT n_live_tup, n_dead_tup, pg_total_relation_size(relid),
  coalesce(autovacuum_count, 0) + coalesce(vacuum_count, 0),
  CASE WHEN n_tup_upd > 0 THEN n_tup_hot_upd::float8 / n_tup_upd ELSE 0 END
FROM pg_stat_user_tables WHERE relname = $1`, s.table).Scan(&live, &dead, &bytes, &vacuums, &hot)
	case "mysql":
		var rows sql.NullInt64
		_ = s.db.QueryRowContext(ctx, `SELECT table_rows, data_length + index_length FROM information_schema.tables
WHERE table_schema = DATABASE() AND table_name = ?`, s.table).Scan(&rows, &bytes)
		if rows.Valid {
			live = rows.Int64
		}
		_ = s.db.QueryRowContext(ctx, `SELECT count FROM information_schema.innodb_metrics WHERE name = 'trx_rseg_history_len'`).Scan(&dead)
	}
	return live, dead, float64(bytes.Int64) / (1 << 20), vacuums, hot
}

// autovacuum returns PostgreSQL's autovacuum setting ("on" or "off"), ""
// elsewhere: with it off, nothing removes the dead rows of a table that
// nobody vacuums.
func (s *serverStats) autovacuum(ctx context.Context) string {
	var v string
	if s.kind == "postgres" {
		_ = s.db.QueryRowContext(ctx, "SHOW autovacuum").Scan(&v)
	}
	return v
}

// hold begins a transaction that holds back the server's cleanup of dead
// row versions until it ends: on PostgreSQL one with a transaction id
// (the oldest xmin then stays), on MariaDB a consistent snapshot (purge
// then keeps the undo of every later change).
func (s *serverStats) hold(ctx context.Context, db *sqlx.DB, table string) (*sqlx.Tx, error) {
	tx, err := db.BeginTxx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead})
	if err != nil {
		return nil, fmt.Errorf("bench: hold a transaction: %w", err)
	}
	var q string
	switch s.kind {
	case "postgres":
		q = "SELECT txid_current()"
	case "mysql":
		q = "SELECT COUNT(*) FROM " + table
	default:
		tx.Rollback()
		return nil, errors.New("bench: a held transaction needs PostgreSQL or MariaDB/MySQL")
	}
	var n int64
	if err := tx.QueryRowContext(ctx, q).Scan(&n); err != nil {
		tx.Rollback()
		return nil, fmt.Errorf("bench: hold a transaction: %w", err)
	}
	return tx, nil
}
