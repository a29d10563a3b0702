package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/jmoiron/sqlx"
	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/dialects/sqlite"
)

// The operations commands: stats, list, requeue, delete, prune. Each
// checks the described tables against the database (the table and every
// column it names, by a query that returns no row) before it acts, so bad
// input changes nothing.

const (
	statsUsage = `usage: sqlxbroker stats --driver NAME --dsn DSN (--table NAME [columns] | --tables FILE) [flags]

Prints how many rows of each described table are ready, scheduled (ready
time in the future), in work (lease form only; "-" where the form cannot
tell, and those rows count as ready), dead and done ("-" without the
column), and the age of the oldest ready row. --watch refreshes until
interrupted; --json prints one JSON object per table.

`
	listUsage = `usage: sqlxbroker list --driver NAME --dsn DSN --table NAME [columns] --state STATE [flags]

Prints a page of the rows in STATE (ready, scheduled, in-work, dead, done)
by id: id, attempt, last error and the payload columns. --after ID starts
after that id (the last id of the page before: keyset paging).

`
	requeueUsage = `usage: sqlxbroker requeue --driver NAME --dsn DSN --table NAME [columns] (--id ID,... | --all)

Makes dead rows ready again, as new (dead time, lease and last error
cleared, attempt 1), in batches. Only rows that are dead change. The id
column is --id-column here.

`
	deleteUsage = `usage: sqlxbroker delete --driver NAME --dsn DSN --table NAME [columns] --state STATE (--id ID,... | --all)

Deletes rows in STATE, in batches; never a row in work (see Broker.Delete).
The id column is --id-column here.

`
	pruneUsage = `usage: sqlxbroker prune --driver NAME --dsn DSN --table NAME [columns] --older-than DURATION

Deletes done rows whose done time is older than DURATION (e.g. 168h), in
batches.

`
)

// opsFlags are the flags every operations command takes.
type opsFlags struct {
	fs          *flag.FlagSet
	driver, dsn *string
	tables      func() ([]sqlxbroker.Table, error)
}

// newOpsFlags makes the command's flag set; own registers the command's
// own flags before the description's (so a command's --id wins).
func newOpsFlags(name, usage string, stderr io.Writer, own func(fs *flag.FlagSet)) *opsFlags {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, usage, describeUsage, "\nflags:\n")
		fs.PrintDefaults()
	}
	o := &opsFlags{fs: fs}
	o.driver = fs.String("driver", "", "database/sql driver name: "+drivers())
	o.dsn = fs.String("dsn", "", "data source name (for SQLite, a file path will do)")
	if own != nil {
		own(fs)
	}
	o.tables = describeFlags(fs)
	return o
}

// parse parses args; a positional argument is an error.
func (o *opsFlags) parse(args []string) error {
	if err := o.fs.Parse(args); err != nil {
		return err
	}
	if o.fs.NArg() > 0 {
		return fmt.Errorf("%s: unexpected argument %q (flags only)", o.fs.Name(), o.fs.Arg(0))
	}
	return nil
}

// open parses nothing more: it builds the tables, opens the database and
// checks each table against it. close releases the broker and the pool.
func (o *opsFlags) open(ctx context.Context) (b *sqlxbroker.Broker, tables []sqlxbroker.Table, closeFn func(), err error) {
	name := o.fs.Name()
	if *o.driver == "" {
		return nil, nil, nil, fmt.Errorf("%s: --driver is required (%s)", name, drivers())
	}
	if *o.dsn == "" {
		return nil, nil, nil, fmt.Errorf("%s: --dsn is required", name)
	}
	tables, err = o.tables()
	if err != nil {
		return nil, nil, nil, fmt.Errorf("%s: %w", name, err)
	}
	d, err := sqlxbroker.Lookup(*o.driver)
	if err != nil {
		return nil, nil, nil, err
	}
	dsn := *o.dsn
	if *o.driver == "sqlite" && !strings.HasPrefix(dsn, "file:") {
		dsn = sqlite.DSN(dsn)
	}
	db, err := sqlx.Open(*o.driver, dsn)
	if err != nil {
		return nil, nil, nil, err
	}
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, nil, nil, fmt.Errorf("%s: connect: %w", name, err)
	}
	b = sqlxbroker.OpenDialect(db, d)
	closeFn = func() {
		_ = b.Close(context.Background())
		db.Close()
	}
	for _, t := range tables {
		if err := b.CheckTable(ctx, t); err != nil {
			closeFn()
			return nil, nil, nil, err
		}
	}
	return b, tables, closeFn, nil
}

// one returns the single table a command acts on.
func one(name string, tables []sqlxbroker.Table) (sqlxbroker.Table, error) {
	if len(tables) == 1 {
		return tables[0], nil
	}
	names := make([]string, len(tables))
	for i, t := range tables {
		names[i] = t.Name
	}
	return sqlxbroker.Table{}, fmt.Errorf("%s acts on one table and %d are described (%s): pick one with --table NAME",
		name, len(tables), strings.Join(names, ", "))
}

// helpOK turns -h into success.
func helpOK(err error) error {
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	return err
}

// ---- stats ----

// statsJSON is one line of stats --json. A count the table cannot tell is
// null.
type statsJSON struct {
	Table       string     `json:"table"`
	Form        string     `json:"form"`
	At          time.Time  `json:"at"`
	Ready       int64      `json:"ready"`
	Scheduled   *int64     `json:"scheduled"`
	InWork      *int64     `json:"in_work"`
	Dead        *int64     `json:"dead"`
	Done        *int64     `json:"done"`
	OldestReady *time.Time `json:"oldest_ready"`
	// OldestReadyAge is in seconds.
	OldestReadyAge *float64 `json:"oldest_ready_age"`
}

func statsCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var watch time.Duration
	var asJSON bool
	o := newOpsFlags("stats", statsUsage, stderr, func(fs *flag.FlagSet) {
		fs.DurationVar(&watch, "watch", 0, "refresh every DURATION until interrupted (0: once)")
		fs.BoolVar(&asJSON, "json", false, "one JSON object per table")
	})
	if err := o.parse(args); err != nil {
		return helpOK(err)
	}
	if watch < 0 {
		return fmt.Errorf("stats: negative --watch %v", watch)
	}
	b, tables, closeFn, err := o.open(ctx)
	if err != nil {
		return err
	}
	defer closeFn()
	clear := watch > 0 && !asJSON && isTerminal(stdout)
	for {
		rows := make([]statsJSON, 0, len(tables))
		for _, t := range tables {
			c, err := b.Counts(ctx, t)
			if err != nil {
				if ctx.Err() != nil && watch > 0 {
					return nil
				}
				return err
			}
			rows = append(rows, statsRow(t, c))
		}
		if asJSON {
			enc := json.NewEncoder(stdout)
			for _, r := range rows {
				if err := enc.Encode(r); err != nil {
					return err
				}
			}
		} else {
			if clear {
				fmt.Fprint(stdout, "\033[H\033[2J")
			}
			if watch > 0 {
				fmt.Fprintf(stdout, "%s (every %v)\n", time.Now().UTC().Format(time.RFC3339), watch)
			}
			printStats(stdout, rows)
		}
		if watch == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(watch):
		}
	}
}

func statsRow(t sqlxbroker.Table, c sqlxbroker.Counts) statsJSON {
	n := func(v int64, known bool) *int64 {
		if !known {
			return nil
		}
		return &v
	}
	r := statsJSON{Table: t.Name, Form: t.Form().String(), At: c.At, Ready: c.Ready,
		Scheduled: n(c.Scheduled, t.ReadyAt != ""), InWork: n(c.InWork, c.InWorkKnown),
		Dead: n(c.Dead, t.DeadAt != ""), Done: n(c.Done, t.DoneAt != "")}
	if !c.OldestReady.IsZero() {
		at := c.OldestReady
		age := max(c.At.Sub(at), 0).Seconds()
		r.OldestReady, r.OldestReadyAge = &at, &age
	}
	return r
}

func printStats(w io.Writer, rows []statsJSON) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "table\tform\tready\tscheduled\tin work\tdead\tdone\toldest ready\t")
	num := func(p *int64) string {
		if p == nil {
			return "-"
		}
		return strconv.FormatInt(*p, 10)
	}
	for _, r := range rows {
		age := "-"
		if r.OldestReadyAge != nil {
			age = roundAge(time.Duration(*r.OldestReadyAge * float64(time.Second))).String()
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t\n", r.Table, r.Form, r.Ready, num(r.Scheduled),
			num(r.InWork), num(r.Dead), num(r.Done), age)
	}
	tw.Flush()
}

// roundAge keeps an age readable: whole seconds from a second up.
func roundAge(d time.Duration) time.Duration {
	if d >= time.Second {
		return d.Round(time.Second)
	}
	return d.Round(time.Millisecond)
}

// isTerminal: w is a character device (a terminal), for --watch to clear.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// ---- list ----

func listCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var state, after string
	var limit int
	var asJSON bool
	o := newOpsFlags("list", listUsage, stderr, func(fs *flag.FlagSet) {
		fs.StringVar(&state, "state", "dead", "ready, scheduled, in-work, dead or done")
		fs.IntVar(&limit, "limit", 50, "most rows (at most 1000)")
		fs.StringVar(&after, "after", "", "start after this id (the last id of the page before)")
		fs.BoolVar(&asJSON, "json", false, "one JSON object per row")
	})
	if err := o.parse(args); err != nil {
		return helpOK(err)
	}
	st, err := sqlxbroker.ParseState(state)
	if err != nil {
		return err
	}
	if limit < 1 || limit > 1000 {
		return fmt.Errorf("list: --limit %d is not between 1 and 1000", limit)
	}
	b, tables, closeFn, err := o.open(ctx)
	if err != nil {
		return err
	}
	defer closeFn()
	t, err := one("list", tables)
	if err != nil {
		return err
	}
	lp := sqlxbroker.ListParams{State: st, Limit: limit}
	if after != "" {
		lp.After = idArg(after)
	}
	page, err := b.List(ctx, t, lp)
	if err != nil {
		return err
	}
	own := map[string]bool{} // the broker's columns; the rest are payload
	for _, c := range t.Columns() {
		switch c[0] {
		case "ID", "Attempt", "LockedUntil", "ReadyAt", "DeadAt", "DoneAt", "LastError":
			own[strings.ToLower(c[1])] = true
		}
	}
	if asJSON {
		enc := json.NewEncoder(stdout)
		for _, r := range page.Rows {
			cols := map[string]any{}
			for i, c := range r.Columns {
				cols[c] = jsonValue(r.Values[i])
			}
			if err := enc.Encode(map[string]any{"id": jsonValue(r.ID), "attempt": r.Attempt, "last_error": r.LastError, "columns": cols}); err != nil {
				return err
			}
		}
	} else {
		tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
		head := []string{"id", "attempt", "last error"}
		var payload []int
		for i, c := range rowColumns(page) {
			if !own[strings.ToLower(c)] {
				head = append(head, c)
				payload = append(payload, i)
			}
		}
		fmt.Fprintln(tw, strings.Join(head, "\t"))
		for _, r := range page.Rows {
			line := []string{show(r.ID), strconv.Itoa(r.Attempt), cut(oneLine(r.LastError), 60)}
			for _, i := range payload {
				line = append(line, cut(oneLine(show(r.Values[i])), 40))
			}
			fmt.Fprintln(tw, strings.Join(line, "\t"))
		}
		tw.Flush()
	}
	if page.Next != nil {
		fmt.Fprintf(stderr, "more rows: --after %s\n", show(page.Next))
	} else if len(page.Rows) == 0 && !asJSON {
		fmt.Fprintf(stderr, "no %s rows in %s\n", st, t.Name)
	}
	return nil
}

// rowColumns are the page's columns (every row has the same).
func rowColumns(p sqlxbroker.ListPage) []string {
	if len(p.Rows) == 0 {
		return nil
	}
	return p.Rows[0].Columns
}

// idArg reads an id from the command line: an integer as int64, anything
// else as text.
func idArg(s string) any {
	s = strings.TrimSpace(s)
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		return n
	}
	return s
}

func show(v any) string {
	switch v := v.(type) {
	case nil:
		return "NULL"
	case []byte:
		return string(v)
	case time.Time:
		return v.UTC().Format(time.RFC3339Nano)
	}
	return fmt.Sprint(v)
}

func jsonValue(v any) any {
	if b, ok := v.([]byte); ok {
		return string(b)
	}
	return v
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

// cut shortens s to n runes, marking the cut.
func cut(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}

// ---- requeue, delete, prune ----

// idList is --id: repeated, or comma-separated.
type idList []any

func (l *idList) String() string {
	parts := make([]string, len(*l))
	for i, v := range *l {
		parts[i] = fmt.Sprint(v)
	}
	return strings.Join(parts, ",")
}

func (l *idList) Set(s string) error {
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p == "" {
			return fmt.Errorf("empty id in %q", s)
		}
		*l = append(*l, idArg(p))
	}
	return nil
}

// selectFlags are --id, --all and --batch.
type selectFlags struct {
	ids   idList
	all   bool
	batch int
}

func (s *selectFlags) register(fs *flag.FlagSet, what string) {
	fs.Var(&s.ids, "id", what+" rows by id: repeat, or give a comma-separated list")
	fs.BoolVar(&s.all, "all", false, "every row in the state")
	fs.IntVar(&s.batch, "batch", 0, "most rows per statement (0: the library's 1,000)")
}

func (s *selectFlags) selection(cmd string) (sqlxbroker.Select, error) {
	switch {
	case s.all && len(s.ids) > 0:
		return sqlxbroker.Select{}, fmt.Errorf("%s: give --id or --all, not both", cmd)
	case !s.all && len(s.ids) == 0:
		return sqlxbroker.Select{}, fmt.Errorf("%s: no rows selected: give --id ID[,ID..] or --all", cmd)
	case s.batch < 0:
		return sqlxbroker.Select{}, fmt.Errorf("%s: negative --batch %d", cmd, s.batch)
	}
	return sqlxbroker.Select{IDs: s.ids, All: s.all, BatchSize: s.batch}, nil
}

func requeueCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var sel selectFlags
	o := newOpsFlags("requeue", requeueUsage, stderr, func(fs *flag.FlagSet) { sel.register(fs, "dead") })
	if err := o.parse(args); err != nil {
		return helpOK(err)
	}
	s, err := sel.selection("requeue")
	if err != nil {
		return err
	}
	b, tables, closeFn, err := o.open(ctx)
	if err != nil {
		return err
	}
	defer closeFn()
	t, err := one("requeue", tables)
	if err != nil {
		return err
	}
	if t.DeadAt == "" {
		return fmt.Errorf("requeue: table %q has no dead rows to requeue: describe its dead time column (--dead-at)", t.Name)
	}
	n, err := b.Requeue(ctx, t, s)
	fmt.Fprintf(stdout, "requeued %d dead rows of %s\n", n, t.Name)
	return err
}

func deleteCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var sel selectFlags
	var state string
	o := newOpsFlags("delete", deleteUsage, stderr, func(fs *flag.FlagSet) {
		sel.register(fs, "")
		fs.StringVar(&state, "state", "", "the state of the rows to delete: dead, done, scheduled or ready (required)")
	})
	if err := o.parse(args); err != nil {
		return helpOK(err)
	}
	if state == "" {
		return errors.New("delete: --state is required (dead, done, scheduled or ready)")
	}
	st, err := sqlxbroker.ParseState(state)
	if err != nil {
		return err
	}
	s, err := sel.selection("delete")
	if err != nil {
		return err
	}
	b, tables, closeFn, err := o.open(ctx)
	if err != nil {
		return err
	}
	defer closeFn()
	t, err := one("delete", tables)
	if err != nil {
		return err
	}
	n, err := b.Delete(ctx, t, sqlxbroker.DeleteParams{State: st, Select: s})
	fmt.Fprintf(stdout, "deleted %d %s rows of %s\n", n, st, t.Name)
	return err
}

func pruneCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var older time.Duration
	var batch int
	o := newOpsFlags("prune", pruneUsage, stderr, func(fs *flag.FlagSet) {
		fs.DurationVar(&older, "older-than", -1, "delete done rows done longer ago than this, e.g. 168h (required)")
		fs.IntVar(&batch, "batch", 0, "most rows per statement (0: the library's 1,000)")
	})
	if err := o.parse(args); err != nil {
		return helpOK(err)
	}
	set := false
	o.fs.Visit(func(f *flag.Flag) { set = set || f.Name == "older-than" })
	if !set {
		return errors.New("prune: --older-than DURATION is required (e.g. 168h; 0s prunes every done row)")
	}
	if older < 0 {
		return fmt.Errorf("prune: negative --older-than %v", older)
	}
	b, tables, closeFn, err := o.open(ctx)
	if err != nil {
		return err
	}
	defer closeFn()
	t, err := one("prune", tables)
	if err != nil {
		return err
	}
	if t.DoneAt == "" {
		return fmt.Errorf("prune: table %q keeps no done rows: describe its done time column (--done-at)", t.Name)
	}
	n, err := b.Prune(ctx, t, sqlxbroker.PruneParams{OlderThan: older, BatchSize: batch})
	fmt.Fprintf(stdout, "pruned %d done rows of %s older than %v\n", n, t.Name, older)
	return err
}
