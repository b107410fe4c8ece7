package replication_test

import (
	"math"
	"testing"

	"github.com/oncewal/oncewal/replication"
	"github.com/stretchr/testify/require"
)

// TestNextEpoch: the next epoch is the highest seen + 1, up to MaxEpoch, and
// never wraps.
func TestNextEpoch(t *testing.T) {
	for _, tc := range []struct {
		highest, want uint64
		exhausted     bool
	}{
		{0, 1, false},
		{41, 42, false},
		{replication.MaxEpoch - 1, replication.MaxEpoch, false},
		{replication.MaxEpoch, 0, true},
		{math.MaxUint64, 0, true}, // never wraps to 0
	} {
		got, err := replication.NextEpoch(tc.highest, "test")
		if tc.exhausted {
			require.ErrorIs(t, err, replication.ErrEpochExhausted, "%d", tc.highest)
			continue
		}
		require.NoError(t, err)
		require.Equal(t, tc.want, got)
	}
}

// TestCheckEpoch: an epoch above MaxEpoch is refused with
// ErrEpochExhausted, naming where it came from.
func TestCheckEpoch(t *testing.T) {
	require.NoError(t, replication.CheckEpoch("--epoch", replication.MaxEpoch))
	err := replication.CheckEpoch("--epoch", replication.MaxEpoch+1)
	require.ErrorIs(t, err, replication.ErrEpochExhausted)
	require.ErrorContains(t, err, "--epoch")
}
