package bench

import (
	"math"
	"sync/atomic"
	"time"
)

// hist is a lock-free latency histogram with logarithmic buckets: each
// bucket is 2% wider than the one before, from 1 µs to about 17 minutes, so
// a quantile is exact to within 2%. Record allocates nothing.
type hist struct {
	buckets [nBuckets]atomic.Int64
	count   atomic.Int64
}

const (
	growth   = 1.02
	nBuckets = 1100 // 1.02^1100 µs ≈ 2.7e9 µs
)

var logGrowth = math.Log(growth)

func bucketOf(d time.Duration) int {
	us := float64(d) / float64(time.Microsecond)
	if us <= 1 {
		return 0
	}
	i := int(math.Log(us)/logGrowth) + 1
	return min(i, nBuckets-1)
}

// upper is the largest duration bucket i holds.
func upper(i int) time.Duration {
	return time.Duration(math.Pow(growth, float64(i)) * float64(time.Microsecond))
}

func (h *hist) Record(d time.Duration) {
	h.buckets[bucketOf(d)].Add(1)
	h.count.Add(1)
}

func (h *hist) Count() int64 { return h.count.Load() }

// Quantile returns the q-quantile (0 < q <= 1), 0 with no samples.
func (h *hist) Quantile(q float64) time.Duration {
	n := h.count.Load()
	if n == 0 {
		return 0
	}
	rank := int64(math.Ceil(q * float64(n)))
	var seen int64
	for i := range h.buckets {
		seen += h.buckets[i].Load()
		if seen >= rank {
			return upper(i)
		}
	}
	return upper(nBuckets - 1)
}
