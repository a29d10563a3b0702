package conformance

import (
	"context"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/sqlxbroker/sqlxbroker"
)

// PoolLifecycle: brokers opened and closed one after another on one pool,
// each with a subscription (every fourth handles a row, wake-ups included),
// leave nothing behind: after 1,000 of them (100 with Short) the heap, the
// goroutines and the pool's connections in use are back where they were
// after the first few. What a dialect keeps per pool lives in the pool the
// broker owns (core.Pool), and Broker.Close releases it.
func PoolLifecycle(t TB, tg *Target, f sqlxbroker.Form) {
	db := tg.Open(t)
	db.SetMaxIdleConns(4)
	tb := tg.fresh(t, db, f, nil)
	ctx := context.Background()
	var handled atomic.Int64
	h := func(context.Context, *sqlxbroker.Delivery) error { handled.Add(1); return nil }
	round := func(i int) {
		b := sqlxbroker.OpenDialect(db, tg.Dialect)
		s, err := b.Subscribe(ctx, tb, h, quick)
		if err != nil {
			t.Fatalf("broker %d: subscribe: %v", i, err)
		}
		if i%4 == 0 {
			want := handled.Load() + 1
			publish(t, b, tb, msg{Acct: "lifecycle"})
			WaitFor(t, 10*time.Second, "the broker's row handled", func() bool { return handled.Load() >= want })
		}
		if err := b.Close(ctx); err != nil {
			t.Fatalf("broker %d: close: %v", i, err)
		}
		if _, err := b.Subscribe(ctx, tb, h, quick); err == nil {
			t.Fatalf("broker %d: a closed broker subscribed", i)
		}
		_ = s
	}
	const warm = 20
	for i := range warm {
		round(i)
	}
	// A driver may keep a goroutine per open connection (go-sql-driver's
	// watcher), and the pool keeps up to four idle ones, as many or as few
	// as the last rounds left: the goroutines are compared with the idle
	// connections' counted apart.
	heap0, g0, conns0 := settle(t, db.Stats().InUse)
	idle0 := db.Stats().Idle
	n := volume(tg, 1000, 100)
	for i := warm; i < warm+n; i++ {
		round(i)
	}
	var heap1 uint64
	var g1, conns1, idle1 int
	deadline := time.Now().Add(10 * time.Second)
	for {
		heap1, g1, conns1 = settle(t, db.Stats().InUse)
		idle1 = db.Stats().Idle
		if g1 <= g0+2+max(0, idle1-idle0) && conns1 <= conns0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %d brokers closed: goroutines %d (were %d), connections in use %d (were %d), idle %d (were %d); something a broker started outlives it:\n%s", n, g1, g0, conns1, conns0, idle1, idle0, allStacks())
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("after %d brokers: heap %d -> %d bytes, goroutines %d -> %d, connections in use %d -> %d, idle %d -> %d", n, heap0, heap1, g0, g1, conns0, conns1, idle0, idle1)
	if grown := int64(heap1) - int64(heap0); grown > 1<<20 {
		t.Errorf("the heap grew by %d bytes over %d brokers opened and closed (%d bytes each): something a broker keeps outlives it", grown, n, grown/int64(n))
	}
}

// settle collects garbage and reads the live heap, the goroutines and the
// pool's connections in use (given).
func settle(t TB, conns int) (uint64, int, int) {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc, runtime.NumGoroutine(), conns
}
