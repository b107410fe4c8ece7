package diskguard

import (
	"errors"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/require"
)

func TestGuard(t *testing.T) {
	mem := vfs.NewMem()
	g := New(mem, "/", 1000)
	require.NoError(t, g.Check(), "a filesystem that cannot tell its usage is never refused")

	mem.TestingSetDiskUsage(vfs.DiskUsage{AvailBytes: 999, TotalBytes: 1 << 20})
	g = New(mem, "/", 1000)
	err := g.Check()
	require.ErrorIs(t, err, ErrDiskFull)
	require.ErrorContains(t, err, "999 bytes free")

	mem.TestingSetDiskUsage(vfs.DiskUsage{AvailBytes: 1000, TotalBytes: 1 << 20})
	require.ErrorIs(t, g.Check(), ErrDiskFull, "the reading is trusted for Interval")
	deadline := time.Now().Add(10 * time.Second)
	for errors.Is(g.Check(), ErrDiskFull) {
		require.True(t, time.Now().Before(deadline), "the guard never read the disk again")
		time.Sleep(10 * time.Millisecond)
	}

	for _, off := range []int64{0, -1} {
		mem.TestingSetDiskUsage(vfs.DiskUsage{AvailBytes: 1, TotalBytes: 1 << 20})
		require.NoError(t, New(mem, "/", off).Check(), "minFree %d turns the guard off", off)
	}
	require.NoError(t, (*Guard)(nil).Check())
}
