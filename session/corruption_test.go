package session_test

import (
	"testing"

	"github.com/oncewal/oncewal/corruption"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/testutil"
	"github.com/stretchr/testify/require"
)

// TestCorruptRecordIsCorruption: an HWM record that does not decode is
// session.ErrCorrupt and in the corruption class.
func TestCorruptRecordIsCorruption(t *testing.T) {
	db := testutil.MemDB(t)
	id := session.NewID()
	require.NoError(t, db.Set(append([]byte(session.HWMPrefix), id[:]...), []byte{1, 2, 3}, nil))
	tr, err := session.OpenTracker(db, nil)
	require.NoError(t, err)
	_, _, _, err = tr.Get(id)
	require.ErrorIs(t, err, session.ErrCorrupt)
	require.ErrorIs(t, err, corruption.Err)
}
