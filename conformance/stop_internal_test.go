package conformance

import (
	"context"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/examples/leaseonly"
)

// TestFailedScenarioStops: a scenario that fails while its handlers wait
// for a step it never took ends at once: the subscription its helper made
// is stopped with the handlers' contexts cancelled, instead of waiting for
// them for ever.
func TestFailedScenarioStops(t *testing.T) {
	path := filepath.Join(t.TempDir(), "stop.db")
	tg := Target{Dialect: leaseonly.Dialect{}, Open: func(tb TB) *sqlx.DB {
		db, err := sqlx.Open(leaseonly.DriverName, "file:"+path+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)")
		if err != nil {
			tb.Fatalf("open: %v", err)
		}
		tb.Cleanup(func() { db.Close() })
		return db
	}}
	var held, cancelled atomic.Int32
	rt := &runT{name: "failing"}
	begin := time.Now()
	rt.run(func(st TB) {
		b := tg.broker(st)
		tb := tg.fresh(st, b.DB(), sqlxbroker.Lease, nil)
		publish(st, b, tb, msg{Acct: "a"}, msg{Acct: "b"})
		subscribe(st, b, tb, func(ctx context.Context, d *sqlxbroker.Delivery) error {
			held.Add(1)
			<-ctx.Done() // waits for a release the scenario never gives
			cancelled.Add(1)
			return ctx.Err()
		}, quick)
		WaitFor(st, 10*time.Second, "both rows in work", func() bool { return held.Load() == 2 })
		st.Fatalf("a step fails while the handlers wait")
	})
	if took := time.Since(begin); took > stopLimit/2 {
		t.Errorf("the failed scenario took %v to end", took)
	}
	if rt.status() != "fail" || held.Load() != 2 {
		t.Fatalf("status %s with %d rows held, want fail with 2: %v", rt.status(), held.Load(), rt.log)
	}
	if cancelled.Load() != 2 {
		t.Errorf("%d handlers' contexts were cancelled as the failed scenario ended, want 2", cancelled.Load())
	}
}
