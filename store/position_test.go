package store_test

import (
	"testing"

	"github.com/oncewal/oncewal/store"

	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/wal"
	"github.com/stretchr/testify/require"
)

// TestReadPosition: a store's position read from its Pebble store is what
// its receiver states in its hello, and nothing for a store without
// oncewal metadata.
func TestReadPosition(t *testing.T) {
	r := newRig(t, nil)
	_, ok, err := store.ReadPosition(r.db)
	require.NoError(t, err)
	require.False(t, ok, "a store that committed nothing has no position")
	recv, err := r.reopen("a")
	require.NoError(t, err)
	id := session.NewID()
	_, err = recv.Apply(r.batchAt(3, 4, add(id, 1, 1, nil), add(id, 2, 1, nil)))
	require.NoError(t, err)
	pos, ok, err := store.ReadPosition(r.db)
	require.NoError(t, err)
	require.True(t, ok)
	h := recv.Hello()
	h.Shard, h.FollowerID = 0, ""
	require.Equal(t, h, pos)
	require.Equal(t, uint64(2), pos.AppliedLSN)
	require.Equal(t, uint64(4), pos.LastBatch.Epoch)
}

func TestComparePositions(t *testing.T) {
	at := func(epoch, lsn uint64, lastEpoch uint64) replication.Ack {
		a := replication.Ack{Epoch: epoch, AppliedLSN: lsn}
		if lastEpoch > 0 {
			a.LastBatch = wal.BatchRef{Epoch: lastEpoch, CRC: uint32(lsn)}
		}
		return a
	}
	for _, c := range []struct {
		name string
		a, b replication.Ack
		want int
	}{
		{"more LSNs, same epoch", at(1, 10, 1), at(1, 9, 1), 1},
		{"equal", at(2, 10, 2), at(2, 10, 2), 0},
		{"a later epoch beats more LSNs of a deposed leader", at(2, 90, 2), at(1, 100, 1), 1},
		{"the last batch's epoch counts, not the committed one", at(3, 100, 1), at(2, 90, 2), -1},
		{"unknown last batch: the committed epoch stands in", at(2, 50, 0), at(1, 60, 1), 1},
		{"nothing applied is behind anything applied", at(5, 0, 0), at(1, 1, 1), -1},
		{"two empty stores", at(5, 0, 0), at(1, 0, 0), 0},
	} {
		require.Equal(t, c.want, store.ComparePositions(c.a, c.b), c.name)
		require.Equal(t, -c.want, store.ComparePositions(c.b, c.a), c.name+" (swapped)")
	}
}
