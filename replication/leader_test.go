package replication_test

import (
	"context"
	"testing"
	"time"

	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/wal"
	"github.com/stretchr/testify/require"
)

func TestLeaderOptions(t *testing.T) {
	_, err := replication.OpenLeader(replication.LeaderOptions{})
	require.ErrorIs(t, err, replication.ErrBadLeaderOptions)
	_, err = replication.OpenLeader(replication.LeaderOptions{Dir: t.TempDir(), Shards: 0,
		Listener: func(uint32) replication.Listener { return nil }})
	require.ErrorIs(t, err, replication.ErrBadLeaderOptions)
	require.ErrorIs(t, err, replication.ErrBadShardCount)
	_, err = replication.OpenLeader(replication.LeaderOptions{Dir: t.TempDir(), Shards: 2,
		Listener: func(uint32) replication.Listener { return nil }})
	require.ErrorIs(t, err, replication.ErrBadShipperOptions, "a shard without a listener")
}

// TestLeaderShards: each shard has its own log (LSNs from 1) in the shared
// directory, and its own Shipper delivering only that shard's batches.
func TestLeaderShards(t *testing.T) {
	dir := t.TempDir()
	trs := []*replication.InProcess{replication.NewInProcess(replication.FaultsNone, 1), replication.NewInProcess(replication.FaultsNone, 2)}
	for _, tr := range trs {
		defer tr.Close()
	}
	l, err := replication.OpenLeader(replication.LeaderOptions{Dir: dir, Shards: 2, Epoch: 7,
		Listener: func(s uint32) replication.Listener { return trs[s] }})
	require.NoError(t, err)
	defer l.Close()
	require.Equal(t, 2, l.Router().Shards())
	require.Equal(t, uint64(7), l.Epoch())

	// Route 40 sessions' open events.
	var evs []wal.Event
	for range 40 {
		id := session.NewID()
		evs = append(evs, wal.Event{Op: wal.OpOpen, Session: id, Seq: 1, Time: 1})
	}
	split := l.Router().Split(evs, nil)
	require.Len(t, split, 2)
	require.Equal(t, len(evs), len(split[0])+len(split[1]))
	for s, part := range split {
		require.NotEmpty(t, part)
		for _, ev := range part {
			require.Equal(t, uint32(s), l.Router().Shard(ev.Session))
		}
		h, err := l.Append(uint32(s), part)
		require.NoError(t, err)
		require.Equal(t, uint64(1), h.FirstLSN, "every shard's log starts at LSN 1")
		require.Equal(t, uint32(s), h.Shard)
		require.Equal(t, uint64(7), h.Epoch)
	}
	_, err = l.Append(2, evs)
	require.ErrorIs(t, err, replication.ErrNoSuchShard)
	_, err = l.Writer(5)
	require.ErrorIs(t, err, replication.ErrNoSuchShard)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	for s, tr := range trs {
		conn, err := tr.Dial(ctx, replication.Ack{Shard: uint32(s)})
		require.NoError(t, err)
		raw, err := conn.Recv(ctx)
		require.NoError(t, err)
		var got []wal.Event
		h, got, err := wal.DecodeBatch(raw, got)
		require.NoError(t, err)
		require.Equal(t, uint32(s), h.Shard)
		require.Len(t, got, len(split[s]))
		require.NoError(t, conn.Send(ctx, replication.Ack{Shard: uint32(s), Epoch: 7, AppliedLSN: h.LastLSN()}))
	}
	require.NoError(t, l.WaitAcked(ctx))
	for s, st := range l.Stats() {
		require.Equal(t, uint64(len(split[s])), st.AckedLSN)
	}
	cancel()
	require.NoError(t, <-done)
	require.NoError(t, l.Close())
	require.NoError(t, l.Close())
}
