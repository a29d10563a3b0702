package core

import "errors"

// Sentinel errors. Every error the library returns for one of these
// conditions matches the sentinel with errors.Is.
var (
	// ErrLeaseLost: a lease-form completion or renewal found another
	// claim's token (deadline) in the row, or no row at all; or an
	// advisory-form completion came after the session holding its key
	// ended. Nothing in the row was changed.
	ErrLeaseLost = errors.New("sqlxbroker: lease lost")

	// ErrServerTooOld: the database server is older than the lower bound
	// the dialect needs for the requested claim form.
	ErrServerTooOld = errors.New("sqlxbroker: server too old")

	// ErrFormUnavailable: the dialect cannot offer the claim form the table
	// description asks for.
	ErrFormUnavailable = errors.New("sqlxbroker: claim form unavailable")

	// ErrInvalidTable: the table description is invalid, or does not match
	// the live table.
	ErrInvalidTable = errors.New("sqlxbroker: invalid table description")

	// ErrUnknownDialect: no dialect is registered under the name asked for.
	ErrUnknownDialect = errors.New("sqlxbroker: unknown dialect")

	// ErrNoTx: Delivery.Tx was called on a delivery whose form holds no
	// transaction (only the row-lock form does).
	ErrNoTx = errors.New("sqlxbroker: delivery has no transaction")

	// ErrAdvisoryConflict: another process already uses the in-process
	// advisory keys of the same database (SQLite), so keys could not be
	// kept apart and a row could be delivered twice.
	ErrAdvisoryConflict = errors.New("sqlxbroker: advisory keys held by another process")

	// ErrClosed: the broker (or the pool it owns) is closed.
	ErrClosed = errors.New("sqlxbroker: closed")
)
