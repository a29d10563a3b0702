// Package dashboard is a web page over the broker's operations API: every
// described table's counts by state (refreshed in the page), its rows of
// each state paged by key with their attempt, last error and columns, and,
// when the mounting code enables actions, requeue and delete.
//
// New returns an http.Handler to mount in the application's own server,
// behind the application's own authentication: the dashboard has none.
// Links are relative, so it works under any prefix (http.StripPrefix):
//
//	h, err := dashboard.New(b, dashboard.Options{Tables: []sqlxbroker.Table{jobs}})
//	mux.Handle("/queues/", http.StripPrefix("/queues", requireAdmin(h)))
//
// Read-only by default: without Options.Actions the pages show no buttons
// and every POST gets 405. With Actions, requeue and delete are POST forms
// only (GET never changes anything), each carrying a token made at random
// by New and compared in constant time; a POST without it, or one a
// browser marks as cross-origin (Sec-Fetch-Site, or Origin against Host),
// gets 403.
//
// Routes, relative to the mount point: "" (the overview), "counts.json"
// (the overview's counts, which the page's script fetches every
// Options.Refresh), "t/{table}?state=dead&after={id}" (a page of rows; POST
// there with op=requeue or op=delete), and "static/" (CSS and script,
// embedded). It uses only the standard library.
package dashboard

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/sqlxbroker/sqlxbroker"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// Options configures the dashboard.
type Options struct {
	Tables   []sqlxbroker.Table // the described tables shown
	Actions  bool               // enable requeue/delete; read-only when false
	Refresh  time.Duration      // counts refresh interval in the page; default 2s
	PageSize int                // rows per list page; default 50
	Logger   *slog.Logger
}

// Defaults and limits of Options.
const (
	DefaultRefresh  = 2 * time.Second
	DefaultPageSize = 50
	MaxPageSize     = 1000 // List's limit
)

// handler is the dashboard.
type handler struct {
	b       *sqlxbroker.Broker
	o       Options
	tables  map[string]*sqlxbroker.Table
	token   string // the CSRF token, per handler
	log     *slog.Logger
	pages   *template.Template
	static  http.Handler
	origins *http.CrossOriginProtection
}

// New checks o and returns the dashboard for b's tables o.Tables. Each
// table's description must validate and compile for b's dialect, and names
// must be unique; the error names the table and the problem. The live
// tables are not read here: a table that is missing or lacks a column shows
// its error in the page.
func New(b *sqlxbroker.Broker, o Options) (http.Handler, error) {
	if b == nil {
		return nil, errors.New("dashboard: nil broker")
	}
	if len(o.Tables) == 0 {
		return nil, errors.New("dashboard: Options.Tables is empty (describe at least one table)")
	}
	switch {
	case o.Refresh < 0:
		return nil, fmt.Errorf("dashboard: negative Options.Refresh %v", o.Refresh)
	case o.Refresh == 0:
		o.Refresh = DefaultRefresh
	case o.Refresh < 100*time.Millisecond:
		return nil, fmt.Errorf("dashboard: Options.Refresh %v is below 100ms", o.Refresh)
	}
	switch {
	case o.PageSize < 0 || o.PageSize > MaxPageSize:
		return nil, fmt.Errorf("dashboard: Options.PageSize %d is out of range (1 to %d; 0 for %d)", o.PageSize, MaxPageSize, DefaultPageSize)
	case o.PageSize == 0:
		o.PageSize = DefaultPageSize
	}
	h := &handler{b: b, o: o, tables: map[string]*sqlxbroker.Table{}, log: o.Logger}
	if h.log == nil {
		h.log = slog.Default()
	}
	o.Tables = append([]sqlxbroker.Table(nil), o.Tables...) // the caller's slice stays theirs
	h.o.Tables = o.Tables
	for i := range o.Tables {
		t := &o.Tables[i]
		if _, err := b.Plan(*t); err != nil {
			return nil, fmt.Errorf("dashboard: Options.Tables[%d] (%q): %w", i, t.Name, err)
		}
		if _, dup := h.tables[t.Name]; dup {
			return nil, fmt.Errorf("dashboard: Options.Tables[%d]: table %q is described twice", i, t.Name)
		}
		h.tables[t.Name] = t
	}
	var raw [32]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return nil, fmt.Errorf("dashboard: CSRF token: %w", err)
	}
	h.token = hex.EncodeToString(raw[:])
	var err error
	h.pages, err = template.New("").Funcs(funcs).ParseFS(templateFS, "templates/*.html")
	if err != nil {
		return nil, fmt.Errorf("dashboard: templates: %w", err)
	}
	sub, _ := fs.Sub(staticFS, "static")
	h.static = http.StripPrefix("/static", http.FileServerFS(sub))
	h.origins = http.NewCrossOriginProtection()
	return h, nil
}

// ServeHTTP routes a request by its path below the mount point.
func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hd := w.Header()
	hd.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("Referrer-Policy", "same-origin")
	hd.Set("X-Frame-Options", "DENY")
	p := r.URL.Path
	switch {
	case p == "":
		// Mounted at "/x" and asked for "/x": the relative links need "/x/".
		h.redirectToDir(w, r)
	case p == "/":
		if h.onlyGet(w, r) {
			h.overview(w, r)
		}
	case p == "/counts.json":
		if h.onlyGet(w, r) {
			h.countsJSON(w, r)
		}
	case strings.HasPrefix(p, "/static/"):
		if h.onlyGet(w, r) {
			hd.Set("Cache-Control", "public, max-age=300")
			h.static.ServeHTTP(w, r)
		}
	case strings.HasPrefix(p, "/t/") && !strings.Contains(p[len("/t/"):], "/"):
		h.tablePage(w, r, p[len("/t/"):])
	default:
		h.fail(w, r, http.StatusNotFound, fmt.Errorf("no page %q here", p))
	}
}

// redirectToDir answers a request for the mount point without its slash
// with a relative redirect to it with one.
func (h *handler) redirectToDir(w http.ResponseWriter, r *http.Request) {
	path, _, _ := strings.Cut(r.RequestURI, "?")
	last := path[strings.LastIndex(path, "/")+1:]
	target := "./"
	if last != "" {
		target = last + "/"
	}
	if r.URL.RawQuery != "" {
		target += "?" + r.URL.RawQuery
	}
	w.Header().Set("Location", target)
	w.WriteHeader(http.StatusMovedPermanently)
}

// onlyGet answers anything but GET and HEAD with 405 and reports whether
// the request may go on.
func (h *handler) onlyGet(w http.ResponseWriter, r *http.Request) bool {
	if r.Method == http.MethodGet || r.Method == http.MethodHead {
		return true
	}
	w.Header().Set("Allow", "GET, HEAD")
	h.fail(w, r, http.StatusMethodNotAllowed, fmt.Errorf("method %s not allowed here", r.Method))
	return false
}

// root is the relative path from the page at r to the mount point: "./" for
// the overview, "../" for a table page.
func root(r *http.Request) string {
	n := strings.Count(r.URL.Path, "/") - 1
	if n <= 0 {
		return "./"
	}
	return strings.Repeat("../", n)
}

// checkPost checks a POST's CSRF token and origin; false: it has answered
// 403 (or 405 when the dashboard is read-only).
func (h *handler) checkPost(w http.ResponseWriter, r *http.Request) bool {
	if !h.o.Actions {
		w.Header().Set("Allow", "GET, HEAD")
		h.fail(w, r, http.StatusMethodNotAllowed, errors.New("the dashboard is read-only (actions are not enabled)"))
		return false
	}
	if err := h.origins.Check(r); err != nil {
		h.fail(w, r, http.StatusForbidden, fmt.Errorf("refused: %v", err))
		return false
	}
	r.Body = http.MaxBytesReader(w, r.Body, 1<<20)
	if err := r.ParseForm(); err != nil {
		h.fail(w, r, http.StatusBadRequest, fmt.Errorf("bad form: %v", err))
		return false
	}
	got := r.PostForm.Get("token")
	if got == "" || subtle.ConstantTimeCompare([]byte(got), []byte(h.token)) != 1 {
		h.fail(w, r, http.StatusForbidden, errors.New("refused: the form's token is missing or wrong (reload the page and try again)"))
		return false
	}
	return true
}

// opContext bounds an operation by the request.
func opContext(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.Context(), 5*time.Minute)
}
