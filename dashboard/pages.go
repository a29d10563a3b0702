package dashboard

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/sqlxbroker/sqlxbroker"
)

// funcs are the templates' helpers.
var funcs = template.FuncMap{
	"cell":  cell,
	"short": func(s string) string { return shorten(s, 300) },
	"add":   func(a, b int) int { return a + b },
	"href":  func(name, st string) string { return tableHref(name, sqlxbroker.State(st)) },
}

// base is what every page's layout shows.
type base struct {
	Title   string
	Root    string // relative path to the mount point
	Refresh int64  // milliseconds
	Actions bool
	Token   string
	Error   string
	Status  int
}

// tableCounts is one table's counts as the pages and counts.json show
// them: Cells holds each state's text ("—" where the table cannot tell).
type tableCounts struct {
	Name  string            `json:"name"`
	Href  string            `json:"-"`
	Form  string            `json:"form"`
	Cells map[string]string `json:"cells"`
	// Counts are the numbers, null where the table cannot tell.
	Counts          map[string]*int64 `json:"counts"`
	OldestReadyAge  *float64          `json:"oldest_ready_age_seconds"`
	Error           string            `json:"error,omitempty"`
	DefaultState    string            `json:"-"`
	UnknownInWork   bool              `json:"-"`
	MissingStateFor map[string]string `json:"-"` // state: why the table cannot have it
}

// cellKeys are the overview's columns, in order: the states, then "oldest".
var cellKeys = func() []string {
	var k []string
	for _, st := range sqlxbroker.States {
		k = append(k, string(st))
	}
	return append(k, "oldest")
}()

const dash = "—"

// missingState says why t cannot have st ("" when it can).
func missingState(t *sqlxbroker.Table, st sqlxbroker.State) string {
	switch st {
	case sqlxbroker.StateScheduled:
		if t.ReadyAt == "" {
			return "no ReadyAt column"
		}
	case sqlxbroker.StateInWork:
		if t.LockedUntil == "" {
			return fmt.Sprintf("the %s form cannot tell rows in work; they count as ready", t.Form())
		}
	case sqlxbroker.StateDead:
		if t.DeadAt == "" {
			return "no DeadAt column"
		}
	case sqlxbroker.StateDone:
		if t.DoneAt == "" {
			return "no DoneAt column (done rows are deleted)"
		}
	}
	return ""
}

// defaultState is the state a table's page opens on: dead where the table
// has dead rows, else ready.
func defaultState(t *sqlxbroker.Table) sqlxbroker.State {
	if t.DeadAt != "" {
		return sqlxbroker.StateDead
	}
	return sqlxbroker.StateReady
}

// tableHref is the link from the mount point to t's page.
func tableHref(name string, st sqlxbroker.State) string {
	return "t/" + url.PathEscape(name) + "?state=" + url.QueryEscape(string(st))
}

// counts reads t's counts; an error is kept in the result, not returned.
func (h *handler) counts(r *http.Request, t *sqlxbroker.Table) tableCounts {
	tc := tableCounts{Name: t.Name, Href: tableHref(t.Name, defaultState(t)), Form: t.Form().String(),
		Cells: map[string]string{}, Counts: map[string]*int64{}, MissingStateFor: map[string]string{},
		DefaultState: string(defaultState(t))}
	for _, k := range cellKeys {
		tc.Cells[k] = dash
	}
	for _, st := range sqlxbroker.States {
		if why := missingState(t, st); why != "" {
			tc.MissingStateFor[string(st)] = why
		}
	}
	ctx, cancel := opContext(r)
	defer cancel()
	c, err := h.b.Counts(ctx, *t)
	if err != nil {
		tc.Error = err.Error()
		h.log.Warn("dashboard: counts", "table", t.Name, "err", err)
		return tc
	}
	tc.UnknownInWork = !c.InWorkKnown
	for _, st := range sqlxbroker.States {
		if tc.MissingStateFor[string(st)] != "" || (st == sqlxbroker.StateInWork && !c.InWorkKnown) {
			tc.Counts[string(st)] = nil
			continue
		}
		n := c.Of(st)
		tc.Counts[string(st)] = &n
		tc.Cells[string(st)] = strconv.FormatInt(n, 10)
	}
	if !c.OldestReady.IsZero() {
		age := max(c.At.Sub(c.OldestReady), 0)
		s := age.Seconds()
		tc.OldestReadyAge = &s
		tc.Cells["oldest"] = formatAge(age)
	}
	return tc
}

// formatAge is a duration as a person reads an age: "0s", "42s", "3m05s",
// "2h10m", "3d04h".
func formatAge(d time.Duration) string {
	s := int64(d / time.Second)
	switch {
	case s < 60:
		return fmt.Sprintf("%ds", s)
	case s < 3600:
		return fmt.Sprintf("%dm%02ds", s/60, s%60)
	case s < 86400:
		return fmt.Sprintf("%dh%02dm", s/3600, s%3600/60)
	}
	return fmt.Sprintf("%dd%02dh", s/86400, s%86400/3600)
}

func (h *handler) base(r *http.Request, title string) base {
	return base{Title: title, Root: root(r), Refresh: h.o.Refresh.Milliseconds(), Actions: h.o.Actions, Token: h.token}
}

type overviewPage struct {
	base
	Keys   []string
	Tables []tableCounts
	At     string
}

func (h *handler) overview(w http.ResponseWriter, r *http.Request) {
	p := overviewPage{base: h.base(r, "Queues"), Keys: cellKeys, At: time.Now().UTC().Format(time.TimeOnly) + " UTC"}
	for i := range h.o.Tables {
		p.Tables = append(p.Tables, h.counts(r, &h.o.Tables[i]))
	}
	h.render(w, r, http.StatusOK, "overview.html", p)
}

// countsJSON is the overview's counts for the page's script.
func (h *handler) countsJSON(w http.ResponseWriter, r *http.Request) {
	out := struct {
		At     time.Time     `json:"at"`
		Tables []tableCounts `json:"tables"`
	}{At: time.Now().UTC()}
	for i := range h.o.Tables {
		out.Tables = append(out.Tables, h.counts(r, &h.o.Tables[i]))
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(out)
}

// column is one shown column of a listed row.
type column struct {
	Name  string
	Value string
	Null  bool
}

type listedRow struct {
	ID        string
	Attempt   int
	LastError string
	Columns   []column
}

type stateTab struct {
	State   string
	Href    string
	Count   string
	Current bool
	Missing string
}

type tablePage struct {
	base
	Table        tableCounts
	State        string
	Tabs         []stateTab
	Columns      []string
	Rows         []listedRow
	HasLastError bool
	CanRequeue   bool // dead rows: per-row and "requeue all"
	CanDelete    bool
	FirstHref    string // "" on the first page
	NextHref     string // "" on the last page
	Notice       string
	Self         string // this page's URL, relative to itself
}

// tablePage serves "t/{name}": GET lists rows, POST runs an action.
func (h *handler) tablePage(w http.ResponseWriter, r *http.Request, escaped string) {
	name, err := url.PathUnescape(escaped)
	if err != nil {
		h.fail(w, r, http.StatusBadRequest, fmt.Errorf("bad table name %q: %v", escaped, err))
		return
	}
	t, ok := h.tables[name]
	if !ok {
		h.fail(w, r, http.StatusNotFound, fmt.Errorf("no table %q is described (the dashboard shows %s)", name, strings.Join(h.names(), ", ")))
		return
	}
	q := r.URL.Query()
	st := defaultState(t)
	if s := q.Get("state"); s != "" {
		if st, err = sqlxbroker.ParseState(s); err != nil {
			h.fail(w, r, http.StatusBadRequest, err)
			return
		}
	}
	switch r.Method {
	case http.MethodGet, http.MethodHead:
	case http.MethodPost:
		if h.checkPost(w, r) {
			h.action(w, r, t, st)
		}
		return
	default:
		w.Header().Set("Allow", "GET, HEAD, POST")
		h.fail(w, r, http.StatusMethodNotAllowed, fmt.Errorf("method %s not allowed here", r.Method))
		return
	}
	p := tablePage{base: h.base(r, t.Name), State: string(st), HasLastError: t.LastError != "",
		Notice: notice(q)}
	p.Table = h.counts(r, t)
	p.Self = url.PathEscape(name) + "?state=" + url.QueryEscape(string(st))
	for _, s := range sqlxbroker.States {
		p.Tabs = append(p.Tabs, stateTab{State: string(s), Href: url.PathEscape(name) + "?state=" + url.QueryEscape(string(s)),
			Count: p.Table.Cells[string(s)], Current: s == st, Missing: p.Table.MissingStateFor[string(s)]})
	}
	if why := p.Table.MissingStateFor[string(st)]; why != "" {
		p.Error = fmt.Sprintf("table %q cannot list %s rows: %s", t.Name, st, why)
		h.render(w, r, http.StatusOK, "table.html", p)
		return
	}
	p.CanRequeue = h.o.Actions && st == sqlxbroker.StateDead
	p.CanDelete = h.o.Actions && st != sqlxbroker.StateInWork && !(st == sqlxbroker.StateReady && t.Form() == sqlxbroker.Advisory)
	lp := sqlxbroker.ListParams{State: st, Limit: h.o.PageSize}
	if a := q.Get("after"); a != "" {
		lp.After = a
		p.FirstHref = p.Self
	}
	ctx, cancel := opContext(r)
	defer cancel()
	page, err := h.b.List(ctx, *t, lp)
	if err != nil {
		h.log.Warn("dashboard: list", "table", t.Name, "state", st, "err", err)
		p.Error = err.Error()
		h.render(w, r, http.StatusInternalServerError, "table.html", p)
		return
	}
	if page.Next != nil {
		p.NextHref = p.Self + "&after=" + url.QueryEscape(fmt.Sprint(page.Next))
	}
	skip := map[string]bool{strings.ToLower(t.IDColumn()): true, strings.ToLower(t.AttemptColumn()): true}
	if t.LastError != "" {
		skip[strings.ToLower(t.LastError)] = true
	}
	for i, row := range page.Rows {
		lr := listedRow{ID: fmt.Sprint(row.ID), Attempt: row.Attempt, LastError: row.LastError}
		for j, c := range row.Columns {
			if skip[strings.ToLower(c)] {
				continue
			}
			if i == 0 {
				p.Columns = append(p.Columns, c)
			}
			v := row.Values[j]
			lr.Columns = append(lr.Columns, column{Name: c, Value: cell(v), Null: v == nil})
		}
		p.Rows = append(p.Rows, lr)
	}
	h.render(w, r, http.StatusOK, "table.html", p)
}

// notice is the message a redirect after an action carries: fixed text
// and a number, never text from the query.
func notice(q url.Values) string {
	n, err := strconv.ParseInt(q.Get("n"), 10, 64)
	if err != nil {
		return ""
	}
	rows := "rows"
	if n == 1 {
		rows = "row"
	}
	switch q.Get("did") {
	case "requeue":
		return fmt.Sprintf("Requeued %d %s.", n, rows)
	case "delete":
		return fmt.Sprintf("Deleted %d %s.", n, rows)
	}
	return ""
}

// action runs a POSTed requeue or delete on t's rows in st, then redirects
// back to the list (303) with what it did.
func (h *handler) action(w http.ResponseWriter, r *http.Request, t *sqlxbroker.Table, st sqlxbroker.State) {
	f := r.PostForm
	var sel sqlxbroker.Select
	for _, id := range f["id"] {
		sel.IDs = append(sel.IDs, id)
	}
	sel.All = f.Get("all") == "1"
	ctx, cancel := opContext(r)
	defer cancel()
	var n int64
	var err error
	op := f.Get("op")
	switch op {
	case "requeue":
		if st != sqlxbroker.StateDead {
			err = fmt.Errorf("only dead rows are requeued (the form says %s)", st)
			break
		}
		n, err = h.b.Requeue(ctx, *t, sel)
	case "delete":
		if sel.All {
			err = errors.New("the dashboard deletes rows by id only")
			break
		}
		n, err = h.b.Delete(ctx, *t, sqlxbroker.DeleteParams{State: st, Select: sel})
	default:
		h.fail(w, r, http.StatusBadRequest, fmt.Errorf("unknown op %q (requeue or delete)", op))
		return
	}
	h.log.Info("dashboard: "+op, "table", t.Name, "state", st, "ids", sel.IDs, "all", sel.All, "changed", n, "err", err, "remote", r.RemoteAddr)
	if err != nil {
		h.fail(w, r, http.StatusInternalServerError, fmt.Errorf("%s %s rows of %s: %w (%d changed before the error)", op, st, t.Name, err, n))
		return
	}
	next := url.PathEscape(t.Name) + "?state=" + url.QueryEscape(string(st)) + "&did=" + op + "&n=" + strconv.FormatInt(n, 10)
	w.Header().Set("Location", next)
	w.WriteHeader(http.StatusSeeOther)
}

func (h *handler) names() []string {
	out := make([]string, len(h.o.Tables))
	for i, t := range h.o.Tables {
		out[i] = strconv.Quote(t.Name)
	}
	return out
}

type errorPage struct {
	base
}

// fail answers with status and err's text in a page (or JSON for
// counts.json).
func (h *handler) fail(w http.ResponseWriter, r *http.Request, status int, err error) {
	if strings.HasSuffix(r.URL.Path, ".json") {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(map[string]string{"error": err.Error()})
		return
	}
	p := errorPage{base: h.base(r, http.StatusText(status))}
	p.Error, p.Status = err.Error(), status
	h.render(w, r, status, "error.html", p)
}

// render executes a page into a buffer first, so a template error is a
// 500 with its text, not half a page.
func (h *handler) render(w http.ResponseWriter, r *http.Request, status int, name string, data any) {
	var buf bytes.Buffer
	if err := h.pages.ExecuteTemplate(&buf, name, data); err != nil {
		h.log.Error("dashboard: render", "page", name, "err", err)
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(http.StatusInternalServerError)
		fmt.Fprintf(w, "dashboard: render %s: %v\n", name, err)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	if r.Method != http.MethodHead {
		_, _ = w.Write(buf.Bytes())
	}
}

// cell is a column value as text: NULL, times in RFC 3339 UTC, the rest
// as fmt prints them.
func cell(v any) string {
	switch v := v.(type) {
	case nil:
		return "NULL"
	case time.Time:
		return v.UTC().Format("2006-01-02 15:04:05.000000Z07:00")
	case []byte:
		if utf8.Valid(v) {
			return string(v)
		}
		return fmt.Sprintf("%x", v)
	}
	return fmt.Sprint(v)
}

// shorten cuts s to n runes, marking the cut.
func shorten(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	return string([]rune(s)[:n]) + "…"
}
