package follower_test

import (
	"context"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/oncewal/oncewal/follower"
	"github.com/oncewal/oncewal/session"
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
	fs := &slowSyncFS{FS: vfs.NewMem(), d: time.Millisecond}
	f, err := follower.Open("/follower", testOptions(fs))
	require.NoError(t, err)
	defer f.Close()
	lead := &scriptedLeader{log: log, last: lsn - 1, done: make(chan struct{})}
	syncs0 := fs.syncs.Load()

	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- f.Serve(ctx, lead) }()
	select {
	case <-lead.done:
	case <-time.After(time.Minute):
		t.Fatal("the last duplicate-only batch was never acknowledged at its position")
	}
	cancel()
	require.NoError(t, <-served)
	syncs := fs.syncs.Load() - syncs0

	lead.mu.Lock()
	defer lead.mu.Unlock()
	require.Len(t, lead.acks, len(log))
	var prev uint64
	for i, a := range lead.acks {
		require.False(t, a.Refused, "ack %d refused", i)
		require.GreaterOrEqual(t, a.AppliedLSN, prev, "acks out of order")
		prev = a.AppliedLSN
	}
	require.Equal(t, lsn-1, prev)
	applied, _ := f.Position()
	require.Equal(t, lsn-1, applied)
	t.Logf("%d batches, %d WAL syncs", len(log), syncs)
}
