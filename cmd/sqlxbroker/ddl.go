package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/sqlxbroker/sqlxbroker"
)

const ddlUsage = `usage: sqlxbroker ddl --driver NAME (--table NAME [columns] | --tables FILE --table NAME) [flags]

Prints the recommended DDL for the described table (Broker.TableDDL: the
table and the indexes its claims and the operations' counts use), for a
migration tool: --format goose prints one goose SQL migration (-- +goose Up
/ -- +goose Down); --format migrate prints golang-migrate's up and down
files as two labelled blocks, or writes NAME.up.sql and NAME.down.sql into
--out DIR; plain (the default) prints the up statements and the down ones
as comments. Down drops the table, its indexes with it. No database is
needed: --dsn is not read.

Payload columns: --payload name:type, repeated; types text, bigint, int,
bool, timestamp, bytes.

`

// payloadFlag is --payload name:type, repeated.
type payloadFlag [][2]string

func (p *payloadFlag) String() string {
	parts := make([]string, len(*p))
	for i, c := range *p {
		parts[i] = c[0] + ":" + c[1]
	}
	return strings.Join(parts, ",")
}

func (p *payloadFlag) Set(s string) error {
	for _, part := range strings.Split(s, ",") {
		name, typ, ok := strings.Cut(strings.TrimSpace(part), ":")
		if !ok || name == "" || typ == "" {
			return fmt.Errorf("%q is not name:type (types: text, bigint, int, bool, timestamp, bytes)", part)
		}
		*p = append(*p, [2]string{name, typ})
	}
	return nil
}

// migration is a table's DDL as up and down statements.
type migration struct{ up, down []string }

func ddlCmd(_ context.Context, args []string, stdout, stderr io.Writer) error {
	var format, out, name string
	var payload payloadFlag
	o := newOpsFlags("ddl", ddlUsage, stderr, func(fs *flag.FlagSet) {
		fs.StringVar(&format, "format", "plain", "plain, goose or migrate")
		fs.StringVar(&out, "out", "", "migrate: write NAME.up.sql and NAME.down.sql into this directory")
		fs.StringVar(&name, "name", "", "migrate --out: the files' name (default <UTC timestamp>_create_<table>)")
		fs.Var(&payload, "payload", "payload column name:type (repeat, or comma-separate)")
	})
	if err := o.parse(args); err != nil {
		return helpOK(err)
	}
	switch format {
	case "plain", "goose", "migrate":
	default:
		return fmt.Errorf("ddl: unknown --format %q (plain, goose or migrate)", format)
	}
	if out != "" && format != "migrate" {
		return fmt.Errorf("ddl: --out writes golang-migrate files: give --format migrate")
	}
	if *o.driver == "" {
		return fmt.Errorf("ddl: --driver is required (%s)", strings.Join(sqlxbroker.Dialects(), ", "))
	}
	tables, err := o.tables()
	if err != nil {
		return fmt.Errorf("ddl: %w", err)
	}
	t, err := one("ddl", tables)
	if err != nil {
		return err
	}
	m, err := tableMigration(*o.driver, t, payload)
	if err != nil {
		return err
	}
	up, down := sqlText(m.up), sqlText(m.down)
	switch format {
	case "goose":
		fmt.Fprintf(stdout, "-- +goose Up\n%s\n-- +goose Down\n%s", up, down)
	case "migrate":
		if name == "" {
			name = time.Now().UTC().Format("20060102150405") + "_create_" + strings.ReplaceAll(t.Name, ".", "_")
		}
		if strings.ContainsAny(name, `/\`) {
			return fmt.Errorf("ddl: --name %q: a file name, not a path", name)
		}
		if out == "" {
			fmt.Fprintf(stdout, "-- %s.up.sql\n%s\n-- %s.down.sql\n%s", name, up, name, down)
			return nil
		}
		files := [][2]string{{name + ".up.sql", up}, {name + ".down.sql", down}}
		for _, f := range files {
			path := filepath.Join(out, f[0])
			if _, err := os.Stat(path); err == nil {
				return fmt.Errorf("ddl: %s exists; not overwritten", path)
			} else if !errors.Is(err, os.ErrNotExist) {
				return err
			}
		}
		for _, f := range files {
			path := filepath.Join(out, f[0])
			if err := os.WriteFile(path, []byte(f[1]), 0o644); err != nil {
				return err
			}
			fmt.Fprintln(stdout, "wrote", path)
		}
	default:
		fmt.Fprintf(stdout, "%s\n-- down:\n%s", up, "-- "+strings.ReplaceAll(strings.TrimSuffix(down, "\n"), "\n", "\n-- ")+"\n")
	}
	return nil
}

// tableMigration is t's recommended DDL for the driver's dialect and the
// statement that undoes it.
func tableMigration(driver string, t sqlxbroker.Table, payload [][2]string) (migration, error) {
	d, err := sqlxbroker.Lookup(driver)
	if err != nil {
		return migration{}, err
	}
	b := sqlxbroker.OpenDialect(nil, d) // DDL needs no database
	up, err := b.TableDDL(t, payload...)
	if err != nil {
		return migration{}, err
	}
	p, err := b.Plan(t)
	if err != nil {
		return migration{}, err
	}
	return migration{up: up, down: []string{"DROP TABLE IF EXISTS " + p.QTable}}, nil
}

// sqlText ends each statement with a semicolon, one blank line apart.
func sqlText(stmts []string) string {
	var sb strings.Builder
	for i, s := range stmts {
		if i > 0 {
			sb.WriteString("\n")
		}
		sb.WriteString(strings.TrimRight(s, "; \n") + ";\n")
	}
	return sb.String()
}
