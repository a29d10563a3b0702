package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sqlxbroker/sqlxbroker"
)

// lineWriter hands the first line written to it to a channel.
type lineWriter struct {
	mu   sync.Mutex
	buf  strings.Builder
	line chan string
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	had := strings.Contains(w.buf.String(), "\n")
	w.buf.Write(p)
	if s := w.buf.String(); !had && strings.Contains(s, "\n") {
		w.line <- s[:strings.Index(s, "\n")]
	}
	return len(p), nil
}

// TestServe runs `serve` on a free loopback port: the page and the counts
// are served, and a read-only server refuses an action; with --actions an
// action without its CSRF token is refused too. Cancelling its context
// (as SIGINT does) shuts it down with no error.
func TestServe(t *testing.T) {
	opsDatabases(t, func(t *testing.T, d *opsDB) {
		tb := fill(t, d, map[sqlxbroker.State]int{sqlxbroker.StateReady: 2, sqlxbroker.StateDead: 3})
		for _, actions := range []bool{false, true} {
			args := append([]string{"--addr", "127.0.0.1:0"}, describeArgs(d, tb.Name)...)
			if actions {
				args = append(args, "--actions")
			}
			ctx, cancel := context.WithCancel(context.Background())
			out := &lineWriter{line: make(chan string, 1)}
			done := make(chan error, 1)
			go func() { done <- serveCmd(ctx, args, out, io.Discard) }()
			var base string
			select {
			case l := <-out.line:
				_, rest, ok := strings.Cut(l, "http://")
				if !ok {
					t.Fatalf("serve printed %q, want its address", l)
				}
				base = "http://" + strings.TrimSuffix(strings.Fields(rest)[0], "/")
			case err := <-done:
				t.Fatalf("serve ended before it listened: %v", err)
			case <-time.After(30 * time.Second):
				t.Fatal("serve did not print its address within 30 s")
			}
			if !strings.HasPrefix(base, "http://127.0.0.1:") {
				t.Errorf("serve listens on %s, want a loopback address", base)
			}
			page := get(t, base+"/")
			if !strings.Contains(page, tb.Name) {
				t.Errorf("the overview does not name %s", tb.Name)
			}
			var counts any
			if err := json.Unmarshal([]byte(get(t, base+"/counts.json")), &counts); err != nil {
				t.Errorf("counts.json: %v", err)
			}
			if dead := get(t, base+"/t/"+tb.Name+"?state=dead"); !strings.Contains(dead, "boom") {
				t.Errorf("the dead rows' page shows no last error")
			}
			resp, err := http.PostForm(base+"/t/"+tb.Name, url.Values{"action": {"requeue"}, "id": {"1"}})
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			want := http.StatusMethodNotAllowed
			if actions {
				want = http.StatusForbidden
			}
			if resp.StatusCode != want {
				t.Errorf("actions %v: a POST without a token answered %d, want %d", actions, resp.StatusCode, want)
			}
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("serve ended with %v after its context was cancelled", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("serve did not stop within 10 s of its context ending")
			}
		}
	})
}

func get(t *testing.T, u string) string {
	t.Helper()
	resp, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %s", u, resp.StatusCode, b)
	}
	return string(b)
}
