package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/sqlxbroker/sqlxbroker"
)

// describeUsage explains the table description flags every operations
// command takes.
const describeUsage = `The table is described by flags mirroring sqlxbroker.Table (--table NAME,
--id, --attempt, --order, --locked-until, --lease, --advisory-lock, --group,
--ready-at, --dead-at, --max-attempts, --done-at, --last-error, --metadata), or by
--tables FILE: a JSON array of objects whose keys are the same names in
snake_case, e.g.

  [{"name": "jobs", "ready_at": "ready_at", "dead_at": "dead_at",
    "locked_until": "locked_until", "lease": "30s", "last_error": "last_error"}]

Unknown keys are refused. With --tables, --table NAME picks one table of
the file.
`

// tableJSON is one table of a --tables file: sqlxbroker.Table's fields in
// snake_case, the lease as a Go duration ("30s").
type tableJSON struct {
	Name         string `json:"name"`
	ID           string `json:"id"`
	Attempt      string `json:"attempt"`
	Order        string `json:"order"`
	LockedUntil  string `json:"locked_until"`
	Lease        string `json:"lease"`
	AdvisoryLock string `json:"advisory_lock"`
	Group        string `json:"group"`
	ReadyAt      string `json:"ready_at"`
	DeadAt       string `json:"dead_at"`
	MaxAttempts  int    `json:"max_attempts"`
	DoneAt       string `json:"done_at"`
	LastError    string `json:"last_error"`
	Metadata     string `json:"metadata"`
}

func (j tableJSON) table() (sqlxbroker.Table, error) {
	t := sqlxbroker.Table{Name: j.Name, ID: j.ID, Attempt: j.Attempt, Order: j.Order,
		LockedUntil: j.LockedUntil, AdvisoryLock: j.AdvisoryLock, Group: j.Group,
		ReadyAt: j.ReadyAt, DeadAt: j.DeadAt, MaxAttempts: j.MaxAttempts, DoneAt: j.DoneAt, LastError: j.LastError,
		Metadata: j.Metadata}
	if j.Lease != "" {
		d, err := time.ParseDuration(j.Lease)
		if err != nil {
			return t, fmt.Errorf("lease: %w", err)
		}
		t.Lease = d
	}
	return t, nil
}

// describeFlags registers the table description flags on fs and returns
// the function that, after fs.Parse, builds the described tables and
// validates each (Table.Validate: a *sqlxbroker.TableError naming the
// field). The description comes from the flags (one table) or from
// --tables FILE (every table of the file, or the one --table names), not
// from both.
func describeFlags(fs *flag.FlagSet) func() ([]sqlxbroker.Table, error) {
	var f tableJSON
	var lease time.Duration
	file := fs.String("tables", "", "JSON file describing the tables (an array of objects with the flags' names in snake_case)")
	fs.StringVar(&f.Name, "table", "", "the table (\"jobs\" or \"schema.jobs\"); with --tables, the one table of the file to use")
	// Commands whose --id is a row id (requeue, delete) register it first;
	// the id column is then --id-column.
	idFlag := "id"
	if fs.Lookup("id") != nil {
		idFlag = "id-column"
	}
	fs.StringVar(&f.ID, idFlag, "", "primary key column (default \"id\")")
	fs.StringVar(&f.Attempt, "attempt", "", "attempt column (default \"attempt\")")
	fs.StringVar(&f.Order, "order", "", "claim order column (default the id column)")
	fs.StringVar(&f.LockedUntil, "locked-until", "", "lease column: selects the lease form")
	fs.DurationVar(&lease, "lease", 0, "lease duration, whole seconds (default 30s)")
	fs.StringVar(&f.AdvisoryLock, "advisory-lock", "", "advisory key template, e.g. \"acct-{account}\": selects the advisory form")
	fs.StringVar(&f.Group, "group", "", "FIFO group column")
	fs.StringVar(&f.ReadyAt, "ready-at", "", "ready time column")
	fs.StringVar(&f.DeadAt, "dead-at", "", "dead time column")
	fs.IntVar(&f.MaxAttempts, "max-attempts", 0, "deliveries a row gets (0: unlimited)")
	fs.StringVar(&f.DoneAt, "done-at", "", "done time column")
	fs.StringVar(&f.LastError, "last-error", "", "last error column")
	fs.StringVar(&f.Metadata, "metadata", "", "metadata column (the publisher's trace context)")
	return func() ([]sqlxbroker.Table, error) {
		described := map[string]bool{}
		fs.Visit(func(fl *flag.Flag) {
			if fl.Name == idFlag || describeNames[fl.Name] {
				described[fl.Name] = true
			}
		})
		if *file == "" {
			if f.Name == "" {
				return nil, errors.New("no table described: give --table NAME (and its columns) or --tables FILE")
			}
			t, _ := f.table()
			t.Lease = lease
			if err := t.Validate(); err != nil {
				return nil, err
			}
			return []sqlxbroker.Table{t}, nil
		}
		if len(described) > 0 {
			names := make([]string, 0, len(described))
			fs.Visit(func(fl *flag.Flag) {
				if described[fl.Name] {
					names = append(names, "--"+fl.Name)
				}
			})
			return nil, fmt.Errorf("--tables %s describes the tables: drop %s (or describe one table by flags alone)", *file, strings.Join(names, ", "))
		}
		all, err := readTables(*file)
		if err != nil {
			return nil, err
		}
		if f.Name == "" {
			return all, nil
		}
		var names []string
		for _, t := range all {
			if t.Name == f.Name {
				return []sqlxbroker.Table{t}, nil
			}
			names = append(names, t.Name)
		}
		return nil, fmt.Errorf("--table %q is not in %s (it describes %s)", f.Name, *file, strings.Join(names, ", "))
	}
}

// describeNames are the flags describeFlags registers for a table's
// columns and settings (the id column's besides: --id or --id-column).
var describeNames = map[string]bool{
	"attempt": true, "order": true, "locked-until": true, "lease": true,
	"advisory-lock": true, "group": true, "ready-at": true, "dead-at": true, "max-attempts": true,
	"done-at": true, "last-error": true, "metadata": true,
}

// readTables reads and validates a --tables file.
func readTables(path string) ([]sqlxbroker.Table, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--tables: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var list []tableJSON
	if err := dec.Decode(&list); err != nil {
		return nil, fmt.Errorf("--tables %s: %w (want an array of objects with keys %s)", path, err, strings.Join(tableKeys(), ", "))
	}
	if dec.More() {
		return nil, fmt.Errorf("--tables %s: data after the array", path)
	}
	if len(list) == 0 {
		return nil, fmt.Errorf("--tables %s: no tables", path)
	}
	seen := map[string]bool{}
	out := make([]sqlxbroker.Table, 0, len(list))
	for i, j := range list {
		t, err := j.table()
		if err != nil {
			return nil, fmt.Errorf("--tables %s: table %d (%q): %w", path, i+1, j.Name, err)
		}
		if err := t.Validate(); err != nil {
			return nil, fmt.Errorf("--tables %s: table %d: %w", path, i+1, err)
		}
		if seen[t.Name] {
			return nil, fmt.Errorf("--tables %s: table %q is described twice", path, t.Name)
		}
		seen[t.Name] = true
		out = append(out, t)
	}
	return out, nil
}

// tableKeys lists the keys a --tables object may have.
func tableKeys() []string {
	return []string{"name", "id", "attempt", "order", "locked_until", "lease", "advisory_lock", "group",
		"ready_at", "dead_at", "max_attempts", "done_at", "last_error", "metadata"}
}
