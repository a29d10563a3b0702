package smoke

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/dialects/sqlite"
)

func TestSmoke(t *testing.T) {
	db, err := sqlite.Open(t.TempDir() + "/x.db")
	if err != nil { t.Fatal(err) }
	b, err := sqlxbroker.Open(db)
	if err != nil { t.Fatal(err) }
	for _, tb := range []sqlxbroker.Table{
		{Name: "lease", LockedUntil: "locked_until"},
		{Name: "adv", AdvisoryLock: "acct-{account}"},
		{Name: "fifo", LockedUntil: "locked_until", Group: "grp"},
	} {
		ddl, err := b.TableDDL(tb, [2]string{"body", "text"}, [2]string{"account", "text"}, [2]string{"grp", "text"})
		if err != nil { t.Fatal(err) }
		t.Log(ddl)
		if err := b.CreateTable(context.Background(), tb, [2]string{"body", "text"}, [2]string{"account", "text"}, [2]string{"grp", "text"}); err != nil { t.Fatal(err) }
		var msgs []any
		for i := 0; i < 1000; i++ {
			msgs = append(msgs, map[string]any{"body": "x", "account": i % 7, "grp": i % 3})
		}
		if err := b.Publish(context.Background(), db, tb, msgs...); err != nil { t.Fatal(err) }
		var n atomic.Int64
		s, err := b.Subscribe(context.Background(), tb, func(ctx context.Context, d *sqlxbroker.Delivery) error {
			n.Add(1); return nil }, sqlxbroker.SubscribeParams{Concurrency: 20})
		if err != nil { t.Fatal(err) }
		start := time.Now()
		for n.Load() < 1000 && time.Since(start) < 20*time.Second { time.Sleep(10*time.Millisecond) }
		s.Stop(context.Background())
		t.Log(tb.Name, n.Load(), time.Since(start), s.Stats())
	}
}
