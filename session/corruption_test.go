package session_test

import (
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/oncewal/oncewal/corruption"
	"github.com/oncewal/oncewal/session"
	"github.com/stretchr/testify/require"
)

// TestCorruptRecordIsCorruption: an HWM record that does not decode is
// session.ErrCorrupt and in the corruption class.
func TestCorruptRecordIsCorruption(t *testing.T) {
	db, err := pebble.Open("", &pebble.Options{FS: vfs.NewMem()})
	require.NoError(t, err)
	defer db.Close()
	id := session.NewID()
	require.NoError(t, db.Set(append([]byte(session.HWMPrefix), id[:]...), []byte{1, 2, 3}, nil))
	tr, err := session.OpenTracker(db, nil)
	require.NoError(t, err)
	_, _, _, err = tr.Get(id)
	require.ErrorIs(t, err, session.ErrCorrupt)
	require.ErrorIs(t, err, corruption.Err)
}
