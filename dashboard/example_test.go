package dashboard_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"

	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/dashboard"
	"github.com/sqlxbroker/sqlxbroker/dialects/sqlite"
)

// Mount the dashboard under /queues/ of an application's mux (put the
// application's own authentication around it) and read the counts.
func ExampleNew() {
	dir, _ := os.MkdirTemp("", "sqlxbroker-dashboard-example-")
	defer os.RemoveAll(dir)
	db, err := sqlite.Open(filepath.Join(dir, "app.db"))
	if err != nil {
		panic(err)
	}
	defer db.Close()
	ctx := context.Background()
	b, _ := sqlxbroker.Open(db)
	emails := sqlxbroker.Table{Name: "emails", LockedUntil: "locked_until", DeadAt: "dead_at", MaxAttempts: 5}
	if err := b.CreateTable(ctx, emails, [2]string{"to_addr", "text"}); err != nil {
		panic(err)
	}
	_ = b.Publish(ctx, db, emails, map[string]any{"to_addr": "ada@example.com"})

	h, err := dashboard.New(b, dashboard.Options{Tables: []sqlxbroker.Table{emails}}) // read-only
	if err != nil {
		panic(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/queues/", http.StripPrefix("/queues", h))

	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/queues/counts.json", nil))
	fmt.Println(rec.Code, strings.Contains(rec.Body.String(), `"ready":"1"`))
	rec = httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/queues/t/emails?state=dead", nil))
	fmt.Println(rec.Code, "(read-only)")
	// Output:
	// 200 true
	// 405 (read-only)
}
