package follower_test

import (
	"testing"

	"github.com/oncewal/oncewal/internal/keyspace"
	"github.com/oncewal/oncewal/store"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/oncewal/oncewal/corruption"
	"github.com/stretchr/testify/require"
)

// TestIdentityThatDoesNotDecodeIsCorruption: a recorded identity of the
// wrong size or version is in the corruption class, not "no identity".
func TestIdentityThatDoesNotDecodeIsCorruption(t *testing.T) {
	db, err := pebble.Open("", &pebble.Options{FS: vfs.NewMem()})
	require.NoError(t, err)
	defer db.Close()
	require.NoError(t, db.Set([]byte(keyspace.MetaIdentity), []byte{0xff, 1}, nil))
	_, ok, err := store.ReadIdentity(db)
	require.False(t, ok)
	require.ErrorIs(t, err, corruption.Err)
}
