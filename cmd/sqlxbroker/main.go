// Command sqlxbroker runs the library's demo, its conformance suite against
// any database and its benchmark, and operates queues: counts, listing,
// requeue, delete, prune, and the recommended DDL for migrations.
//
//	sqlxbroker demo                 # embedded SQLite, no set-up
//	sqlxbroker conformance --driver postgres --dsn postgres://...
//	sqlxbroker soak --driver postgres --dsn postgres://... --restart-cmd '...'
//	sqlxbroker bench --driver postgres --dsn postgres://... --form all --concurrency 8,64
//	sqlxbroker stats --driver postgres --dsn postgres://... --tables tables.json --watch 2s
//	sqlxbroker requeue --driver postgres --dsn postgres://... --table jobs --dead-at dead_at --all
//	sqlxbroker ddl --driver postgres --table jobs --dead-at dead_at --format goose
package main

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"

	"github.com/sqlxbroker/sqlxbroker"
	"github.com/sqlxbroker/sqlxbroker/conformance"
)

const usage = `usage: sqlxbroker <command> [flags]

commands:
  demo          publish and drain messages (an embedded SQLite file, or --driver --dsn)
  conformance   run the conformance suite against a database (--driver, --dsn)
  soak          publish and consume with worker processes while killing them,
                their sessions and the server; audit nothing lost or done twice
  bench         measure deliveries/s, latency, connections and memory (--driver, --dsn)

operations (--driver, --dsn, and the table: --table NAME [columns] or --tables FILE):
  stats         counts per state of each table (--watch DURATION, --json)
  list          a page of a state's rows (--state, --limit, --after ID, --json)
  requeue       make dead rows ready again (--id ID,... or --all)
  delete        delete rows of a state (--state, --id ID,... or --all)
  prune         delete done rows older than a duration (--older-than)
  serve         the web dashboard of the described tables (127.0.0.1:8080, read-only without --actions)
  ddl           print the recommended DDL for goose or golang-migrate (--format)

Run a command with -h for its flags.
`

// opsCommands are the operations commands, run in-process by the tests.
var opsCommands = map[string]func(ctx context.Context, args []string, stdout, stderr io.Writer) error{
	"stats":   statsCmd,
	"list":    listCmd,
	"requeue": requeueCmd,
	"delete":  deleteCmd,
	"prune":   pruneCmd,
	"serve":   serveCmd,
	"ddl":     ddlCmd,
}

// drivers lists the names --driver takes in a command that opens a
// database: those this binary has both a dialect and a database/sql driver
// for. A dialect may serve a driver the binary does not link ("pgx").
func drivers() string {
	var out []string
	linked := sql.Drivers()
	for _, d := range sqlxbroker.Dialects() {
		if slices.Contains(linked, d) {
			out = append(out, d)
		}
	}
	return strings.Join(out, ", ")
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	var err error
	if cmd, ok := opsCommands[os.Args[1]]; ok {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
		err = cmd(ctx, os.Args[2:], os.Stdout, os.Stderr)
		stop()
		if err != nil {
			msg := err.Error()
			if !strings.HasPrefix(msg, "sqlxbroker: ") {
				msg = "sqlxbroker: " + msg
			}
			fmt.Fprintln(os.Stderr, msg)
			os.Exit(1)
		}
		return
	}
	switch os.Args[1] {
	case "demo":
		err = demo(os.Args[2:])
	case "conformance":
		os.Exit(conformance.Main(os.Args[2:]))
	case "soak":
		err = soakCmd(os.Args[2:])
	case "soak-worker": // started by soak, configured through its environment
		err = soakWorker()
	case "bench":
		err = benchCmd(os.Args[2:])
	case "bench-worker": // started by bench --procs, configured through its environment
		err = benchWorker()
	case "-h", "--help", "help":
		fmt.Print(usage)
		return
	default:
		fmt.Fprintf(os.Stderr, "sqlxbroker: unknown command %q\n%s", os.Args[1], usage)
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "sqlxbroker:", err)
		os.Exit(1)
	}
}
