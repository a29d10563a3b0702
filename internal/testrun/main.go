// Command testrun reads go test -json and reports on it; README.md's test
// command pipes the tests into it:
//
//	go test -json -race -count=1 -p 1 -timeout 15m ./... | go run ./internal/testrun
//
// It prints what go test prints (a line per package; the whole output of a
// package that fails), and ends with which databases the tests really ran
// against and which they skipped and why, from the marks the tests log
// (internal/testreport). It exits 1 when a package failed or nothing was
// read (run it with pipefail to keep go test's own status as well).
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"

	"github.com/sqlxbroker/sqlxbroker/internal/testreport"
)

// event is one line of go test -json (cmd/test2json).
type event struct {
	Action     string
	Package    string
	ImportPath string // build-output
	Test       string
	Output     string
	Elapsed    float64
}

func main() {
	r := newReport(os.Stdout)
	r.read(os.Stdin)
	r.summary()
	switch {
	case r.events == 0:
		fmt.Fprintln(os.Stderr, "testrun: read no go test -json events on standard input")
		os.Exit(1)
	case len(r.failed) > 0:
		fmt.Fprintf(os.Stderr, "testrun: %d package(s) failed: %s\n", len(r.failed), strings.Join(keys(r.failed), ", "))
		os.Exit(1)
	}
}

// report re-prints go test's output and gathers the database marks.
type report struct {
	w      io.Writer
	output map[string][]string // package: its output so far
	dbs    map[string]*database
	events int             // test2json events read
	failed map[string]bool // packages that failed
}

// database is what the marks said of one database.
type database struct {
	how     map[string]bool // tested: how it was reached
	tested  map[string]bool // packages that ran against it
	skipped map[string]bool // packages that skipped it
	why     map[string]bool // the reasons given for the skips
}

func newReport(w io.Writer) *report {
	return &report{w: w, output: map[string][]string{}, dbs: map[string]*database{}, failed: map[string]bool{}}
}

func (r *report) read(in io.Reader) {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var e event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil || e.Action == "" {
			fmt.Fprintln(r.w, sc.Text()) // not test2json: pass it on
			continue
		}
		r.event(e)
	}
}

func (r *report) event(e event) {
	r.events++
	switch e.Action {
	case "build-output":
		fmt.Fprint(r.w, e.Output)
	case "output":
		r.output[e.Package] = append(r.output[e.Package], e.Output)
		r.mark(e.Package, e.Output)
	case "pass", "fail", "skip":
		if e.Test != "" {
			return
		}
		lines := r.output[e.Package]
		delete(r.output, e.Package)
		if e.Action == "fail" {
			r.failed[short(e.Package)] = true
			for _, l := range lines {
				fmt.Fprint(r.w, l)
			}
			return
		}
		// A package that passed: go test's own last line for it ("ok",
		// or "?" without test files).
		for i := len(lines) - 1; i >= 0; i-- {
			if strings.HasPrefix(lines[i], "ok ") || strings.HasPrefix(lines[i], "? ") {
				fmt.Fprint(r.w, lines[i])
				return
			}
		}
		fmt.Fprintf(r.w, "ok  \t%s\t%.3fs\n", e.Package, e.Elapsed)
	}
}

// mark records a line "... sqlxbroker-db: tested NAME (HOW)" or
// "... sqlxbroker-db: skipped NAME: WHY".
func (r *report) mark(pkg, line string) {
	_, m, ok := strings.Cut(line, testreport.Prefix)
	if !ok {
		return
	}
	m = strings.TrimSpace(m)
	db := func(name string) *database {
		d := r.dbs[name]
		if d == nil {
			d = &database{how: map[string]bool{}, tested: map[string]bool{}, skipped: map[string]bool{}, why: map[string]bool{}}
			r.dbs[name] = d
		}
		return d
	}
	if rest, ok := strings.CutPrefix(m, "tested "); ok {
		name, how := rest, ""
		if i := strings.LastIndex(rest, " ("); i > 0 && strings.HasSuffix(rest, ")") {
			name, how = rest[:i], rest[i+2:len(rest)-1]
		}
		d := db(name)
		d.tested[short(pkg)] = true
		if how != "" {
			d.how[how] = true
		}
	} else if rest, ok := strings.CutPrefix(m, "skipped "); ok {
		name, why, _ := strings.Cut(rest, ": ")
		d := db(name)
		d.skipped[short(pkg)] = true
		d.why[why] = true
	}
}

func (r *report) summary() {
	if len(r.dbs) == 0 {
		fmt.Fprintln(r.w, "\nno test reported a database")
		return
	}
	fmt.Fprintln(r.w, "\ndatabases:")
	for _, name := range keys(r.dbs) {
		d := r.dbs[name]
		if len(d.tested) > 0 {
			fmt.Fprintf(r.w, "  tested   %s (%s) by %s\n", name, strings.Join(keys(d.how), ", "), strings.Join(keys(d.tested), ", "))
		}
		if len(d.skipped) > 0 {
			fmt.Fprintf(r.w, "  SKIPPED  %s by %s: %s\n", name, strings.Join(keys(d.skipped), ", "), strings.Join(keys(d.why), "; "))
		}
	}
}

// short drops the module path from a package's import path.
func short(pkg string) string {
	const mod = "github.com/sqlxbroker/sqlxbroker"
	if pkg == mod {
		return "."
	}
	return strings.TrimPrefix(pkg, mod+"/")
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
