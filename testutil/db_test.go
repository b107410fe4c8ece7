package testutil_test

import (
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/oncewal/oncewal/testutil"
	"github.com/stretchr/testify/require"
)

// TestOpenDBReopens: a store OpenDB opened on an FS, closed and opened again
// by name, holds what was written; MemDB stores are separate.
func TestOpenDBReopens(t *testing.T) {
	fs := vfs.NewMem()
	db := testutil.OpenDB(t, fs, "db")
	require.NoError(t, db.Set([]byte("k"), []byte("v"), pebble.Sync))
	require.NoError(t, db.Close())
	db = testutil.OpenDB(t, fs, "db")
	defer db.Close()
	got, err := testutil.SnapshotDB(db)
	require.NoError(t, err)
	require.Equal(t, map[string]string{"k": "v"}, got)
	require.Equal(t, pebble.FormatNewest, db.FormatMajorVersion())

	a, b := testutil.MemDB(t), testutil.MemDB(t)
	require.NoError(t, a.Set([]byte("k"), []byte("a"), nil))
	_, closer, err := b.Get([]byte("k"))
	require.ErrorIs(t, err, pebble.ErrNotFound, "two MemDBs share a filesystem")
	_ = closer
}

// TestPanicLoggerPanicsOnFatal: Fatalf panics with the message instead of
// exiting the process.
func TestPanicLoggerPanicsOnFatal(t *testing.T) {
	require.PanicsWithValue(t, "pebble: fatal: disk 3 died", func() { testutil.PanicLogger{}.Fatalf("disk %d died", 3) })
	testutil.PanicLogger{}.Infof("dropped")
	testutil.PanicLogger{}.Errorf("dropped")
}
