package sqlxbroker

import (
	"fmt"

	"github.com/sqlxbroker/sqlxbroker/core"
)

// Sentinel errors. Every error the library returns for one of these
// conditions matches the sentinel with errors.Is; the typed errors below
// carry the detail and unwrap to them.
var (
	// ErrLeaseLost: a lease-form completion found another claim's token
	// (deadline) in the row, or no row at all; or an advisory-form
	// completion came after the session holding its key ended. Nothing in
	// the row was changed; the row comes back to whoever holds it now.
	ErrLeaseLost = core.ErrLeaseLost

	// ErrServerTooOld: the database server is older than the claim form
	// needs (a *VersionError says which version and why).
	ErrServerTooOld = core.ErrServerTooOld

	// ErrFormUnavailable: the dialect cannot offer the claim form the table
	// description asks for (a *FormError says why).
	ErrFormUnavailable = core.ErrFormUnavailable

	// ErrInvalidTable: the table description is invalid, or does not match
	// the live table (a *TableError names the field).
	ErrInvalidTable = core.ErrInvalidTable

	// ErrUnknownDialect: no dialect is registered under the driver name
	// (the message says which package to import).
	ErrUnknownDialect = core.ErrUnknownDialect

	// ErrNoTx: Delivery.Tx was called in a form that holds no transaction
	// (only the row-lock form does).
	ErrNoTx = core.ErrNoTx

	// ErrAdvisoryConflict: another process already uses the in-process
	// advisory keys of the same database (SQLite), so keys could not be
	// kept apart and a row could be delivered twice.
	ErrAdvisoryConflict = core.ErrAdvisoryConflict

	// ErrClosed: the broker is closed (Broker.Close).
	ErrClosed = core.ErrClosed

	// ErrUnsupported: the call needs an optional capability the dialect
	// lacks (PublishParams.SkipDuplicates without core.DuplicateSkipper);
	// the message names the dialect and the capability. Nothing was
	// written. A Waker's Listen fails with it when the connection is set
	// up without wake-ups (PostgreSQL behind a transaction-mode pooler):
	// Subscribe then logs at Info, not Warn, and polls.
	ErrUnsupported = core.ErrUnsupported

	// ErrConflict: a lease claim or completion was rolled back whole
	// because a concurrent transaction won (a deadlock, or a multi-primary
	// cluster's certification failure: core.ConflictDetector). A claim
	// that conflicted delivered nothing and is made again; a completion
	// is run again, and matches it only when its retries ran out.
	ErrConflict = core.ErrConflict
)

// TableError names the table and the field of the description at fault.
// It matches ErrInvalidTable.
type TableError struct {
	Table  string // table name as given
	Field  string // field of the description, e.g. "LockedUntil"
	Reason string
	Err    error // optional cause
}

func (e *TableError) Error() string {
	s := fmt.Sprintf("sqlxbroker: table %q: %s: %s", e.Table, e.Field, e.Reason)
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Unwrap returns ErrInvalidTable and the cause.
func (e *TableError) Unwrap() []error {
	if e.Err != nil {
		return []error{core.ErrInvalidTable, e.Err}
	}
	return []error{core.ErrInvalidTable}
}

// VersionError reports a server older than a form needs. It matches
// core.ErrServerTooOld.
type VersionError struct {
	Server string // e.g. "PostgreSQL", "MariaDB"
	Found  string // the version the server reported
	Need   string // the lowest version that works
	Form   Form
	Reason string // what the newer version brings
}

func (e *VersionError) Error() string {
	return fmt.Sprintf("sqlxbroker: %s %s is too old for the %s form: need %s or newer (%s)",
		e.Server, e.Found, e.Form, e.Need, e.Reason)
}

// Unwrap returns ErrServerTooOld.
func (e *VersionError) Unwrap() error { return core.ErrServerTooOld }

// FormError reports a claim form the dialect cannot offer. It matches
// ErrFormUnavailable.
type FormError struct {
	Dialect string
	Form    Form
	Reason  string
}

func (e *FormError) Error() string {
	return fmt.Sprintf("sqlxbroker: dialect %s cannot offer the %s form: %s", e.Dialect, e.Form, e.Reason)
}

// Unwrap returns ErrFormUnavailable.
func (e *FormError) Unwrap() error { return core.ErrFormUnavailable }
