package dashboard_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/dashboard"
)

func newHandler(t *testing.T, b *sqlxbroker.Broker, o dashboard.Options) http.Handler {
	t.Helper()
	if o.Logger == nil {
		o.Logger = quiet
	}
	h, err := dashboard.New(b, o)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return h
}

// New refuses what it cannot show, naming the problem.
func TestNewValidates(t *testing.T) {
	b, err := sqlxbroker.Open(openSQLite(t))
	if err != nil {
		t.Fatal(err)
	}
	good := sqlxbroker.Table{Name: "jobs", LockedUntil: "locked_until"}
	for _, c := range []struct {
		name string
		b    *sqlxbroker.Broker
		o    dashboard.Options
		want string
	}{
		{"nil broker", nil, dashboard.Options{Tables: []sqlxbroker.Table{good}}, "nil broker"},
		{"no tables", b, dashboard.Options{}, "Tables is empty"},
		{"bad name", b, dashboard.Options{Tables: []sqlxbroker.Table{good, {Name: "bad name"}}}, `Tables[1] ("bad name")`},
		{"bad field", b, dashboard.Options{Tables: []sqlxbroker.Table{{Name: "j", LockedUntil: "l", MaxAttempts: 3}}}, "DeadAt"},
		{"twice", b, dashboard.Options{Tables: []sqlxbroker.Table{good, good}}, `"jobs" is described twice`},
		{"page size", b, dashboard.Options{Tables: []sqlxbroker.Table{good}, PageSize: 5000}, "PageSize 5000"},
		{"refresh", b, dashboard.Options{Tables: []sqlxbroker.Table{good}, Refresh: -1}, "negative Options.Refresh"},
	} {
		_, err := dashboard.New(c.b, c.o)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want one containing %q", c.name, err, c.want)
		}
	}
}

// countsJSON is what counts.json answers.
type countsJSON struct {
	Tables []struct {
		Name   string            `json:"name"`
		Cells  map[string]string `json:"cells"`
		Counts map[string]*int64 `json:"counts"`
		Error  string            `json:"error"`
	} `json:"tables"`
}

// The overview and counts.json show each table's true counts: "—" for in
// work in the row-lock form, the numbers in the lease form.
func TestCountsShown(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *sqlxbroker.Broker) {
		lease := newTable(t, b, sqlxbroker.Lease)
		rowlock := newTable(t, b, notLease(b))
		for _, tb := range []sqlxbroker.Table{lease, rowlock} {
			seed(t, b, tb, sqlxbroker.StateReady, 5, "r", "")
			seed(t, b, tb, sqlxbroker.StateScheduled, 3, "s", "")
			seed(t, b, tb, sqlxbroker.StateDead, 2, "d", "boom")
			seed(t, b, tb, sqlxbroker.StateDone, 1, "x", "")
		}
		h := newHandler(t, b, dashboard.Options{Tables: []sqlxbroker.Table{lease, rowlock}})

		code, body := get(t, h, "/counts.json")
		if code != http.StatusOK {
			t.Fatalf("counts.json: %d %s", code, body)
		}
		var cj countsJSON
		if err := json.Unmarshal([]byte(body), &cj); err != nil {
			t.Fatalf("counts.json: %v\n%s", err, body)
		}
		if len(cj.Tables) != 2 {
			t.Fatalf("counts.json has %d tables, want 2", len(cj.Tables))
		}
		for i, tb := range []sqlxbroker.Table{lease, rowlock} {
			got := cj.Tables[i]
			want := map[string]string{"ready": "5", "scheduled": "3", "in-work": "0", "dead": "2", "done": "1"}
			if tb.Form() != sqlxbroker.Lease {
				want["in-work"] = "—"
			}
			if got.Name != tb.Name || got.Error != "" {
				t.Errorf("table %d: name %q error %q", i, got.Name, got.Error)
			}
			for k, v := range want {
				if got.Cells[k] != v {
					t.Errorf("%s form: cell %s = %q, want %q", tb.Form(), k, got.Cells[k], v)
				}
			}
			if (got.Counts["in-work"] == nil) != (tb.Form() != sqlxbroker.Lease) {
				t.Errorf("%s form: in-work count %v", tb.Form(), got.Counts["in-work"])
			}
			if got.Cells["oldest"] == "—" || !strings.HasSuffix(got.Cells["oldest"], "s") {
				t.Errorf("oldest ready age %q, want a minute or so", got.Cells["oldest"])
			}
		}

		code, body = get(t, h, "/")
		if code != http.StatusOK {
			t.Fatalf("overview: %d %s", code, body)
		}
		for _, tb := range []sqlxbroker.Table{lease, rowlock} {
			row := between(body, `<tr data-table="`+tb.Name+`">`, "</tr>")
			for k, v := range map[string]string{"ready": ">5<", "scheduled": ">3<", "dead": ">2<", "done": ">1<"} {
				cell := between(row, `data-cell="`+k+`"`, "</td>")
				if !strings.Contains(cell, v) {
					t.Errorf("%s overview cell %s = %q, want %s", tb.Form(), k, cell, v)
				}
			}
			inWork := between(row, `data-cell="in-work"`, "</td>")
			if tb.Form() == sqlxbroker.Lease && !strings.Contains(inWork, ">0<") || tb.Form() != sqlxbroker.Lease && !strings.Contains(inWork, ">—<") {
				t.Errorf("%s overview in-work cell %q", tb.Form(), inWork)
			}
		}
		if strings.Contains(body, `name="token"`) {
			t.Error("the read-only overview carries a form")
		}
	})
}

// between is the text of s after from, up to to.
func between(s, from, to string) string {
	_, after, ok := strings.Cut(s, from)
	if !ok {
		return ""
	}
	in, _, _ := strings.Cut(after, to)
	return in
}

// Read-only: no buttons, and a POST (even with a token) changes nothing.
func TestReadOnlyRefusesPost(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *sqlxbroker.Broker) {
		tb := newTable(t, b, sqlxbroker.Lease)
		seed(t, b, tb, sqlxbroker.StateDead, 2, "d", "boom")
		h := newHandler(t, b, dashboard.Options{Tables: []sqlxbroker.Table{tb}})
		code, page := get(t, h, tablePath(tb, sqlxbroker.StateDead))
		if code != http.StatusOK {
			t.Fatalf("dead list: %d %s", code, page)
		}
		if strings.Contains(page, "<form") || strings.Contains(page, "<button") {
			t.Errorf("the read-only page has forms:\n%s", page)
		}
		dead := ids(t, b, tb, sqlxbroker.StateDead)
		for _, f := range []url.Values{
			{"op": {"requeue"}, "id": {dead[0]}},
			{"op": {"requeue"}, "all": {"1"}},
			{"op": {"delete"}, "id": {dead[0]}},
		} {
			res := post(t, h, tablePath(tb, sqlxbroker.StateDead), f)
			if res.StatusCode != http.StatusMethodNotAllowed && res.StatusCode != http.StatusForbidden {
				t.Errorf("POST %v: status %d, want 405 or 403", f, res.StatusCode)
			}
		}
		for _, p := range []string{"/", "/counts.json"} {
			if res := post(t, h, p, nil); res.StatusCode != http.StatusMethodNotAllowed {
				t.Errorf("POST %s: status %d, want 405", p, res.StatusCode)
			}
		}
		if c := counts(t, b, tb); c.Dead != 2 || c.Ready != 0 {
			t.Errorf("after refused POSTs: dead %d ready %d, want 2 and 0", c.Dead, c.Ready)
		}
	})
}

// With actions: a POST without the token, with a wrong one, or marked
// cross-origin gets 403 and changes nothing; with the token, requeue makes
// the row ready, "requeue all" the rest, delete removes a row, and GET
// changes nothing.
func TestActions(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *sqlxbroker.Broker) {
		tb := newTable(t, b, sqlxbroker.Lease)
		seed(t, b, tb, sqlxbroker.StateDead, 4, "d", "boom")
		seed(t, b, tb, sqlxbroker.StateScheduled, 2, "s", "")
		h := newHandler(t, b, dashboard.Options{Tables: []sqlxbroker.Table{tb}, Actions: true})
		target := tablePath(tb, sqlxbroker.StateDead)
		code, page := get(t, h, target)
		if code != http.StatusOK {
			t.Fatalf("dead list: %d %s", code, page)
		}
		tok := token(t, page)
		dead := ids(t, b, tb, sqlxbroker.StateDead)
		if len(dead) != 4 {
			t.Fatalf("%d dead rows, want 4", len(dead))
		}

		for _, c := range []struct {
			name    string
			form    url.Values
			headers []string
		}{
			{"no token", url.Values{"op": {"requeue"}, "id": {dead[0]}}, nil},
			{"wrong token", url.Values{"op": {"requeue"}, "id": {dead[0]}, "token": {strings.Repeat("0", len(tok))}}, nil},
			{"short token", url.Values{"op": {"requeue"}, "id": {dead[0]}, "token": {tok[:10]}}, nil},
			{"cross-site", url.Values{"op": {"requeue"}, "id": {dead[0]}, "token": {tok}}, []string{"Sec-Fetch-Site", "cross-site"}},
			{"other origin", url.Values{"op": {"requeue"}, "id": {dead[0]}, "token": {tok}}, []string{"Origin", "https://evil.example"}},
		} {
			if res := post(t, h, target, c.form, c.headers...); res.StatusCode != http.StatusForbidden {
				t.Errorf("%s: status %d, want 403", c.name, res.StatusCode)
			}
		}
		if got := ids(t, b, tb, sqlxbroker.StateDead); len(got) != 4 {
			t.Fatalf("refused POSTs changed rows: %d dead, want 4", len(got))
		}
		// A GET with the action's fields changes nothing.
		if code, _ := get(t, h, target+"&op=requeue&all=1&token="+tok); code != http.StatusOK {
			t.Errorf("GET with action fields: %d", code)
		}
		if c := counts(t, b, tb); c.Dead != 4 {
			t.Fatalf("a GET changed rows: %d dead", c.Dead)
		}

		res := post(t, h, target, url.Values{"op": {"requeue"}, "id": {dead[0]}, "token": {tok}},
			"Origin", "http://example.com", "Sec-Fetch-Site", "same-origin")
		if res.StatusCode != http.StatusSeeOther {
			t.Fatalf("requeue: status %d, want 303", res.StatusCode)
		}
		if !slices.Contains(ids(t, b, tb, sqlxbroker.StateReady), dead[0]) {
			t.Fatalf("requeued row %s is not ready (ready: %v)", dead[0], ids(t, b, tb, sqlxbroker.StateReady))
		}
		loc := res.Header.Get("Location")
		code, page = get(t, h, mustParse(t, target).ResolveReference(mustParse(t, loc)).String())
		if code != http.StatusOK || !strings.Contains(page, "Requeued 1 row.") {
			t.Errorf("after the redirect to %q: %d, notice missing:\n%s", loc, code, page)
		}

		if res := post(t, h, target, url.Values{"op": {"delete"}, "id": {dead[1]}, "token": {tok}}); res.StatusCode != http.StatusSeeOther {
			t.Fatalf("delete: status %d", res.StatusCode)
		}
		if slices.Contains(ids(t, b, tb, sqlxbroker.StateDead), dead[1]) {
			t.Errorf("deleted row %s is still dead", dead[1])
		}
		if res := post(t, h, target, url.Values{"op": {"requeue"}, "all": {"1"}, "token": {tok}}); res.StatusCode != http.StatusSeeOther {
			t.Fatalf("requeue all: status %d", res.StatusCode)
		}
		c := counts(t, b, tb)
		if c.Dead != 0 || c.Ready != 3 || c.Scheduled != 2 {
			t.Errorf("after requeue all: dead %d ready %d scheduled %d, want 0, 3, 2", c.Dead, c.Ready, c.Scheduled)
		}
		// Requeue is for dead rows only.
		if res := post(t, h, tablePath(tb, sqlxbroker.StateScheduled), url.Values{"op": {"requeue"}, "all": {"1"}, "token": {tok}}); res.StatusCode == http.StatusSeeOther {
			t.Error("requeue of scheduled rows was accepted")
		}
	})
}

// A last error and a payload holding markup are shown as text.
func TestEscaping(t *testing.T) {
	b, err := sqlxbroker.Open(openSQLite(t))
	if err != nil {
		t.Fatal(err)
	}
	tb := newTable(t, b, sqlxbroker.Lease)
	seed(t, b, tb, sqlxbroker.StateDead, 1, `<img src=x onerror=alert(2)>`, `<script>alert(1)</script> & "quoted"`)
	h := newHandler(t, b, dashboard.Options{Tables: []sqlxbroker.Table{tb}, Actions: true})
	code, page := get(t, h, tablePath(tb, sqlxbroker.StateDead))
	if code != http.StatusOK {
		t.Fatalf("dead list: %d %s", code, page)
	}
	for _, bad := range []string{"<script>alert", "<img src=x"} {
		if strings.Contains(page, bad) {
			t.Errorf("the page holds %q unescaped", bad)
		}
	}
	for _, good := range []string{"&lt;script&gt;alert(1)&lt;/script&gt; &amp; &#34;quoted&#34;", "&lt;img src=x onerror=alert(2)&gt;"} {
		if !strings.Contains(page, good) {
			t.Errorf("the page lacks the escaped %q:\n%s", good, page)
		}
	}
}

// Pages follow ListPage.Next: every dead row once, in order, and the last
// page has no next link.
func TestPaging(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *sqlxbroker.Broker) {
		tb := newTable(t, b, notLease(b))
		seed(t, b, tb, sqlxbroker.StateDead, 7, "d", "boom")
		h := newHandler(t, b, dashboard.Options{Tables: []sqlxbroker.Table{tb}, PageSize: 3})
		var seen []string
		target := tablePath(tb, sqlxbroker.StateDead)
		for pages := 0; target != ""; pages++ {
			if pages > 5 {
				t.Fatal("more than 5 pages of 3 for 7 rows")
			}
			code, page := get(t, h, target)
			if code != http.StatusOK {
				t.Fatalf("%s: %d %s", target, code, page)
			}
			for _, part := range strings.Split(page, `<tr data-id="`)[1:] {
				id, _, _ := strings.Cut(part, `"`)
				seen = append(seen, id)
			}
			var next string
			if m := nextRE.FindStringSubmatch(page); m != nil {
				next = m[1]
			}
			target = ""
			if next != "" {
				if !strings.Contains(next, "after=") {
					t.Fatalf("next link %q has no after", next)
				}
				target = "/t/" + strings.ReplaceAll(next, "&amp;", "&")
			}
		}
		want := ids(t, b, tb, sqlxbroker.StateDead)
		if !slices.Equal(seen, want) {
			t.Errorf("paged through %v, want %v", seen, want)
		}
	})
}

var nextRE = regexp.MustCompile(`href="([^"]*)" id="next"`)

// Mounted under a prefix with http.StripPrefix, every link is relative and
// resolves below it.
func TestStripPrefix(t *testing.T) {
	b, err := sqlxbroker.Open(openSQLite(t))
	if err != nil {
		t.Fatal(err)
	}
	tb := newTable(t, b, sqlxbroker.Lease)
	seed(t, b, tb, sqlxbroker.StateDead, 1, "d", "boom")
	mux := http.NewServeMux()
	h := newHandler(t, b, dashboard.Options{Tables: []sqlxbroker.Table{tb}, Actions: true})
	mux.Handle("/ops/queues/", http.StripPrefix("/ops/queues", h))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	client := srv.Client()
	client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

	// Without a mux to add the slash, the handler redirects, relatively.
	rec := httptest.NewRecorder()
	http.StripPrefix("/ops/queues", h).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/ops/queues", nil))
	if loc := rec.Header().Get("Location"); rec.Code != http.StatusMovedPermanently || loc != "queues/" {
		t.Errorf("GET /ops/queues: %d Location %q, want 301 to queues/", rec.Code, loc)
	}
	base, _ := url.Parse(srv.URL + "/ops/queues/")
	_, page := getURL(t, client, base.String())
	for _, link := range []string{"./static/style.css", "./static/dashboard.js", "./counts.json", "t/" + tb.Name + "?state=dead"} {
		if !strings.Contains(page, `"`+link+`"`) {
			t.Errorf("overview lacks the relative link %q", link)
		}
		code, _ := getURL(t, client, base.ResolveReference(mustParse(t, link)).String())
		if code != http.StatusOK {
			t.Errorf("GET %s below the prefix: %d", link, code)
		}
	}
	tableURL := base.ResolveReference(mustParse(t, "t/"+tb.Name+"?state=dead"))
	_, page = getURL(t, client, tableURL.String())
	for _, link := range []string{"../static/style.css", "../counts.json", tb.Name + "?state=dead"} {
		if !strings.Contains(page, `"`+link+`"`) {
			t.Errorf("table page lacks the relative link %q", link)
			continue
		}
		got := tableURL.ResolveReference(mustParse(t, link))
		if !strings.HasPrefix(got.Path, "/ops/queues/") {
			t.Errorf("link %q resolves to %s, outside the prefix", link, got)
		}
	}
	// A same-origin browser POST through the prefix works.
	form := url.Values{"op": {"requeue"}, "id": {ids(t, b, tb, sqlxbroker.StateDead)[0]}, "token": {token(t, page)}}
	req, _ := http.NewRequest(http.MethodPost, tableURL.String(), strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", srv.URL)
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	res, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusSeeOther {
		t.Fatalf("POST through the prefix: %d", res.StatusCode)
	}
	if c := counts(t, b, tb); c.Ready != 1 || c.Dead != 0 {
		t.Errorf("after requeue: ready %d dead %d", c.Ready, c.Dead)
	}
}

func mustParse(t *testing.T, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

func getURL(t *testing.T, c *http.Client, u string) (int, string) {
	t.Helper()
	res, err := c.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var sb strings.Builder
	buf := make([]byte, 32<<10)
	for {
		n, err := res.Body.Read(buf)
		sb.Write(buf[:n])
		if err != nil {
			break
		}
	}
	return res.StatusCode, sb.String()
}

// Errors from the API reach the page with their text: a missing table on
// the overview and in counts.json, an unknown state, an unknown table.
func TestErrorsShown(t *testing.T) {
	b, err := sqlxbroker.Open(openSQLite(t))
	if err != nil {
		t.Fatal(err)
	}
	tb := newTable(t, b, sqlxbroker.Lease)
	missing := sqlxbroker.Table{Name: "no_such_table_" + strconv.Itoa(len(tb.Name)), LockedUntil: "locked_until"}
	h := newHandler(t, b, dashboard.Options{Tables: []sqlxbroker.Table{tb, missing}})
	code, page := get(t, h, "/")
	if code != http.StatusOK || !strings.Contains(page, "cannot read the table") {
		t.Errorf("overview: %d, no error for the missing table:\n%s", code, page)
	}
	_, js := get(t, h, "/counts.json")
	if !strings.Contains(js, "cannot read the table") {
		t.Errorf("counts.json has no error for the missing table: %s", js)
	}
	code, page = get(t, h, tablePath(missing, sqlxbroker.StateReady))
	if code != http.StatusInternalServerError || !strings.Contains(page, "cannot read the table") {
		t.Errorf("missing table's page: %d:\n%s", code, page)
	}
	code, page = get(t, h, "/t/"+tb.Name+"?state=zombie")
	if code != http.StatusBadRequest || !strings.Contains(page, "unknown state &#34;zombie&#34;") {
		t.Errorf("unknown state: %d:\n%s", code, page)
	}
	code, page = get(t, h, "/t/elsewhere")
	if code != http.StatusNotFound || !strings.Contains(page, "no table &#34;elsewhere&#34;") {
		t.Errorf("unknown table: %d:\n%s", code, page)
	}
	plain := sqlxbroker.Table{Name: tb.Name + "_plain", LockedUntil: "locked_until"}
	if err := b.CreateTable(t.Context(), plain); err != nil {
		t.Fatal(err)
	}
	h = newHandler(t, b, dashboard.Options{Tables: []sqlxbroker.Table{plain}})
	code, page = get(t, h, tablePath(plain, sqlxbroker.StateDead))
	if code != http.StatusOK || !strings.Contains(page, "no DeadAt column") {
		t.Errorf("dead rows of a table without DeadAt: %d:\n%s", code, page)
	}
}
