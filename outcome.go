package sqlxbroker

import (
	"errors"
	"fmt"
	"time"
)

// PermanentError is a handler's failure that sends its row dead at once
// (Permanent). It unwraps to the handler's error.
type PermanentError struct{ Err error }

func (e *PermanentError) Error() string {
	if e.Err == nil {
		return "permanent failure"
	}
	return "permanent failure: " + e.Err.Error()
}

func (e *PermanentError) Unwrap() error { return e.Err }

// Permanent returns an error that sends the delivery's row dead at once,
// keeping err as its last error. A nil err is allowed.
func Permanent(err error) error { return &PermanentError{Err: err} }

// RetryAfterError is a handler's failure retried after Delay rather than
// after SubscribeParams.RetryDelay (RetryAfter). It unwraps to the
// handler's error.
type RetryAfterError struct {
	Delay time.Duration
	Err   error
}

func (e *RetryAfterError) Error() string {
	if e.Err == nil {
		return fmt.Sprintf("retry after %v", e.Delay)
	}
	return fmt.Sprintf("retry after %v: %v", e.Delay, e.Err)
}

func (e *RetryAfterError) Unwrap() error { return e.Err }

// RetryAfter returns an error that fails the delivery and returns its row
// no earlier than d from now (d below 0 counts as 0). The attempt is
// counted as for any failure, so the table's MaxAttempts still applies.
func RetryAfter(d time.Duration, err error) error {
	return &RetryAfterError{Delay: max(d, 0), Err: err}
}

// SnoozeError returns a row later without using an attempt (Snooze).
type SnoozeError struct{ Delay time.Duration }

func (e *SnoozeError) Error() string { return fmt.Sprintf("snoozed for %v", e.Delay) }

// Snooze returns an error that gives the delivery's row back to be
// delivered again d from now (d below 0 counts as 0): not a failure, so no
// attempt is used and nothing is logged or written to LastError.
func Snooze(d time.Duration) error { return &SnoozeError{Delay: max(d, 0)} }

// PanicError is the failure of a handler that panicked: Value is what it
// panicked with, Stack the goroutine's stack at the panic. Its text is the
// value only; the failure's log line carries the stack.
type PanicError struct {
	Value any
	Stack []byte
}

func (e *PanicError) Error() string { return fmt.Sprintf("handler panic: %v", e.Value) }

// Unwrap returns the panic value when it is an error.
func (e *PanicError) Unwrap() error {
	err, _ := e.Value.(error)
	return err
}

// asPermanent, asRetryAfter and asSnooze find the outcome errors in err.
func asPermanent(err error) bool {
	var pe *PermanentError
	return errors.As(err, &pe)
}

func asRetryAfter(err error) (time.Duration, bool) {
	var re *RetryAfterError
	if errors.As(err, &re) {
		return re.Delay, true
	}
	return 0, false
}

func asSnooze(err error) (time.Duration, bool) {
	var se *SnoozeError
	if errors.As(err, &se) {
		return se.Delay, true
	}
	return 0, false
}
