package core

import (
	"errors"
	"fmt"
)

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

	// ErrClosed: the subscription or form is stopped.
	ErrClosed = errors.New("sqlxbroker: closed")
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
		return []error{ErrInvalidTable, e.Err}
	}
	return []error{ErrInvalidTable}
}

// VersionError reports a server older than a form needs. It matches
// ErrServerTooOld.
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
func (e *VersionError) Unwrap() error { return ErrServerTooOld }

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
func (e *FormError) Unwrap() error { return ErrFormUnavailable }
