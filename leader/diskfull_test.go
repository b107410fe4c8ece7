package leader_test

import (
	"errors"
	"testing"
	"time"

	"github.com/oncewal/oncewal/store"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/oncewal/oncewal/internal/diskguard"
	"github.com/oncewal/oncewal/leader"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/wal"
	"github.com/stretchr/testify/require"
)

// TestAppendRefusedOnFullDisk: while the WAL's disk has less free space
// than the stores keep (store.Options.MinFreeBytes), Append and the
// request ledger are refused with replication.ErrDiskFull and nothing is
// logged; once there is room, appends go on from the same LSN and SeqNo.
func TestAppendRefusedOnFullDisk(t *testing.T) {
	mem := vfs.NewMem()
	l := open(t, "/leader", &leader.Options{Shards: 1, FS: mem, Store: store.Options{MinFreeBytes: 1 << 20}})
	defer l.Close()
	id := session.NewID()
	_, err := l.Append(wal.Event{Op: wal.OpOpen, Session: id})
	require.NoError(t, err)
	sh, _ := l.Shard(0)
	next := sh.NextLSN()

	mem.TestingSetDiskUsage(vfs.DiskUsage{AvailBytes: 1 << 10, TotalBytes: 1 << 30})
	time.Sleep(diskguard.Interval) // the guard's last reading expires
	_, err = l.Append(wal.Event{Op: wal.OpAdd, Session: id, Key: []byte("n"), Delta: 1})
	require.ErrorIs(t, err, store.ErrDiskFull)
	_, err = sh.Ledger().Claim("test", "request-1", nil)
	require.ErrorIs(t, err, store.ErrDiskFull)
	require.Equal(t, next, sh.NextLSN(), "a refused append logged something")

	mem.TestingSetDiskUsage(vfs.DiskUsage{AvailBytes: 1 << 30, TotalBytes: 1 << 30})
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err = l.Append(wal.Event{Op: wal.OpAdd, Session: id, Key: []byte("n"), Delta: 1})
		if !errors.Is(err, store.ErrDiskFull) {
			break
		}
		require.True(t, time.Now().Before(deadline), "appends never resumed")
		time.Sleep(10 * time.Millisecond)
	}
	require.NoError(t, err)
	require.Equal(t, next+1, sh.NextLSN())
	hwm, _, _, err := sh.Store().Tracker().Get(id)
	require.NoError(t, err)
	require.Equal(t, session.SeqNo(2), hwm, "the refused append took a SeqNo")
}
