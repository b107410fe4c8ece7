package store_test

import (
	"encoding/binary"
	"testing"

	"github.com/oncewal/oncewal/internal/keyspace"
	"github.com/oncewal/oncewal/store"

	"github.com/cockroachdb/pebble/v2"
	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/wal"
	"github.com/stretchr/testify/require"
)

// reopen builds a new Receiver over the rig's store, as a restart would.
func (r *rig) reopen(id string) (*store.Receiver, error) {
	return store.NewReceiver(r.db, r.tracker, r.window, r.applier, &store.ReceiverOptions{Shard: 3, FollowerID: id})
}

// TestReceiverHelloIdentity: the hello names the follower and the batch that
// ends at its applied position; the identity is persisted with the position
// (in the same Pebble batch), survives a reopen, stays put on refusals and
// redeliveries, and reads as unknown from a store that lacks it or holds a
// stale one.
func TestReceiverHelloIdentity(t *testing.T) {
	r := newRig(t, nil)
	recv, err := r.reopen("replica-a")
	require.NoError(t, err)
	require.Equal(t, replication.Ack{Shard: 3, FollowerID: "replica-a"}, recv.Hello())

	id := session.NewID()
	b1 := r.batchAt(3, 5, add(id, 1, 1, nil), add(id, 2, 1, nil))
	ref1, err := wal.BatchRefOf(b1)
	require.NoError(t, err)
	require.Equal(t, uint64(5), ref1.Epoch)
	res, err := recv.Apply(b1)
	require.NoError(t, err)
	require.Equal(t, replication.Ack{Shard: 3, Epoch: 5, AppliedLSN: 2}, res.Ack, "acks carry no hello fields")
	require.Equal(t, replication.Ack{Shard: 3, Epoch: 5, AppliedLSN: 2, FollowerID: "replica-a", LastBatch: ref1}, recv.Hello())

	b2 := r.batchAt(3, 6, add(id, 3, 1, nil))
	ref2, err := wal.BatchRefOf(b2)
	require.NoError(t, err)
	require.NotEqual(t, ref1, ref2)
	_, err = recv.Apply(b2)
	require.NoError(t, err)
	require.Equal(t, ref2, recv.Hello().LastBatch)

	// A redelivery and a refused batch leave the identity where it was.
	_, err = recv.Apply(b2)
	require.NoError(t, err)
	_, err = recv.Apply(b1) // stale epoch
	require.ErrorIs(t, err, replication.ErrStaleEpoch)
	_, err = recv.Apply(r.batchAt(3, 6, add(id, 9, 1, nil))) // SeqNo gap
	require.ErrorIs(t, err, replication.ErrSeqGap)
	require.Equal(t, ref2, recv.Hello().LastBatch)

	// Persisted: a reopened receiver says the same, and so does ReadLastBatch.
	recv2, err := r.reopen("replica-a")
	require.NoError(t, err)
	require.Equal(t, recv.Hello(), recv2.Hello())
	lsn, ref, err := store.ReadLastBatch(r.db)
	require.NoError(t, err)
	require.Equal(t, uint64(3), lsn)
	require.Equal(t, ref2, ref)

	// A value written for another position (a binary that advanced the
	// position without this key) and a missing key both mean unknown.
	stale := binary.LittleEndian.AppendUint64([]byte{1}, 2)
	stale = binary.LittleEndian.AppendUint64(stale, ref1.Epoch)
	stale = binary.LittleEndian.AppendUint32(stale, ref1.CRC)
	require.NoError(t, r.db.Set([]byte(keyspace.MetaLastBatch), stale, pebble.Sync))
	recv3, err := r.reopen("")
	require.NoError(t, err)
	require.Equal(t, replication.Ack{Shard: 3, Epoch: 6, AppliedLSN: 3}, recv3.Hello())
	require.NoError(t, r.db.Delete([]byte(keyspace.MetaLastBatch), pebble.Sync))
	recv3, err = r.reopen("")
	require.NoError(t, err)
	require.True(t, recv3.Hello().LastBatch.IsZero())
	// The next commit records the identity again.
	r.nextLSN = 4
	b3 := r.batchAt(3, 6, add(id, 4, 1, nil))
	_, err = recv3.Apply(b3)
	require.NoError(t, err)
	ref3, _ := wal.BatchRefOf(b3)
	require.Equal(t, ref3, recv3.Hello().LastBatch)

	// A malformed value is an error, not a guess.
	require.NoError(t, r.db.Set([]byte(keyspace.MetaLastBatch), []byte{1, 2, 3}, pebble.Sync))
	_, err = r.reopen("")
	require.Error(t, err)
}

func TestNewReceiverRefusesBadFollowerID(t *testing.T) {
	r := newRig(t, nil)
	_, err := r.reopen("no spaces")
	require.ErrorIs(t, err, replication.ErrBadFollowerID)
	require.ErrorIs(t, err, store.ErrBadOptions)
}

func TestBatchRefOf(t *testing.T) {
	r := newRig(t, nil)
	b := r.batchAt(3, 7, add(session.NewID(), 1, 1, nil))
	ref, err := wal.BatchRefOf(b)
	require.NoError(t, err)
	require.Equal(t, uint64(7), ref.Epoch)
	require.False(t, ref.IsZero())
	b[3] ^= 1 // magic
	_, err = wal.BatchRefOf(b)
	require.Error(t, err)
	_, err = wal.BatchRefOf(b[:10])
	require.Error(t, err)
}
