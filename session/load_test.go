package session

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestLoadAndAdvanceLoaded: Load numbers a session once per tx (every Load
// of it returns the same slot) and returns the state Check decides from;
// AdvanceLoaded advances the session its slot names, falls back to the
// index for a slot that is not the session's, and refuses what Advance
// refuses.
func TestLoadAndAdvanceLoaded(t *testing.T) {
	db := memDB(t)
	tr := openTracker(t, db, nil)
	a, b := ID{1}, ID{2}
	batch := db.NewBatch()
	defer batch.Close()
	tx := tr.Begin(batch)
	defer tx.Abort()

	ha, sa, err := tx.Load(a)
	require.NoError(t, err)
	require.Equal(t, HWM{}, ha)
	_, sb, err := tx.Load(b)
	require.NoError(t, err)
	require.NotEqual(t, sa, sb)
	_, again, err := tx.Load(a)
	require.NoError(t, err)
	require.Equal(t, sa, again)

	require.NoError(t, tx.AdvanceLoaded(sa, a, 1, 10*hour))
	require.NoError(t, tx.AdvanceLoaded(sa, b, 1, 10*hour)) // a's slot, b's ID: looked up
	require.ErrorIs(t, tx.AdvanceLoaded(sb, b, 3, 10*hour), ErrNotNext)
	require.ErrorIs(t, tx.AdvanceLoaded(sa, a, 0, 10*hour), ErrZeroSeq)
	for _, id := range []ID{a, b} {
		h, err := tx.Peek(id)
		require.NoError(t, err)
		require.Equal(t, HWM{Seq: 1, LastTS: 10 * hour, Known: true}, h)
		d, err := tx.Check(id, 2, 10*hour)
		require.NoError(t, err)
		require.Equal(t, Apply, d)
	}
}
