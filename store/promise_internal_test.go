package store

import (
	"testing"

	"github.com/cockroachdb/datadriven"
	"github.com/oncewal/oncewal/wal"
	"github.com/stretchr/testify/require"
)

// TestPromiseSyncFailure: a promise whose WAL sync fails fails the store,
// as a batch's failed sync does — the batches before it may not be
// durable — and raises nothing: every later promise and batch is refused
// with ErrFailed until the store is reopened.
func TestPromiseSyncFailure(t *testing.T) {
	raw, err := wal.AppendBatch(nil, 0, 1, 1, []wal.Event{{Op: wal.OpPut, Session: name16("a"), Seq: 1, Time: decideOrigin,
		Key: []byte("k"), Value: []byte("v")}})
	require.NoError(t, err)
	for _, epoch := range []uint64{3, 1} { // raising, and a sync of the position alone
		d := newDecideRig(t, &datadriven.TestData{})
		_, err := d.recv.Promise(1)
		require.NoError(t, err)
		d.syncs.On()
		_, err = d.recv.Promise(epoch)
		d.syncs.Off()
		require.ErrorIs(t, err, ErrFailed)
		require.ErrorIs(t, d.recv.Err(), ErrFailed, "the store is not failed")
		require.Equal(t, uint64(1), d.recv.Promised())
		_, err = d.recv.Promise(4)
		require.ErrorIs(t, err, ErrFailed)
		_, err = d.recv.Apply(raw)
		require.ErrorIs(t, err, ErrFailed)
	}
}
