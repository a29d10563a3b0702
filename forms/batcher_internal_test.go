package forms

import (
	"sync"
	"testing"
	"time"
)

// testBatcher is a batcher of ints whose batches are recorded, each
// written in about a statement's round trip, with n deliveries in work.
type testBatcher struct {
	b       *batcher[int]
	mu      sync.Mutex
	batches [][]int
	written chan struct{} // a receive per batch written
}

func newTestBatcher(linger time.Duration, n int) *testBatcher {
	tb := &testBatcher{written: make(chan struct{}, 1000)}
	tb.b = &batcher[int]{
		linger: linger,
		flush: func(batch []int) {
			time.Sleep(time.Millisecond)
			tb.mu.Lock()
			tb.batches = append(tb.batches, append([]int(nil), batch...))
			tb.mu.Unlock()
			tb.written <- struct{}{}
		},
	}
	tb.b.working.Store(int64(n))
	return tb
}

// done completes delivery i: it leaves working as it joins the queue.
func (tb *testBatcher) done(i int) {
	tb.b.add(i)
}

// together completes deliveries 0..n-1 from n goroutines at about once.
func (tb *testBatcher) together(n int) {
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(200 * time.Microsecond)
			tb.done(i)
		}()
	}
	wg.Wait()
}

func (tb *testBatcher) sizes() []int {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	var out []int
	for _, b := range tb.batches {
		out = append(out, len(b))
	}
	return out
}

// TestBatcherCollects: with linger set, the completions of deliveries that
// were in work together go in one batch, not the first alone and the rest
// after it; a batch whose deliveries do not all finish is written once
// linger has passed; without linger a completion is written at once.
func TestBatcherCollects(t *testing.T) {
	tb := newTestBatcher(5*time.Second, 500)
	tb.together(500)
	tb.b.close()
	if s := tb.sizes(); len(s) != 1 || s[0] != 500 {
		t.Errorf("500 deliveries finishing together, linger 5s: batches of %v, want one of 500", s)
	}

	// Two of three finish; the third runs on.
	const linger = 50 * time.Millisecond
	tb = newTestBatcher(linger, 3)
	start := time.Now()
	tb.done(0)
	tb.done(1)
	select {
	case <-tb.written:
	case <-time.After(10 * time.Second):
		t.Fatal("two of three deliveries finished: nothing written in 10 s")
	}
	if took := time.Since(start); took < linger {
		t.Errorf("two of three deliveries finished: written after %v, want after linger (%v)", took, linger)
	}
	tb.done(2)
	tb.b.close()
	if s := tb.sizes(); len(s) != 2 || s[0] != 2 || s[1] != 1 {
		t.Errorf("two of three deliveries finished, then the third: batches of %v, want [2 1]", s)
	}

	tb = newTestBatcher(0, 500)
	tb.done(0)
	select {
	case <-tb.written:
	case <-time.After(10 * time.Second):
		t.Fatal("no linger, one of 500 deliveries finished: nothing written in 10 s")
	}
	tb.b.close()
	if s := tb.sizes(); len(s) != 1 || s[0] != 1 {
		t.Errorf("no linger, one of 500 deliveries finished: batches of %v, want one of 1", s)
	}
}
