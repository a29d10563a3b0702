package forms

import (
	"sync"
	"sync/atomic"
	"time"
)

const (
	// maxBatch is the most completions (or renewals) written in one
	// statement.
	maxBatch = 1000
	// flushers is the most completion batches written at once.
	flushers = 2
)

// batcher is the completion queue of the lease and advisory forms: Complete
// adds a claim and returns; up to most goroutines take what has queued, at
// most maxBatch at a time, and write it (flush), so whatever queues while
// they are busy goes in the next batch. A slice under a mutex rather than a
// channel, so a thousand handlers completing at once do not contend on one
// channel. Each goroutine ends when the queue is empty.
//
// With linger set, a batch is collected before it is written: while
// deliveries that were in work when the collection began (working) have not
// all joined the queue, the one collecting goroutine waits for them, for at
// most linger. The handlers of one claim mostly finish close together, and
// their completions then go in one statement rather than the first few
// alone and the rest after them. Only one goroutine collects; another
// starts only while every one running is writing, so one batch is written
// while the next grows.
type batcher[T any] struct {
	flush func([]T)
	most  int // goroutines writing batches at most; 0: flushers

	linger time.Duration
	// working counts, with linger, the deliveries in work whose
	// completions may join a batch: the form adds those it claims, and add
	// takes each out under the batcher's lock as it queues it, so a
	// collection always counts a delivery in working or in the queue,
	// never in neither (which would end it short and split the batch).
	working atomic.Int64

	mu         sync.Mutex
	queue      []T
	spare      []T  // a written batch's array, cleared: the next queue grows in it
	flushing   int  // goroutines collecting or writing batches
	collecting bool // one of them waits for its batch to grow
	target     int  // the queue length that ends the collection
	grown      chan struct{}
	closed     bool // add refuses: the caller writes alone
	wg         sync.WaitGroup
}

// add queues c for a batch; false once close was called.
func (b *batcher[T]) add(c T) bool {
	b.mu.Lock()
	if b.linger > 0 {
		b.working.Add(-1)
	}
	if b.closed {
		b.mu.Unlock()
		return false
	}
	if b.queue == nil && b.spare != nil {
		b.queue, b.spare = b.spare, nil
	}
	b.queue = append(b.queue, c)
	if b.collecting && len(b.queue) >= b.target {
		select {
		case b.grown <- struct{}{}:
		default:
		}
	}
	most := b.most
	if most == 0 {
		most = flushers
	}
	start := !b.collecting && b.flushing < most
	if start {
		b.flushing++
		b.wg.Add(1)
	}
	b.mu.Unlock()
	if start {
		go b.run()
	}
	return true
}

func (b *batcher[T]) run() {
	defer b.wg.Done()
	for {
		b.mu.Lock()
		if len(b.queue) > 0 && b.linger > 0 && !b.collecting {
			b.collect()
		}
		n := min(len(b.queue), maxBatch)
		if n == 0 || b.collecting {
			// Nothing to write, or another goroutine collects what
			// has queued: it writes that.
			if n == 0 {
				b.queue = nil // the next grows in the spare array
			}
			b.flushing--
			b.mu.Unlock()
			return
		}
		batch := b.queue[:n:n]
		b.queue = b.queue[n:]
		b.mu.Unlock()
		b.flush(batch)
		// The written claims go; their array is the next queue's (the
		// queue left behind lies past it).
		clear(batch)
		b.mu.Lock()
		if cap(batch) > cap(b.spare) {
			b.spare = batch[:0]
		}
		b.mu.Unlock()
	}
}

// collect waits, with b.mu held on entry and on return, until the
// deliveries in work when it began have joined the queue (or maxBatch
// have queued), for at most linger.
func (b *batcher[T]) collect() {
	b.target = min(len(b.queue)+int(b.working.Load()), maxBatch)
	if len(b.queue) >= b.target {
		return
	}
	if b.grown == nil {
		b.grown = make(chan struct{}, 1)
	}
	select {
	case <-b.grown: // a signal left from an earlier collection
	default:
	}
	b.collecting = true
	b.mu.Unlock()
	t := time.NewTimer(b.linger)
	select {
	case <-b.grown:
	case <-t.C:
	}
	t.Stop()
	b.mu.Lock()
	b.collecting = false
}

// close refuses further claims and returns once every queued one is
// written.
func (b *batcher[T]) close() {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	b.wg.Wait()
}
