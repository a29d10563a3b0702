package core

import "errors"

// The sentinel errors, shared by the broker, the forms and the dialects;
// package sqlxbroker documents each for applications.
var (
	ErrLeaseLost        = errors.New("sqlxbroker: lease lost")             // a completion found its hold on the row lost; nothing changed
	ErrServerTooOld     = errors.New("sqlxbroker: server too old")         // the server is older than the form needs
	ErrFormUnavailable  = errors.New("sqlxbroker: claim form unavailable") // the dialect cannot offer the form
	ErrInvalidTable     = errors.New("sqlxbroker: invalid table description")
	ErrUnknownDialect   = errors.New("sqlxbroker: unknown dialect")
	ErrNoTx             = errors.New("sqlxbroker: delivery has no transaction") // Claim.Tx outside the row-lock form
	ErrAdvisoryConflict = errors.New("sqlxbroker: advisory keys held by another process")
	ErrClosed           = errors.New("sqlxbroker: closed")                                 // the broker (and its Pool) is closed
	ErrUnsupported      = errors.New("sqlxbroker: unsupported by the dialect")             // a call needs an optional capability the dialect lacks
	ErrConflict         = errors.New("sqlxbroker: conflict with a concurrent transaction") // rolled back whole (ConflictDetector); nothing it did stays
)
