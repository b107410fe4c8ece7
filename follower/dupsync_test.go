package follower_test

import (
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/oncewal/oncewal/follower"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/testutil"
	"github.com/oncewal/oncewal/wal"
	"github.com/stretchr/testify/require"
)

// TestServeAcksDuplicateBurst: a burst of duplicate-only batches (a
// client's retries a leader logged again), which the store commits
// without WAL syncs of their own, is served with one ack per batch, in
// order, none refused, and the last is acknowledged at its own position
// although nothing follows it: the follower syncs when the stream pauses,
// so the leader is never left waiting for the end of a burst. (How many
// syncs the burst saves depends on how the acknowledger races the receive
// loop here; store's TestPositionOnlyBatchesShareSyncs counts them.)
func TestServeAcksDuplicateBurst(t *testing.T) {
	var open []wal.Event
	for range 3 {
		open = append(open, wal.Event{Op: wal.OpOpen, Session: session.NewID(), Seq: 1, Time: 1})
	}
	var log [][]byte
	lsn := uint64(1)
	for range 41 { // the first applies, the rest repeat it at new LSNs
		raw, err := wal.AppendBatch(nil, 0, 1, lsn, open)
		require.NoError(t, err)
		log = append(log, raw)
		lsn += uint64(len(open))
	}
	fs := &testutil.SyncFS{FS: vfs.NewMem(), Delay: time.Millisecond}
	f, err := follower.Open("/follower", testOptions(fs))
	require.NoError(t, err)
	defer f.Close()
	syncs := serveScripted(t, f, fs, log)
	applied, _ := f.Position()
	require.Equal(t, lsn-1, applied)
	t.Logf("%d batches, %d WAL syncs", len(log), syncs)
}
