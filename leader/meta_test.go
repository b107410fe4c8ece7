package leader_test

import (
	"testing"

	"github.com/oncewal/oncewal/internal/keyspace"
	"github.com/oncewal/oncewal/store"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/oncewal/oncewal/corruption"
	"github.com/stretchr/testify/require"
)

// TestMetaDecodeIsCorruption: a metadata value the codec does not recognise
// is reported as corruption (errors.Is corruption.Err), for the position and
// for the last batch's identity.
func TestMetaDecodeIsCorruption(t *testing.T) {
	goodPosition := append([]byte{1}, make([]byte, 8)...) // version 1, LSN 0
	for _, c := range []struct {
		name            string
		position, batch []byte
	}{
		{"position", []byte{0xff, 1, 2}, nil},
		{"last batch", goodPosition, []byte{0xff}},
	} {
		n := openNode(t, vfs.NewMem())
		require.NoError(t, n.db.Set([]byte(keyspace.MetaPosition), c.position, pebble.Sync))
		if c.batch != nil {
			require.NoError(t, n.db.Set([]byte(keyspace.MetaLastBatch), c.batch, pebble.Sync))
		}
		_, _, err := store.ReadLastBatch(n.db)
		require.ErrorIs(t, err, corruption.Err, c.name)
		require.NoError(t, n.db.Close())
	}
}
