package leader_test

import (
	"context"
	"testing"

	"github.com/oncewal/oncewal/replication/inprocess"

	"github.com/oncewal/oncewal/leader"
	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/snapshot"
	"github.com/oncewal/oncewal/wal"
	"github.com/stretchr/testify/require"
)

// TestDonorPinsVisible: a snapshot served from a shard's store pins its
// WAL, and the pin shows in the shard's retention figures (SnapshotPins,
// SnapshotPinLSN); a Begin whose answer was lost is superseded by the same
// fetcher's next Begin, so its pin goes at once, and End releases the last.
func TestDonorPinsVisible(t *testing.T) {
	tr := inprocess.New(inprocess.FaultsNone, 1)
	defer tr.Close()
	l := open(t, t.TempDir(), &leader.Options{Shards: 1, Followers: []string{"f1"},
		Listener: func(uint32) replication.Listener { return tr }, Logger: discard()})
	defer l.Close()
	id := session.NewID()
	for range 10 {
		_, err := l.Append(wal.Event{Op: wal.OpAdd, Session: id, Key: []byte("n"), Delta: 1})
		require.NoError(t, err)
	}
	d, err := l.Donor(0, &snapshot.DonorOptions{RateLimit: -1})
	require.NoError(t, err)
	defer d.Close()
	ctx := context.Background()
	_, err = d.BeginFor(ctx, 0, "f2/shard-0000") // its answer lost
	require.NoError(t, err)
	r := l.Stats()[0].Retention
	require.Equal(t, 1, r.SnapshotPins)
	require.Equal(t, uint64(10), r.SnapshotPinLSN)
	m, err := d.BeginFor(ctx, 0, "f2/shard-0000") // the retry
	require.NoError(t, err)
	require.Equal(t, 1, l.Stats()[0].Retention.SnapshotPins)
	require.Equal(t, uint64(1), d.Stats().Superseded)
	require.NoError(t, d.End(ctx, m.ID))
	r = l.Stats()[0].Retention
	require.Zero(t, r.SnapshotPins)
	require.Zero(t, r.SnapshotPinLSN)
}
