package sqlxbrokertest_test

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/dialects/sqlite"
	"github.com/sqlxbroker/sqlxbroker/sqlxbrokertest"
)

type order struct {
	ID      int64          `db:"id"`
	Account string         `db:"account"`
	Total   int            `db:"total"`
	At      time.Time      `db:"at"`
	Note    sql.NullString `db:"note"`
	Paid    bool           `db:"paid"`
}

func TestNewDeliveryFromStruct(t *testing.T) {
	at := time.Date(2026, 3, 1, 12, 30, 0, 123456000, time.UTC)
	in := order{ID: 42, Account: "acme", Total: 1200, At: at, Note: sql.NullString{String: "rush", Valid: true}, Paid: true}
	d := sqlxbrokertest.NewDelivery(t, sqlxbrokertest.DeliveryParams{Row: in, Attempt: 3, Key: "account-acme"})
	if d.ID() != int64(42) || d.Attempt() != 3 || d.Key() != "account-acme" {
		t.Fatalf("ID %v (%T), attempt %d, key %q; want 42 (int64), 3, account-acme", d.ID(), d.ID(), d.Attempt(), d.Key())
	}
	wantCols := []string{"id", "attempt", "account", "total", "at", "note", "paid"}
	if !reflect.DeepEqual(d.Columns(), wantCols) {
		t.Errorf("columns %v, want %v", d.Columns(), wantCols)
	}
	// Values are what a driver returns.
	for col, want := range map[string]any{"id": int64(42), "attempt": int64(3), "total": int64(1200), "note": "rush", "paid": true, "at": at} {
		if v, ok := d.Value(col); !ok || !reflect.DeepEqual(v, want) {
			t.Errorf("Value(%q) = %v (%T), %v; want %v (%T)", col, v, v, ok, want, want)
		}
	}
	if _, ok := d.Value("missing"); ok {
		t.Error("Value of a column the row lacks reported ok")
	}
	var out order
	if err := d.Scan(&out); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(out, in) {
		t.Errorf("Scan = %+v, want %+v", out, in)
	}
	if _, err := d.Tx(); !errors.Is(err, sqlxbroker.ErrNoTx) {
		t.Errorf("Tx without DeliveryParams.Tx: %v, want ErrNoTx", err)
	}
}

func TestNewDeliveryFromMapWithTx(t *testing.T) {
	db, err := sqlite.Open(filepath.Join(t.TempDir(), "tx.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	tx := db.MustBegin()
	defer tx.Rollback()
	tbl := sqlxbroker.Table{ID: "job_id", Attempt: "tries"}
	d := sqlxbrokertest.NewDelivery(t, sqlxbrokertest.DeliveryParams{Table: tbl, ID: 7,
		Row: map[string]any{"email": "ada@example.com", "tries": 2}, Tx: tx})
	if d.ID() != int64(7) || d.Attempt() != 2 {
		t.Errorf("ID %v, attempt %d; want 7 and the row's 2", d.ID(), d.Attempt())
	}
	if v, _ := d.Value("job_id"); v != int64(7) {
		t.Errorf("the ID column holds %v, want 7", v)
	}
	got, err := d.Tx()
	if err != nil || got != tx {
		t.Errorf("Tx = %p, %v; want the transaction given, %p", got, err, tx)
	}
	// A handler writes through it as through a claim transaction.
	h := func(ctx context.Context, d *sqlxbroker.Delivery) error {
		tx, err := d.Tx()
		if err != nil {
			return err
		}
		var e struct {
			Email string `db:"email"`
		}
		if err := d.Scan(&e); err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, "CREATE TABLE sent (email TEXT)")
		if err == nil {
			_, err = tx.ExecContext(ctx, "INSERT INTO sent (email) VALUES (?)", e.Email)
		}
		return err
	}
	if err := h(context.Background(), d); err != nil {
		t.Fatal(err)
	}
	var email string
	if err := tx.Get(&email, "SELECT email FROM sent"); err != nil || email != "ada@example.com" {
		t.Errorf("the handler's write through Tx: %q, %v", email, err)
	}
}

func TestNewDeliveryDefaults(t *testing.T) {
	d := sqlxbrokertest.NewDelivery(t, sqlxbrokertest.DeliveryParams{})
	if d.ID() != int64(1) || d.Attempt() != 1 || d.Key() != "" || len(d.Columns()) != 2 {
		t.Errorf("zero params: ID %v, attempt %d, key %q, columns %v; want 1, 1, \"\", [id attempt]", d.ID(), d.Attempt(), d.Key(), d.Columns())
	}
}

func TestNewDeliveryRefusesBadInput(t *testing.T) {
	type bad struct {
		Tags map[string]string `db:"tags"`
	}
	f := runFake(func(t sqlxbrokertest.TB) {
		sqlxbrokertest.NewDelivery(t, sqlxbrokertest.DeliveryParams{Row: bad{}})
	})
	wantFailure(t, f, "NewDelivery", "Tags", `"tags"`)
	f = runFake(func(t sqlxbrokertest.TB) {
		sqlxbrokertest.NewDelivery(t, sqlxbrokertest.DeliveryParams{Attempt: -1})
	})
	wantFailure(t, f, "Attempt -1 is negative")
	f = runFake(func(t sqlxbrokertest.TB) {
		sqlxbrokertest.NewDelivery(t, sqlxbrokertest.DeliveryParams{Row: 5})
	})
	wantFailure(t, f, "struct or map")
}

// TestBeginTx: a handler given a fake delivery with a test transaction
// writes through it; the write is kept when the test commits and gone
// when the test leaves the transaction to its cleanup.
func TestBeginTx(t *testing.T) {
	eachDatabase(t, func(t *testing.T, _ database, b *sqlxbroker.Broker) {
		auditTable := newAudit(t, b)
		h := auditHandler(b.Dialect().QuoteIdent(auditTable), never)
		write := func(ft sqlxbrokertest.TB, tx *sqlx.Tx, n int64) {
			d := sqlxbrokertest.NewDelivery(ft, sqlxbrokertest.DeliveryParams{Row: map[string]any{"n": n}, Tx: tx})
			if err := h(context.Background(), d); err != nil {
				ft.Fatalf("handler: %v", err)
			}
		}
		f := runFake(func(ft sqlxbrokertest.TB) {
			tx := sqlxbrokertest.BeginTx(ft, b.DB())
			write(ft, tx, 1)
			if err := tx.Commit(); err != nil {
				ft.Fatalf("commit: %v", err)
			}
			// One writer at a time on SQLite: the next after the commit.
			write(ft, sqlxbrokertest.BeginTx(ft, b.DB()), 2)
		})
		if f.failed {
			t.Fatal(f.message())
		}
		if got := audits(t, b.DB(), auditTable); len(got) != 1 || got[0].Job != 1 {
			t.Errorf("audit rows %+v; want job 1's (committed) only, job 2's rolled back at cleanup", got)
		}
	})
}
