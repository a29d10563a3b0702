// Package sqlxbroker turns ordinary SQL tables into a message broker: rows
// are messages, a subscription claims ready rows and runs a handler for each,
// and a completion statement records the outcome.
//
// It runs on any database/sql driver through dialects (PostgreSQL,
// MySQL/MariaDB and SQLite are built in; blank-import the one you use) and
// offers three claim forms, chosen by the table description:
//
//   - row lock (no form named): SELECT .. FOR UPDATE SKIP LOCKED in a
//     transaction held open while the handler runs; the handler may write
//     through Delivery.Tx and its writes commit with the outcome;
//   - lease (Table.LockedUntil): a deadline written into the row; no
//     connection is held while the handler runs; completion is fenced by the
//     deadline and returns ErrLeaseLost when another claim took the row;
//   - advisory lock (Table.AdvisoryLock = "accounts-{account}"): rows with
//     equal keys run one at a time.
//
// A table with a Group column is FIFO: each group is delivered in order,
// one row at a time, across brokers.
package sqlxbroker

import "github.com/sqlxbroker/sqlxbroker/core"

// The core types under shorter names.
type (
	Table           = core.Table
	Delivery        = core.Delivery
	Handler         = core.Handler
	SubscribeParams = core.SubscribeParams
	Subscription    = core.Subscription
	Stats           = core.Stats
	Form            = core.Form
)

// The claim forms.
const (
	RowLock  = core.RowLock
	Lease    = core.Lease
	Advisory = core.Advisory
)

// Sentinel errors; see package core.
var (
	ErrLeaseLost        = core.ErrLeaseLost
	ErrServerTooOld     = core.ErrServerTooOld
	ErrFormUnavailable  = core.ErrFormUnavailable
	ErrInvalidTable     = core.ErrInvalidTable
	ErrUnknownDialect   = core.ErrUnknownDialect
	ErrNoTx             = core.ErrNoTx
	ErrAdvisoryConflict = core.ErrAdvisoryConflict
)
