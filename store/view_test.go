package store_test

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/require"

	"github.com/oncewal/oncewal/snapshot"
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

// TestStoreDonates: a store, a follower's as much as a leader's, hands out a
// snapshot donor whose snapshot is the store's cut (its shard and applied
// LSN), described with store.Describe unless the caller says otherwise.
func TestStoreDonates(t *testing.T) {
	fs := vfs.NewMem()
	st, err := store.Open("/s", &store.Options{Shard: 2, FS: fs, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	defer st.Close()
	raw, err := wal.AppendBatch(nil, 2, 1, 1, []wal.Event{{Op: wal.OpPut, Session: [16]byte{1}, Seq: 1, Time: 1, Key: []byte("k")}})
	require.NoError(t, err)
	_, err = st.Apply(raw)
	require.NoError(t, err)

	d, err := st.Donor(&snapshot.DonorOptions{FS: fs, Dir: "/donor", RateLimit: -1})
	require.NoError(t, err)
	defer d.Close()
	m, err := d.Begin(context.Background(), 2)
	require.NoError(t, err)
	require.EqualValues(t, 2, m.Cut.Shard)
	require.EqualValues(t, 1, m.Cut.AppliedLSN)
}
