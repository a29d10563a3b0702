// Package sqlxbrokertest helps an application test its own handlers and
// publishing code against sqlxbroker, on the application's test database:
//
//   - NewDelivery builds a *sqlxbroker.Delivery from a struct or a map, so
//     a handler can be called directly: ID, Attempt, Key, Columns, Value
//     and Scan behave as a claimed row's do, and Tx returns the
//     transaction given (sqlxbroker.ErrNoTx without one; BeginTx opens one
//     that the test's cleanup rolls back).
//   - NewRowLockDelivery claims a given row of a row-lock table for real:
//     SELECT .. FOR UPDATE in a claim transaction that Delivery.Tx returns,
//     so a handler's writes through Tx can be committed with the row's
//     outcome (Succeed), rolled back with a failure (Fail) or with the
//     whole claim (Release), and the test can read what was written.
//   - Drain publishes messages, runs a handler on a subscription until
//     nothing in the table is claimable, or fails at a deadline saying how
//     many rows are left in which state, and returns what was done.
//   - Published and RequirePublished read a table through the caller's
//     transaction (or pool), so a test that publishes in its own
//     transaction can check the rows before it rolls back; a mismatch
//     fails the test with the rows wanted and the rows found side by side.
//
// The helpers take a TB, which *testing.T and *testing.B satisfy. They
// depend on the standard library, sqlx, sqlxbroker and its core package
// only.
package sqlxbrokertest

// TB is the part of testing.TB the helpers use: *testing.T, *testing.B and
// *testing.F satisfy it. Fatalf must not return (testing's ends the test
// goroutine).
type TB interface {
	Helper()
	Cleanup(func())
	Logf(format string, args ...any)
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
}
