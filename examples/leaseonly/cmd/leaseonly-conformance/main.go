// Command leaseonly-conformance runs the conformance suite on the example
// dialect: leaseonly-conformance --driver example-sqlite --dsn 'file:/tmp/x.db?_pragma=busy_timeout(10000)'.
package main

import (
	"os"

	"github.com/sqlxbroker/sqlxbroker/conformance"
	_ "github.com/sqlxbroker/sqlxbroker/examples/leaseonly"
)

func main() { os.Exit(conformance.Main(os.Args[1:])) }
