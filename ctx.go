package sqlxbroker

import (
	"context"
	"sync"
	"time"
)

// handlerCtx is the context a handler runs with: its worker's context plus
// a cancellation of its own (a lost lease), made without registering a
// child with the parent for every delivery. The worker cancels its current
// handlerCtx when its own context ends.
type handlerCtx struct {
	context.Context // the worker's

	mu   sync.Mutex
	done chan struct{} // made on the first Done
	err  error
}

func (c *handlerCtx) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done == nil {
		c.done = make(chan struct{})
		if c.err != nil {
			close(c.done)
		}
	}
	return c.done
}

func (c *handlerCtx) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// cancel ends c with err; later calls do nothing.
func (c *handlerCtx) cancel(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return
	}
	c.err = err
	if c.done != nil {
		close(c.done)
	}
}

// sharedDeadline hands out one context with a deadline to every caller
// within a second, so a busy subscription does not start a timer per
// completion. Each context's deadline is at least d after any call that
// returned it.
type sharedDeadline struct {
	d  time.Duration
	mu sync.Mutex
	// until is when ctx stops being handed out.
	until  time.Time
	ctx    context.Context
	cancel context.CancelFunc
}

func (s *sharedDeadline) get() context.Context {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ctx == nil || !now.Before(s.until) {
		// The previous context ends at its own deadline; its completions
		// may still be using it.
		s.until = now.Add(time.Second)
		s.ctx, s.cancel = context.WithDeadline(context.Background(), s.until.Add(s.d))
	}
	return s.ctx
}

// stop releases the last context's timer once nothing uses it.
func (s *sharedDeadline) stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cancel != nil {
		s.cancel()
	}
}
