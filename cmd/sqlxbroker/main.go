// Command sqlxbroker runs the library's demo, its conformance suite against
// any database, and its benchmark.
//
//	sqlxbroker demo                 # embedded SQLite, no set-up
//	sqlxbroker conformance --driver postgres --dsn postgres://...
//	sqlxbroker soak --driver postgres --dsn postgres://... --restart-cmd '...'
//	sqlxbroker bench --driver postgres --dsn postgres://... --form all --concurrency 8,64
package main

import (
	"fmt"
	"os"

	"github.com/sqlxbroker/sqlxbroker/conformance"
)

const usage = `usage: sqlxbroker <command> [flags]

commands:
  demo          publish and drain messages on an embedded SQLite file
  conformance   run the conformance suite against a database (--driver, --dsn)
  soak          publish and consume with worker processes while killing them,
                their sessions and the server; audit nothing lost or done twice
  bench         measure deliveries/s, latency, connections and memory (--driver, --dsn)
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	var err error
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
