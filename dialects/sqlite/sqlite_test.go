package sqlite_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/core"
	"github.com/sqlxbroker/sqlxbroker/dialects/sqlite"
)

var advTable = sqlxbroker.Table{Name: "adv", AdvisoryLock: "acct-{acct}"}

// TestSecondProcessRefused: advisory keys live in one process per database
// file, so a second process subscribing to the same file in the advisory
// form is refused, and accepted once the first is gone.
func TestSecondProcessRefused(t *testing.T) {
	if path := os.Getenv("SQLXBROKER_ADVISORY_CHILD"); path != "" {
		holdAdvisory(path)
		return
	}
	path := filepath.Join(t.TempDir(), "two.db")
	db, err := sqlite.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	b, _ := sqlxbroker.Open(db)
	if err := b.CreateTable(context.Background(), advTable, [2]string{"acct", "text"}); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestSecondProcessRefused$")
	cmd.Env = append(os.Environ(), "SQLXBROKER_ADVISORY_CHILD="+path)
	out, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "ATTACHED") {
		t.Fatalf("child: %q %v", line, err)
	}
	h := func(context.Context, *sqlxbroker.Delivery) error { return nil }
	_, err = b.Subscribe(context.Background(), advTable, h, sqlxbroker.SubscribeParams{})
	if !errors.Is(err, sqlxbroker.ErrAdvisoryConflict) {
		t.Fatalf("second process subscribed in the advisory form: err = %v, want ErrAdvisoryConflict", err)
	}
	if !strings.Contains(err.Error(), "one process per file") {
		t.Errorf("error %q does not say why", err)
	}
	// The lease form needs no process-wide keys and is not refused.
	lease := sqlxbroker.Table{Name: "lease", LockedUntil: "locked_until"}
	if err := b.CreateTable(context.Background(), lease); err != nil {
		t.Fatal(err)
	}
	s, err := b.Subscribe(context.Background(), lease, h, sqlxbroker.SubscribeParams{})
	if err != nil {
		t.Fatalf("lease form refused while another process holds the advisory keys: %v", err)
	}
	_ = s.Stop(context.Background())

	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	s, err = b.Subscribe(context.Background(), advTable, h, sqlxbroker.SubscribeParams{})
	if err != nil {
		t.Fatalf("advisory form refused after the other process died: %v", err)
	}
	_ = s.Stop(context.Background())
}

func holdAdvisory(path string) {
	db, err := sqlite.Open(path)
	if err == nil {
		b, _ := sqlxbroker.Open(db)
		_, err = b.Subscribe(context.Background(), advTable, func(context.Context, *sqlxbroker.Delivery) error { return nil }, sqlxbroker.SubscribeParams{})
	}
	if err != nil {
		fmt.Println("ERROR", err)
		os.Exit(3)
	}
	fmt.Println("ATTACHED")
	time.Sleep(time.Hour)
}

// TestBusyTimeoutRequired: a DSN that turns the busy timeout off is refused with a
// message that says what to add.
func TestBusyTimeoutRequired(t *testing.T) {
	db, err := sqlxOpen("file:" + filepath.Join(t.TempDir(), "nobusy.db") + "?_pragma=busy_timeout(0)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	b, _ := sqlxbroker.Open(db)
	tb := sqlxbroker.Table{Name: "jobs", LockedUntil: "locked_until"}
	if err := b.CreateTable(context.Background(), tb); err != nil {
		t.Fatal(err)
	}
	_, err = b.Subscribe(context.Background(), tb, func(context.Context, *sqlxbroker.Delivery) error { return nil }, sqlxbroker.SubscribeParams{})
	if err == nil || !strings.Contains(err.Error(), "busy_timeout") {
		t.Fatalf("subscribe without a busy timeout: %v, want an error naming busy_timeout", err)
	}
}

// TestRowLockUnavailable: SQLite has no row locks.
func TestRowLockUnavailable(t *testing.T) {
	db, err := sqlite.Open(filepath.Join(t.TempDir(), "rl.db"))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := sqlxbroker.Open(db)
	_, err = b.Subscribe(context.Background(), sqlxbroker.Table{Name: "jobs"}, func(context.Context, *sqlxbroker.Delivery) error { return nil }, sqlxbroker.SubscribeParams{})
	var fe *sqlxbroker.FormError
	if !errors.Is(err, sqlxbroker.ErrFormUnavailable) || !errors.As(err, &fe) || fe.Form != sqlxbroker.RowLock {
		t.Fatalf("row-lock table on SQLite: %v, want a *FormError for the row-lock form", err)
	}
}

// TestUnlockOutOfTime: a key is released even by a completion whose context
// has ended: the keys live in the process, and one left held would keep its
// rows from every later claim.
func TestUnlockOutOfTime(t *testing.T) {
	db, err := sqlite.Open(filepath.Join(t.TempDir(), "unlock.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	a, err := db.Connx(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := db.Connx(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	d := sqlite.Dialect{}
	pool := core.NewPool(db, d)
	defer pool.Close()
	try := func(ctx context.Context, conn *sqlx.Conn) bool {
		t.Helper()
		ok, err := d.TryAdvisoryLocks(ctx, &core.AdvisoryParams{Pool: pool, Conn: conn, Keys: []string{"k"}})
		if err != nil {
			t.Fatalf("lock k: %v", err)
		}
		return ok[0]
	}
	if !try(ctx, a) {
		t.Fatal("k could not be locked")
	}
	if try(ctx, b) {
		t.Fatal("k locked twice")
	}
	done, cancel := context.WithCancel(ctx)
	cancel()
	if err := d.AdvisoryUnlocks(done, &core.AdvisoryParams{Pool: pool, Conn: a, Keys: []string{"k"}}); err != nil {
		t.Errorf("unlock with an ended context: %v", err)
	}
	if !try(ctx, b) {
		t.Errorf("after the unlock, k cannot be locked again")
	}
}
