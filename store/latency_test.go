package store

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestLatencyBuckets(t *testing.T) {
	var l Latency
	l.Observe(0)
	l.Observe(LatencyBounds[0])                    // at a bound: that bucket
	l.Observe(LatencyBounds[0] + 1)                // just above: the next
	l.Observe(LatencyBounds[len(LatencyBounds)-1]) // the largest bound
	l.Observe(time.Hour)                           // beyond every bound
	s := l.Snapshot()
	require.Equal(t, uint64(2), s.Counts[0])
	require.Equal(t, uint64(1), s.Counts[1])
	require.Equal(t, uint64(1), s.Counts[len(LatencyBounds)-1])
	require.Equal(t, uint64(1), s.Counts[len(LatencyBounds)])
	require.Equal(t, uint64(5), s.Count())
	require.Equal(t, 2*LatencyBounds[0]+1+LatencyBounds[len(LatencyBounds)-1]+time.Hour, s.Sum)
	require.Equal(t, uint64(10), s.Add(s).Count())
}
