package testutil_test

import (
	"errors"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"github.com/oncewal/oncewal/testutil"
	"github.com/stretchr/testify/require"
)

// TestSyncGate: a held sync does not return before Release, then returns
// the held result; syncs not held pass; every sync counts.
func TestSyncGate(t *testing.T) {
	gate := &testutil.SyncGate{}
	f, err := errorfs.Wrap(vfs.NewMem(), gate).Create("/f", vfs.WriteCategoryUnspecified)
	require.NoError(t, err)
	defer f.Close()
	require.NoError(t, f.SyncData(), "not held")

	failed := errors.New("disk gone")
	h := gate.Hold(failed)
	done := make(chan error, 1)
	go func() { done <- f.SyncData() }()
	h.Wait()
	select {
	case err := <-done:
		t.Fatalf("the held sync returned before Release: %v", err)
	default:
	}
	h.Release()
	require.ErrorIs(t, <-done, failed)
	require.NoError(t, f.SyncData(), "one sync held, not the next")
	require.NoError(t, f.Sync(), "Sync is not SyncData: not counted")
	require.EqualValues(t, 3, gate.Syncs())
}
