package leader_test

import (
	"encoding/binary"
	"math"
	"testing"

	"github.com/oncewal/oncewal/store"

	"github.com/oncewal/oncewal/leader"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/oncewal/oncewal/internal/keyspace"
	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/wal"
	"github.com/stretchr/testify/require"
)

// TestLedgerLogEpochBound: an epoch above MaxEpoch is refused, given as an
// option or found in a store an older binary wrote, and nothing changes.
func TestLedgerLogEpochBound(t *testing.T) {
	for _, epoch := range []uint64{replication.MaxEpoch + 1, math.MaxUint64} {
		a := openNode(t, vfs.NewMem())
		walDir := t.TempDir()
		_, err := a.leader(walDir, epoch, nil)
		require.ErrorIs(t, err, leader.ErrBadOptions)
		require.ErrorIs(t, err, replication.ErrEpochExhausted)
		_, stored, ok, err := store.ReadMeta(a.db)
		require.NoError(t, err)
		require.False(t, ok, "nothing persisted: epoch %d", stored)
		require.NoError(t, a.db.Close())
	}

	// A store at MaxEpoch serves at it; one above (as a wrapping binary
	// left it) is refused.
	a := openNode(t, vfs.NewMem())
	defer a.db.Close()
	walDir := t.TempDir()
	l, err := a.leader(walDir, replication.MaxEpoch, nil)
	require.NoError(t, err)
	require.NoError(t, l.Close())
	l, err = a.leader(walDir, 0, nil)
	require.NoError(t, err)
	require.EqualValues(t, replication.MaxEpoch, l.Epoch())
	require.NoError(t, l.Close())

	b := openNode(t, vfs.NewMem())
	defer b.db.Close()
	v := binary.LittleEndian.AppendUint64([]byte{1}, math.MaxUint64)
	require.NoError(t, b.db.Set([]byte(keyspace.MetaEpoch), v, pebble.Sync))
	_, err = b.leader(t.TempDir(), 0, nil)
	require.ErrorIs(t, err, replication.ErrEpochExhausted)
}

// TestLedgerLogLostStoreTakesWALEpoch: a leader whose store is lost
// rebuilds it from its WAL and serves at the epoch of the WAL's last batch,
// with that epoch's boundary as the log shows it (the first batch of the
// last epoch), and appends nothing stale. Without the WAL as the epoch's
// authority it served at epoch 1 and appended an epoch-1 batch after the
// epoch-2 ones (then failed on its own store for good).
func TestLedgerLogLostStoreTakesWALEpoch(t *testing.T) {
	walDir := t.TempDir()
	put := func(l *leader.LedgerLog, k string) wal.Header {
		h, err := l.Append(wal.Event{Op: wal.OpPut, Session: session.ID{1}, Key: []byte(k)})
		require.NoError(t, err)
		return h
	}
	a := openNode(t, vfs.NewMem())
	l, err := a.leader(walDir, 0, nil)
	require.NoError(t, err)
	require.NoError(t, func() error { _, err := l.Append(wal.Event{Op: wal.OpOpen, Session: session.ID{1}}); return err }())
	put(l, "a")
	require.NoError(t, l.Close())
	l, err = a.leader(walDir, 2, nil)
	require.NoError(t, err)
	first := put(l, "b")
	last := put(l, "c")
	boundary := l.Boundary()
	require.NoError(t, l.Close())
	require.NoError(t, a.db.Close())
	require.Equal(t, first.FirstLSN, boundary.StartLSN)

	// The store is lost. An explicit epoch below the log's is refused
	// before anything changes.
	b := openNode(t, vfs.NewMem())
	defer b.db.Close()
	_, err = b.leader(walDir, 1, nil)
	require.ErrorIs(t, err, replication.ErrStaleEpoch)
	_, _, ok, err := store.ReadMeta(b.db)
	require.NoError(t, err)
	require.False(t, ok)

	l, err = b.leader(walDir, 0, nil)
	require.NoError(t, err)
	require.EqualValues(t, 2, l.Epoch())
	require.Equal(t, boundary, l.Boundary(), "the epoch's boundary, as the log shows it")
	h := put(l, "d")
	require.EqualValues(t, 2, h.Epoch)
	require.Equal(t, last.LastLSN()+1, h.FirstLSN)
	lsn, epoch := l.Position()
	require.Equal(t, h.LastLSN(), lsn)
	require.EqualValues(t, 2, epoch)
	require.NoError(t, l.Close())
	info, err := wal.InspectFS(vfs.Default, walDir, 0)
	require.NoError(t, err, "no epoch regression in the log")
	require.EqualValues(t, 2, info.LastEpoch)

	// Raising the epoch on a rebuilt store starts it at the log's end.
	c := openNode(t, vfs.NewMem())
	defer c.db.Close()
	l, err = c.leader(walDir, 3, nil)
	require.NoError(t, err)
	require.Equal(t, h.LastLSN()+1, l.EpochStartLSN())
	require.Equal(t, wal.BatchRef{Epoch: 2, CRC: h.HeaderCRC}, l.Boundary().Prev)
	require.NoError(t, l.Close())
}
