package store

import (
	"sync/atomic"
	"time"
)

// LatencyBounds are the upper bounds of a Latency's buckets: from 50µs (an
// unsynced commit) through the ~0.25–1ms of a synced one on local disks to
// the seconds of a stalled disk.
var LatencyBounds = [...]time.Duration{
	50 * time.Microsecond, 100 * time.Microsecond, 250 * time.Microsecond, 500 * time.Microsecond,
	time.Millisecond, 2500 * time.Microsecond, 5 * time.Millisecond, 10 * time.Millisecond,
	25 * time.Millisecond, 50 * time.Millisecond, 100 * time.Millisecond, 250 * time.Millisecond,
	500 * time.Millisecond, time.Second, 2500 * time.Millisecond, 5 * time.Second, 10 * time.Second,
}

// Latency is a fixed-bucket histogram of durations, safe for concurrent use
// without locks (what a metrics exporter turns into a Prometheus
// histogram).
type Latency struct {
	counts [len(LatencyBounds) + 1]atomic.Uint64
	sum    atomic.Int64
}

// Observe records one duration.
func (l *Latency) Observe(d time.Duration) {
	i := 0
	for i < len(LatencyBounds) && d > LatencyBounds[i] {
		i++
	}
	l.counts[i].Add(1)
	l.sum.Add(int64(d))
}

// Snapshot returns the counts so far.
func (l *Latency) Snapshot() LatencySnapshot {
	var s LatencySnapshot
	for i := range l.counts {
		s.Counts[i] = l.counts[i].Load()
	}
	s.Sum = time.Duration(l.sum.Load())
	return s
}

// LatencySnapshot is a Latency's counts: Counts[i] durations were at most
// LatencyBounds[i] and above the bound before it (not cumulative); the last
// count is beyond the largest bound.
type LatencySnapshot struct {
	Counts [len(LatencyBounds) + 1]uint64
	Sum    time.Duration
}

// Count is the number of durations observed.
func (s LatencySnapshot) Count() uint64 {
	var n uint64
	for _, c := range s.Counts {
		n += c
	}
	return n
}

// Add returns the bucket-wise sum of s and o.
func (s LatencySnapshot) Add(o LatencySnapshot) LatencySnapshot {
	for i := range s.Counts {
		s.Counts[i] += o.Counts[i]
	}
	s.Sum += o.Sum
	return s
}
