package postgres_test

import (
	"context"
	"errors"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/dialects/postgres"
)

// proxied returns a pool from postgres.Open whose connections go through a
// new tcpProxy in front of the test server, and the proxy.
func proxied(t *testing.T) (*sqlx.DB, *tcpProxy) {
	t.Helper()
	u, err := url.Parse(dsn(t))
	if err != nil || u.Host == "" {
		t.Skipf("the network-fault tests need SQLXBROKER_POSTGRES_DSN as a URL with a TCP host (postgres://user@host:port/db): %v", err)
	}
	host := u.Host
	if u.Port() == "" {
		host = net.JoinHostPort(u.Hostname(), "5432")
	}
	px := newProxy(t, host)
	u.Host = px.ln.Addr().String()
	db, err := postgres.Open(u.String())
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(20)
	db.SetMaxIdleConns(20)
	t.Cleanup(func() { db.Close() })
	return db, px
}

// TestNetworkFaults: broker A reaches the server through a proxy, broker B
// directly. A takes a row; the proxy then fails A's network: it stalls
// every byte (a partition: nothing is closed, nothing gets through), and
// for a cut also closes every connection (the server then ends A's
// sessions). B must get the row: after a cut at once, since the row lock
// or advisory lock goes with A's session; for a stalled lease when the
// lease ends, A's handler being cancelled then. A's completion must fail
// without touching the row (ErrLeaseLost for the lease and advisory
// forms), and A must work again once the network is back. (A lease is not
// lost to a cut: the renewals reconnect.) An advisory handler learns of its
// lost key at the key session's next ping, up to a second after another
// broker may have taken it.
func TestNetworkFaults(t *testing.T) {
	cases := []struct {
		form  string
		stall bool // else cut
	}{
		{"lease", true},
		{"rowlock", false},
		{"advisory", false},
	}
	for _, c := range cases {
		name := c.form + "/cut"
		if c.stall {
			name = c.form + "/stall"
		}
		t.Run(name, func(t *testing.T) {
			var fc formCase
			for _, f := range formCases {
				if f.name == c.form {
					fc = f
				}
			}
			const lease = 2 * time.Second
			tbl := fc.table(uniq("failover_net_"), lease)
			dbA, px := proxied(t)
			bA := openBroker(t, dbA)
			bB := openBroker(t, openDB(t, ""))
			createTable(t, bB, tbl)
			publish(t, bB, tbl, accounts(1, 1))
			ctx := context.Background()

			started := make(chan int64, 10)
			release := make(chan struct{})
			var mu sync.Mutex
			var cancelledAt time.Time
			var aErrs []error
			first := true
			sA, err := bA.Subscribe(ctx, tbl, func(hctx context.Context, d *sqlxbroker.Delivery) error {
				started <- d.ID().(int64)
				mu.Lock()
				wait := first
				first = false
				mu.Unlock()
				if !wait {
					return nil
				}
				select {
				case <-hctx.Done():
					mu.Lock()
					cancelledAt = time.Now()
					mu.Unlock()
				case <-release:
				}
				<-release
				return nil
			}, sqlxbroker.SubscribeParams{Concurrency: 2, PollInterval: 200 * time.Millisecond, CompleteTimeout: 20 * time.Second,
				Logger: quietLogger(&sync.Map{}),
				OnOutcome: func(_ *sqlxbroker.Delivery, _ sqlxbroker.Outcome, err error) {
					mu.Lock()
					aErrs = append(aErrs, err)
					mu.Unlock()
				}})
			if err != nil {
				t.Fatal(err)
			}
			defer sA.Stop(ctx)
			var firstID int64
			select {
			case firstID = <-started:
			case <-time.After(30 * time.Second):
				t.Fatal("A delivered nothing in 30s")
			}
			faultAt := time.Now()
			px.stall(true)
			if !c.stall {
				px.cut()
			}
			took := make(chan time.Time, 10)
			sB, err := bB.Subscribe(ctx, tbl, func(context.Context, *sqlxbroker.Delivery) error {
				took <- time.Now()
				return nil
			}, sqlxbroker.SubscribeParams{PollInterval: 100 * time.Millisecond, Logger: quietLogger(&sync.Map{})})
			if err != nil {
				t.Fatal(err)
			}
			var bAt time.Time
			select {
			case bAt = <-took:
			case <-time.After(30 * time.Second):
				t.Fatal("B did not get the row in 30s")
			}
			t.Logf("B took the row %v after the fault", bAt.Sub(faultAt).Round(time.Millisecond))
			if c.form != "rowlock" {
				// The lease ran out, or the key session was found dead:
				// A's handler is told.
				waitFor(t, 10*time.Second, "A's handler cancelled", func() bool {
					mu.Lock()
					defer mu.Unlock()
					return !cancelledAt.IsZero()
				})
				mu.Lock()
				at := cancelledAt
				mu.Unlock()
				t.Logf("A's handler cancelled %v after the fault (%v after B took the row)", at.Sub(faultAt).Round(time.Millisecond), at.Sub(bAt).Round(time.Millisecond))
				switch c.form {
				case "lease":
					// At the lease's end, by the time B can take the row (the
					// slack is for a timer that fires late on a busy host).
					if at.After(bAt.Add(time.Second)) {
						t.Errorf("A's handler was cancelled %v after B took the row", at.Sub(bAt))
					}
				case "advisory":
					// The server dropped the key with the session at once;
					// A learns it at the key session's next ping (every
					// second): B may have the key meanwhile.
					if at.Sub(faultAt) > 5*time.Second {
						t.Errorf("A's handler was cancelled %v after its key session was cut", at.Sub(faultAt))
					}
				}
			}
			px.stall(false)
			close(release)
			waitFor(t, 30*time.Second, "A's completion answered", func() bool {
				mu.Lock()
				defer mu.Unlock()
				return len(aErrs) > 0
			})
			mu.Lock()
			aErr := aErrs[0]
			mu.Unlock()
			t.Logf("A's completion: %v", aErr)
			switch {
			case aErr == nil:
				t.Fatalf("A's completion of row %d succeeded after B took the row", firstID)
			case c.form != "rowlock" && !errors.Is(aErr, sqlxbroker.ErrLeaseLost):
				t.Errorf("A's completion after B took the row: %v, want ErrLeaseLost", aErr)
			}
			// B's completion removes the row (its handler said it took it
			// before the completion committed).
			waitFor(t, 30*time.Second, "B's completion", func() bool { return count(t, bB.DB(), tbl.Name) == 0 })
			if err := sB.Stop(ctx); err != nil {
				t.Fatal(err)
			}
			// A recovers with the network.
			publish(t, bB, tbl, accounts(2, 1))
			select {
			case <-started:
			case <-time.After(30 * time.Second):
				t.Fatal("A delivered nothing in 30s after the network came back")
			}
			waitFor(t, 30*time.Second, "A's second completion", func() bool {
				mu.Lock()
				defer mu.Unlock()
				return len(aErrs) > 1 && aErrs[len(aErrs)-1] == nil
			})
		})
	}
}
