// Package testreport marks, in a test's output, which databases the test
// really ran against and which it skipped and why. The test command
// (internal/testrun, README.md's) gathers the marks and prints them at the
// end of the run, so that a run without DSNs does not pass for one that
// tested every database.
//
// A mark is one log line: "sqlxbroker-db: tested <database> (<how>)" or
// "sqlxbroker-db: skipped <database>: <why>".
package testreport

// Prefix starts every mark.
const Prefix = "sqlxbroker-db: "

// TB is the part of testing.TB the marks use.
type TB interface {
	Helper()
	Logf(format string, args ...any)
	Skipf(format string, args ...any)
}

// Tested marks that t runs against database, reached as how (the
// environment variable that named it, for example).
func Tested(t TB, database, how string) {
	t.Helper()
	t.Logf("%stested %s (%s)", Prefix, database, how)
}

// Skip skips t, marking database as not tested because of why. The caller
// decides first whether a skip is allowed (SQLXBROKER_REQUIRE_DB=1 and the
// like turn it into a failure).
func Skip(t TB, database, why string) {
	t.Helper()
	t.Skipf("%sskipped %s: %s", Prefix, database, why)
}
