package store_test

import (
	"io"
	"log/slog"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/store"
	"github.com/oncewal/oncewal/testutil"
	"github.com/stretchr/testify/require"
)

// TestOpenAfterCrashDuringCreation: a crash at any point while Open creates
// a store (each filesystem operation, keeping none, half or all of what was
// not synced) leaves a directory that the next Open opens — an empty store,
// or the created one — and that PeekStore and Describe read. Such a
// directory can hold Pebble's files without its manifest marker; Pebble
// itself retries the creation, and so must every oncewal reader, or the
// shard never opens again (the election simulation's stall: a member whose
// store creation a kill interrupted never followed again).
func TestOpenAfterCrashDuringCreation(t *testing.T) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	create := func(fs vfs.FS) error {
		st, err := store.Open("/n/shard-0000", &store.Options{FS: fs, Logger: quiet})
		if err != nil {
			return err
		}
		if _, err := st.Apply(putAt(t, session.NewID(), 1, 1)); err != nil {
			_ = st.Close()
			return err
		}
		return st.Close()
	}
	probe := testutil.NewCrashFS(vfs.NewCrashableMem(), testutil.CrashOptions{At: -1})
	require.NoError(t, create(probe))
	points := probe.Counted()
	require.Greater(t, points, 10)
	tested := 0
	for at := 0; at < points; at++ {
		for _, keep := range []int{0, 25, 50, 75, 100} {
			mem := vfs.NewCrashableMem()
			require.NoError(t, mem.MkdirAll("/n", 0o755))
			c := testutil.NewCrashFS(mem, testutil.CrashOptions{At: at, Continue: true, Clone: vfs.CrashCloneCfg{UnsyncedDataPercent: keep, RNG: rand.New(rand.NewPCG(uint64(at), uint64(keep)))}})
			require.NoError(t, create(c))
			img := c.Image()
			if img == nil {
				continue // Pebble's background work made this run shorter than the probe
			}
			tested++
			_, err := store.PeekStore(img, "/n/shard-0000")
			require.NoError(t, err, "crash before operation %d (keeping %d%% unsynced): PeekStore", at, keep)
			st, err := store.Open("/n/shard-0000", &store.Options{FS: img, Logger: quiet})
			require.NoError(t, err, "crash before operation %d (keeping %d%% unsynced): Open", at, keep)
			applied, _ := st.Position()
			require.LessOrEqual(t, applied, uint64(1))
			require.NoError(t, st.Close())
		}
	}
	require.Greater(t, tested, 5*points/2, "too few crash images were taken")
}

// TestOpenRefusesDataWithoutManifest: a store that holds data files (a WAL)
// but lost its manifest marker is not a creation cut short but damage: Open
// and PeekStore refuse it with ErrCorrupt, which a follower answers with a
// rebuild, and change nothing.
func TestOpenRefusesDataWithoutManifest(t *testing.T) {
	mem := vfs.NewMem()
	st := promiseStore(t, mem)
	_, err := st.Apply(putAt(t, session.NewID(), 1, 1))
	require.NoError(t, err)
	require.NoError(t, st.Close())
	names, err := mem.List("/s")
	require.NoError(t, err)
	removed := 0
	for _, name := range names {
		if strings.HasPrefix(name, "marker.manifest.") {
			require.NoError(t, mem.Remove("/s/"+name))
			removed++
		}
	}
	require.Equal(t, 1, removed)
	before := testutil.DirImage(t, mem, "/s")
	_, err = store.PeekStore(mem, "/s")
	require.ErrorIs(t, err, store.ErrCorrupt)
	_, err = store.Open("/s", &store.Options{FS: mem, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.ErrorIs(t, err, store.ErrCorrupt)
	require.ErrorContains(t, err, "no manifest marker")
	require.Equal(t, before, testutil.DirImage(t, mem, "/s"), "a refused open changed the directory")
}
