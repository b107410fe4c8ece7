package follower_test

import (
	"testing"

	"github.com/oncewal/oncewal/internal/keyspace"
	"github.com/oncewal/oncewal/store"

	"github.com/oncewal/oncewal/corruption"
	"github.com/oncewal/oncewal/testutil"
	"github.com/stretchr/testify/require"
)

// TestIdentityThatDoesNotDecodeIsCorruption: a recorded identity of the
// wrong size or version is in the corruption class, not "no identity".
func TestIdentityThatDoesNotDecodeIsCorruption(t *testing.T) {
	db := testutil.MemDB(t)
	require.NoError(t, db.Set([]byte(keyspace.MetaIdentity), []byte{0xff, 1}, nil))
	_, ok, err := store.ReadIdentity(db)
	require.False(t, ok)
	require.ErrorIs(t, err, corruption.Err)
}
