package dashboard_test

// The browser test drives Debian's chromium (headless) with chromedp, a
// CDP client in Go that starts the browser itself: no driver process. It
// lives in this _test.go file so that programs importing the library
// compile none of it.

import (
	"context"
	"fmt"
	"github.com/sqlxbroker/sqlxbroker/internal/testreport"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/jmoiron/sqlx"
	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/conformance/provision"
	"github.com/sqlxbroker/sqlxbroker/dashboard"
)

// Environment of the browser test.
const (
	// requireBrowser=1 (CI) makes a missing chromium a failure.
	requireBrowser = "SQLXBROKER_REQUIRE_BROWSER"
	// screenshotDir, when set, receives dashboard.png (the overview) and
	// dashboard-dead.png (a dead list) from the SQLite run: set it to docs/
	// to regenerate the screenshots there.
	screenshotDir = "SQLXBROKER_SCREENSHOT_DIR"
	// chromiumEnv names the browser binary when it is not chromium on PATH.
	chromiumEnv = "SQLXBROKER_CHROMIUM"
)

// chromium returns the browser's path, or skips (fails under
// SQLXBROKER_REQUIRE_BROWSER=1) saying how to get one.
func chromium(t *testing.T) string {
	t.Helper()
	if p := os.Getenv(chromiumEnv); p != "" {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("%s=%q: %v", chromiumEnv, p, err)
		}
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			testreport.Tested(t, "Chromium (the dashboard's browser test)", p)
			return p
		}
	}
	msg := "no chromium on PATH: install it (Debian: apt-get install -y chromium) or set " + chromiumEnv + " to a Chrome or Chromium binary"
	if os.Getenv(requireBrowser) == "1" {
		t.Fatalf("%s; %s=1 forbids skipping", msg, requireBrowser)
	}
	testreport.Skip(t, "Chromium (the dashboard's browser test)", msg)
	return ""
}

// TestBrowser loads the dashboard in headless chromium on SQLite and on
// PostgreSQL: the counts appear and follow the table without a reload; the
// dead list shows the dead rows with their last error; a click on requeue
// makes the row ready, and the counts say so.
func TestBrowser(t *testing.T) {
	path := chromium(t)
	for _, be := range []backend{
		{"sqlite", openSQLite},
		{"postgres", func(t *testing.T) *sqlx.DB { return openDSN(t, "postgres", provision.Postgres.Get(t)) }},
	} {
		t.Run(be.name, func(t *testing.T) {
			db := be.open(t)
			b, err := sqlxbroker.Open(db)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = b.Close(context.Background()) })
			shots := ""
			if be.name == "sqlite" {
				shots = os.Getenv(screenshotDir)
			}
			browse(t, path, b, shots)
		})
	}
}

func browse(t *testing.T, path string, b *sqlxbroker.Broker, shots string) {
	emails := newTableNamed(t, b, "emails", sqlxbroker.Lease)
	reports := newTableNamed(t, b, "reports", notLease(b))
	seed(t, b, emails, sqlxbroker.StateReady, 3, "ada@example.com", "")
	seed(t, b, emails, sqlxbroker.StateScheduled, 2, "alan@example.com", "")
	seed(t, b, emails, sqlxbroker.StateDead, 2, "grace@example.com", "smtp: 550 mailbox unavailable <grace@example.com>")
	seed(t, b, emails, sqlxbroker.StateDone, 4, "edsger@example.com", "")
	seed(t, b, reports, sqlxbroker.StateReady, 12, "monthly", "")
	seed(t, b, reports, sqlxbroker.StateDead, 1, "yearly", "render: template: no such column \"total\"")

	h, err := dashboard.New(b, dashboard.Options{Tables: []sqlxbroker.Table{emails, reports}, Actions: true,
		Refresh: 250 * time.Millisecond, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/queues/", http.StripPrefix("/queues", h))
	srv := httptest.NewServer(mux) // 127.0.0.1, a free port
	t.Cleanup(srv.Close)

	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.WindowSize(1200, 700),
	)
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancelAlloc)
	browser, cancelBrowser := chromedp.NewContext(alloc, chromedp.WithLogf(t.Logf))
	t.Cleanup(cancelBrowser)
	if err := chromedp.Do(browser); err != nil { // starts the browser, with no deadline
		t.Fatalf("start %s: %v", path, err)
	}
	ctx, cancel := context.WithTimeout(browser, 3*time.Minute)
	defer cancel()

	// waitJS waits until the page's expression is true.
	waitJS := func(what, expr string) {
		t.Helper()
		if _, err := chromedp.Run(ctx, chromedp.Poll[bool](expr, chromedp.WithPollingTimeout(60*time.Second))); err != nil {
			text, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body ? document.body.innerText : ""`))
			t.Fatalf("waiting for %s: %v\nthe page reads:\n%s", what, err, text)
		}
	}
	cellIs := func(table, cell, want string) string {
		return fmt.Sprintf(`(document.querySelector('[data-table=%q] [data-cell=%q]') || {}).textContent === %q`, table, cell, want)
	}
	overview := func(tb sqlxbroker.Table, want map[string]string) string {
		expr := "true"
		for k, v := range want {
			expr += " && " + cellIs(tb.Name, k, v)
		}
		return expr
	}
	shoot := func(name string) {
		t.Helper()
		if shots == "" {
			return
		}
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatalf("screenshot: %v", err)
		}
		if err := os.WriteFile(filepath.Join(shots, name), png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote %s", filepath.Join(shots, name))
	}

	res, err := chromedp.RunResponse(ctx, chromedp.Navigate(srv.URL+"/queues/"))
	if err != nil {
		t.Fatalf("load the overview: %v", err)
	}
	if res.Status != http.StatusOK {
		t.Fatalf("the overview answered %d", res.Status)
	}
	inWork := "—"
	if emails.Form() == sqlxbroker.Lease {
		inWork = "0"
	}
	waitJS("the overview's counts", overview(emails, map[string]string{"ready": "3", "scheduled": "2", "in-work": inWork, "dead": "2", "done": "4"})+
		" && "+overview(reports, map[string]string{"ready": "12", "dead": "1", "in-work": "—"}))
	// The script refreshes the counts: a row published now shows up without
	// a reload.
	seed(t, b, emails, sqlxbroker.StateReady, 1, "barbara@example.com", "")
	waitJS("the refreshed ready count", cellIs(emails.Name, "ready", "4")+
		` && /^counts at/.test(document.getElementById("status").textContent)`)
	shoot("dashboard.png")

	// Open the dead list from the overview's dead count.
	if _, err := chromedp.RunResponse(ctx, chromedp.Click(chromedp.CSS(fmt.Sprintf(`tr[data-table=%q] td[data-cell="dead"] a`, emails.Name)))); err != nil {
		t.Fatalf("open the dead list: %v", err)
	}
	dead := ids(t, b, emails, sqlxbroker.StateDead)
	if len(dead) != 2 {
		t.Fatalf("%d dead rows, want 2", len(dead))
	}
	waitJS("the dead rows", fmt.Sprintf(`document.querySelectorAll("#rows tr[data-id]").length === 2 && document.querySelector('tr[data-id=%q] .last-error').textContent.includes("550 mailbox unavailable <grace@example.com>")`, dead[0]))
	shoot("dashboard-dead.png")

	// Requeue the first dead row.
	res, err = chromedp.RunResponse(ctx, chromedp.Click(chromedp.CSS(fmt.Sprintf(`tr[data-id=%q] button.requeue`, dead[0]))))
	if err != nil {
		t.Fatalf("click requeue: %v", err)
	}
	if res.Status != http.StatusOK {
		t.Fatalf("after requeue the page answered %d", res.Status)
	}
	waitJS("the requeue's notice and counts", `(document.getElementById("notice") || {}).textContent === "Requeued 1 row."`+
		fmt.Sprintf(` && !document.querySelector('tr[data-id=%q]')`, dead[0])+
		" && "+cellIs(emails.Name, "dead", "1")+" && "+cellIs(emails.Name, "ready", "5"))
	if ready := ids(t, b, emails, sqlxbroker.StateReady); !slices.Contains(ready, dead[0]) {
		t.Fatalf("row %s is not ready after the click (ready: %v)", dead[0], ready)
	}

	// The ready list shows it, attempt 1 and no last error.
	if _, err := chromedp.RunResponse(ctx, chromedp.Click(chromedp.CSS(`nav.tabs a[href$="state=ready"]`))); err != nil {
		t.Fatalf("open the ready list: %v", err)
	}
	waitJS("the requeued row among the ready", fmt.Sprintf(`(function(){ var r = document.querySelector('tr[data-id=%q]'); return !!r && r.children[1].textContent === "1" && r.querySelector(".last-error").textContent === ""; })()`, dead[0]))
	// And the overview agrees.
	if _, err := chromedp.RunResponse(ctx, chromedp.Navigate(srv.URL+"/queues/")); err != nil {
		t.Fatal(err)
	}
	waitJS("the overview after the requeue", overview(emails, map[string]string{"ready": "5", "dead": "1"}))
}
