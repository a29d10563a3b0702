package forms

import "sync"

const (
	// maxBatch is the most completions (or renewals) written in one
	// statement.
	maxBatch = 1000
	// flushers is the most completion batches written at once.
	flushers = 2
)

// batcher is the completion queue of the lease and advisory forms: Complete
// adds a claim and returns; up to flushers goroutines take what has queued,
// at most maxBatch at a time, and write it (flush), so whatever queues
// while they are busy goes in the next batch. A slice under a mutex rather
// than a channel, so a thousand handlers completing at once do not contend
// on one channel. Each goroutine ends when the queue is empty.
type batcher[T any] struct {
	flush func([]T)
	most  int // goroutines writing batches at most; 0: flushers

	mu       sync.Mutex
	queue    []T
	flushing int  // goroutines writing batches
	closed   bool // add refuses: the caller writes alone
	wg       sync.WaitGroup
}

// add queues c for a batch; false once close was called.
func (b *batcher[T]) add(c T) bool {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return false
	}
	b.queue = append(b.queue, c)
	most := b.most
	if most == 0 {
		most = flushers
	}
	start := b.flushing < most
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
		n := min(len(b.queue), maxBatch)
		if n == 0 {
			b.queue = nil
			b.flushing--
			b.mu.Unlock()
			return
		}
		batch := b.queue[:n:n]
		b.queue = b.queue[n:]
		b.mu.Unlock()
		b.flush(batch)
	}
}

// close refuses further claims and returns once every queued one is
// written.
func (b *batcher[T]) close() {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	b.wg.Wait()
}
