package store_test

import (
	"io"
	"log/slog"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/require"

	"github.com/oncewal/oncewal/store"
	"github.com/oncewal/oncewal/wal"
)

// TestViewReadsAndCannotWrite: the view an embedder gets reads what the
// store committed (a live view follows commits, a Snapshot does not) and
// offers no way to write — no pebble.Writer, and a live view's Close leaves
// the store open.
func TestViewReadsAndCannotWrite(t *testing.T) {
	st, err := store.Open("/s", &store.Options{FS: vfs.NewMem(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	defer st.Close()

	live, before := st.View(), st.Snapshot()
	var _ pebble.Reader = live
	_, writable := any(live).(pebble.Writer)
	require.False(t, writable, "a store.View must not be a pebble.Writer")

	raw, err := wal.AppendBatch(nil, 0, 1, 1, []wal.Event{{Op: wal.OpPut, Session: [16]byte{1}, Seq: 1, Time: 1, Key: []byte("k")}})
	require.NoError(t, err)
	_, err = st.Apply(raw)
	require.NoError(t, err)

	pos, ok, err := store.ReadPosition(live)
	require.NoError(t, err)
	require.True(t, ok)
	require.EqualValues(t, 1, pos.AppliedLSN, "the live view sees the commit")
	old, _, err := store.ReadPosition(before)
	require.NoError(t, err)
	require.Zero(t, old.AppliedLSN, "the snapshot taken before the commit does not")
	require.NoError(t, before.Close())

	require.NoError(t, live.Close())
	_, err = st.Apply(raw) // the store is still open: a duplicate, not a closed error
	require.NoError(t, err)
	require.NotNil(t, live.Metrics())
}
