package store_test

import (
	"io"
	"log/slog"
	"sync/atomic"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/oncewal/oncewal/internal/drill"
	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/store"
	"github.com/oncewal/oncewal/wal"
	"github.com/stretchr/testify/require"
)

func promiseStore(t *testing.T, fs vfs.FS) *store.Store {
	t.Helper()
	st, err := store.Open("/s", &store.Options{FS: fs, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	return st
}

// putAt encodes a one-event batch of epoch at LSN lsn: session id's SeqNo
// lsn.
func putAt(t *testing.T, id session.ID, epoch, lsn uint64) []byte {
	t.Helper()
	raw, err := wal.AppendBatch(nil, 0, epoch, lsn, []wal.Event{{Op: wal.OpPut, Session: id, Seq: session.SeqNo(lsn),
		Time: int64(lsn), Key: []byte("k"), Value: []byte("v")}})
	require.NoError(t, err)
	return raw
}

// TestPromiseSurvivesCrash: a promise is durable once Promise returns, and
// so is the position it reported, including a batch started (its WAL sync
// in flight, its Pending not waited for) before it; a power failure that
// keeps nothing unsynced loses neither. After the promise, and after the
// reopen, a batch of an older epoch is refused with ErrStaleEpoch, and a
// batch at the promise that continues at the position is accepted.
func TestPromiseSurvivesCrash(t *testing.T) {
	id := session.NewID()
	mem := vfs.NewCrashableMem()
	st := promiseStore(t, mem)
	_, err := st.Apply(putAt(t, id, 1, 1))
	require.NoError(t, err)

	second := putAt(t, id, 1, 2)
	ref2, err := wal.BatchRefOf(second)
	require.NoError(t, err)
	p := st.Start(second) // decided before the promise: part of its position
	ack, err := st.Promise(3)
	require.NoError(t, err)
	require.Equal(t, replication.Ack{Epoch: 1, AppliedLSN: 2, LastBatch: ref2}, ack)
	require.Equal(t, uint64(3), st.Promised())
	crashed := mem.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 0})

	res, err := p.Wait()
	require.NoError(t, err)
	require.Equal(t, uint64(2), res.Ack.AppliedLSN)
	// The deposed leader's next batch, and one of an epoch between the
	// committed one and the promise: refused, nothing applied.
	for _, epoch := range []uint64{1, 2} {
		res, err = st.Apply(putAt(t, id, epoch, 3))
		require.ErrorIs(t, err, replication.ErrStaleEpoch)
		require.ErrorContains(t, err, "is below epoch 3 this store promised: a new leader fenced this store during a failover: point this follower at the current leader")
		require.True(t, res.Ack.Refused)
		require.Equal(t, uint64(2), res.Ack.AppliedLSN)
	}
	require.NoError(t, drill.Kill(st))

	info, err := store.PeekStore(crashed, "/s")
	require.NoError(t, err)
	require.Equal(t, uint64(3), info.Promise, "the promise did not survive the crash")
	require.Equal(t, uint64(2), info.Applied, "the position the promise reported did not survive the crash")

	st = promiseStore(t, crashed)
	defer st.Close()
	require.Equal(t, uint64(3), st.Promised())
	applied, epoch := st.Position()
	require.Equal(t, [2]uint64{2, 1}, [2]uint64{applied, epoch})
	_, err = st.Apply(putAt(t, id, 2, 3))
	require.ErrorIs(t, err, replication.ErrStaleEpoch)
	res, err = st.Apply(putAt(t, id, 3, 3))
	require.NoError(t, err)
	require.Equal(t, replication.Ack{Epoch: 3, AppliedLSN: 3}, res.Ack)
}

// TestPromiseRefusals: an epoch no leader can have is a typed error that
// writes nothing; a lower promise changes nothing; a closed store answers
// ErrClosed.
func TestPromiseRefusals(t *testing.T) {
	mem := vfs.NewMem()
	st := promiseStore(t, mem)
	for _, epoch := range []uint64{0, replication.MaxEpoch + 1} {
		_, err := st.Promise(epoch)
		require.ErrorIs(t, err, store.ErrBadPromise)
		require.Zero(t, st.Promised())
	}
	_, err := st.Promise(replication.MaxEpoch + 1)
	require.ErrorIs(t, err, replication.ErrEpochExhausted)

	_, err = st.Promise(4)
	require.NoError(t, err)
	ack, err := st.Promise(2)
	require.NoError(t, err)
	require.Equal(t, replication.Ack{}, ack, "an empty store's position")
	require.Equal(t, uint64(4), st.Promised())
	require.NoError(t, st.Close())

	_, err = st.Promise(5)
	require.ErrorIs(t, err, store.ErrClosed)
	info, err := store.PeekStore(mem, "/s")
	require.NoError(t, err)
	require.Equal(t, uint64(4), info.Promise)
}

// TestPromiseFinalPosition: a promise made while a pipeline of batches of
// the old epoch runs (Start, up to 4 in flight, Wait in order) reports a
// position no batch of that epoch goes past: every batch started before
// it is in the reported position, every one after it is refused, and the
// store ends exactly where Promise said.
func TestPromiseFinalPosition(t *testing.T) {
	st := promiseStore(t, vfs.NewMem())
	defer st.Close()
	id := session.NewID()
	pending := make(chan *store.Pending, 3)
	var stop atomic.Bool
	go func() {
		defer close(pending)
		for lsn := uint64(1); !stop.Load(); lsn++ {
			pending <- st.Start(putAt(t, id, 1, lsn))
		}
	}()
	var promised replication.Ack
	var maxAcked uint64
	refused := 0
	for p := range pending {
		res, err := p.Wait()
		switch {
		case err == nil:
			maxAcked = max(maxAcked, res.Ack.AppliedLSN)
		case refused == 0:
			require.ErrorIs(t, err, replication.ErrStaleEpoch)
			fallthrough
		default:
			refused++
			stop.Store(true)
		}
		if applied, _ := st.Position(); applied >= 20 && promised.AppliedLSN == 0 {
			var err error
			promised, err = st.Promise(2)
			require.NoError(t, err)
		}
	}
	require.NotZero(t, refused)
	require.Equal(t, promised.AppliedLSN, maxAcked, "a batch of the old epoch applied past the promised position")
	applied, _ := st.Position()
	require.Equal(t, promised.AppliedLSN, applied)
}
