package conformance

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"time"

	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/core"
)

// orderPayload is the suite's payload with a priority column.
var orderPayload = append(append([][2]string{}, suitePayload...), [2]string{"prio", "bigint"})

// publishPrio publishes n rows with priorities 0-4 in random order and
// returns each row's position in "prio DESC, id" order, by id (read back
// with plain SQL and sorted here, not by the server's ORDER BY).
func publishPrio(t TB, tg *Target, b *sqlxbroker.Broker, tb sqlxbroker.Table, n, groups int) map[string]int {
	t.Helper()
	msgs := make([]any, n)
	for i := range msgs {
		var grp any
		if groups > 0 {
			grp = fmt.Sprint("g", i%groups)
		}
		msgs[i] = map[string]any{"acct": fmt.Sprint("p-", i), "grp": grp, "body": "x", "prio": rand.IntN(5)}
	}
	if err := b.Publish(context.Background(), b.DB(), tb, msgs...); err != nil {
		t.Fatalf("publish: %v", err)
	}
	q := tg.Dialect.QuoteIdent
	rows, err := b.DB().Query("SELECT " + q("id") + ", " + q("prio") + " FROM " + q(tb.Name))
	if err != nil {
		t.Fatalf("read back: %v", err)
	}
	defer rows.Close()
	type r struct{ id, prio int64 }
	var all []r
	for rows.Next() {
		var x r
		if err := rows.Scan(&x.id, &x.prio); err != nil {
			t.Fatalf("read back: %v", err)
		}
		all = append(all, x)
	}
	if err := rows.Err(); err != nil || len(all) != n {
		t.Fatalf("read back %d rows (%v), want %d", len(all), err, n)
	}
	sort.Slice(all, func(i, j int) bool {
		if all[i].prio != all[j].prio {
			return all[i].prio > all[j].prio
		}
		return all[i].id < all[j].id
	})
	pos := make(map[string]int, n)
	for i, x := range all {
		pos[fmt.Sprint(x.id)] = i
	}
	return pos
}

// PriorityOrder: a table ordered by "prio DESC" (the id appended as the
// last key) is delivered in that order by two brokers running one handler
// each: each broker's deliveries follow the order, and a delivery that
// started after another ended comes after it in the order (a handler runs
// 150 ms, longer than a claim takes from its candidates to the handler's
// start, so a row claimed first has started by then). With FIFO
// groups (where the dialect guards them) each group is delivered in the
// same order.
func PriorityOrder(t TB, tg *Target, f sqlxbroker.Form) {
	b1, b2 := tg.broker(t), tg.broker(t)
	tb := tg.freshWith(t, b1.DB(), f, func(tb *sqlxbroker.Table) { tb.Order = "prio DESC" }, orderPayload)
	n := volume(tg, 60, 30)
	pos := publishPrio(t, tg, b1, tb, n, 0)

	type event struct {
		broker, pos int
		start, end  int64 // of a sequence shared by both brokers
	}
	var mu sync.Mutex
	var seq int64
	var events []*event
	var twice []string
	seen := map[int]bool{}
	handler := func(broker int) sqlxbroker.Handler {
		return func(ctx context.Context, d *sqlxbroker.Delivery) error {
			mu.Lock()
			p, ok := pos[fmt.Sprint(d.ID())]
			if !ok || seen[p] {
				twice = append(twice, fmt.Sprint(d.ID()))
			}
			seen[p] = true
			seq++
			e := &event{broker: broker, pos: p, start: seq}
			events = append(events, e)
			mu.Unlock()
			time.Sleep(150 * time.Millisecond) // longer than a claim takes, on a loaded machine too: see above
			mu.Lock()
			seq++
			e.end = seq
			mu.Unlock()
			return nil
		}
	}
	p := quick
	p.Concurrency = 1
	s1 := subscribe(t, b1, tb, handler(1), p)
	s2 := subscribe(t, b2, tb, handler(2), p)
	WaitFor(t, 2*time.Minute, "every row delivered", func() bool {
		return s1.Stats().Succeeded+s2.Stats().Succeeded >= int64(n)
	})
	mu.Lock()
	defer mu.Unlock()
	if len(twice) > 0 {
		t.Errorf("rows delivered twice or unknown: %v", twice)
	}
	last := map[int]int{1: -1, 2: -1}
	for _, e := range events {
		if e.pos <= last[e.broker] {
			t.Errorf("broker %d delivered position %d after position %d (%+v)", e.broker, e.pos, last[e.broker], e)
		}
		last[e.broker] = e.pos
	}
	bad := 0
	for _, i := range events {
		for _, j := range events {
			if j.start > i.end && j.pos < i.pos {
				if bad++; bad <= 5 {
					t.Errorf("position %d started after position %d ended", j.pos, i.pos)
				}
			}
		}
	}
	if s1.Stats().Succeeded == 0 || s2.Stats().Succeeded == 0 {
		t.Logf("one broker delivered every row: %+v %+v", s1.Stats(), s2.Stats())
	}
	s1.Stop(context.Background())
	s2.Stop(context.Background())

	if core.CapabilitiesOf(tg.Dialect).GroupGuard == nil {
		return
	}
	// FIFO groups keep the same order: each group is delivered as its
	// rows come in "prio DESC, id", one at a time.
	gt := tg.freshWith(t, b1.DB(), f, func(tb *sqlxbroker.Table) { tb.Order, tb.Group = "prio DESC, id", "grp" }, orderPayload)
	const groups = 3
	gpos := publishPrio(t, tg, b1, gt, n, groups)
	byGroup := map[string][]int{}
	var gtwice []string
	gseen := map[string]bool{}
	gh := func(ctx context.Context, d *sqlxbroker.Delivery) error {
		var m msg
		if err := d.Scan(&m); err != nil {
			return err
		}
		id := fmt.Sprint(d.ID())
		mu.Lock()
		if gseen[id] {
			gtwice = append(gtwice, id)
		}
		gseen[id] = true
		byGroup[m.Grp] = append(byGroup[m.Grp], gpos[id])
		mu.Unlock()
		return nil
	}
	mu.Unlock()
	gp := quick
	gp.Concurrency = 2
	g1 := subscribe(t, b1, gt, gh, gp)
	g2 := subscribe(t, b2, gt, gh, gp)
	WaitFor(t, 2*time.Minute, "every grouped row delivered", func() bool {
		return g1.Stats().Succeeded+g2.Stats().Succeeded >= int64(n)
	})
	mu.Lock()
	if len(gtwice) > 0 {
		t.Errorf("grouped rows delivered twice: %v", gtwice)
	}
	for g, ps := range byGroup {
		for i := 1; i < len(ps); i++ {
			if ps[i] <= ps[i-1] {
				t.Errorf("group %s: position %d delivered after position %d", g, ps[i], ps[i-1])
			}
		}
	}
}
