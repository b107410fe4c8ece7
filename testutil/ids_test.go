package testutil_test

import (
	"math/rand/v2"
	"testing"

	"github.com/oncewal/oncewal/testutil"
	"github.com/stretchr/testify/require"
)

// TestSessionIDFollowsTheSeed: one seed, one sequence of IDs; IDs differ.
func TestSessionIDFollowsTheSeed(t *testing.T) {
	a, b := rand.New(rand.NewPCG(1, 2)), rand.New(rand.NewPCG(1, 2))
	seen := map[[16]byte]bool{}
	for range 100 {
		id := testutil.SessionID(a)
		require.Equal(t, id, testutil.SessionID(b))
		require.False(t, seen[id], "a repeated ID")
		seen[id] = true
	}
	require.NotEqual(t, testutil.SessionID(rand.New(rand.NewPCG(1, 3))), testutil.SessionID(rand.New(rand.NewPCG(1, 2))))
}
