// Package diskguard refuses writes before a disk fills up.
//
// Pebble has no good answer to a full disk: its flushes fail and are
// retried for ever while commits wait for memtable room without a deadline,
// and a failure to close its WAL while rotating it is a panic with its
// mutex released, a fatal error nothing recovers. The leader's WAL writer
// fails for good at its first short write. So oncewal stops writing while a
// minimum of free space remains — as CockroachDB keeps a ballast — and
// resumes when there is room again: a Guard answers whether a write may go
// ahead, from the filesystem's free space, read at most every Interval.
package diskguard

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// ErrDiskFull: less than the configured minimum of free space remains on
// the disk; nothing was written. It passes once there is room again.
var ErrDiskFull = errors.New("disk full: below the minimum free space")

// DefaultMinFree is the default minimum of free bytes: room for Pebble to
// flush its memtables and compact, and for the WAL's next batches.
const DefaultMinFree = 64 << 20

// Interval is how long a reading of the free space is trusted.
const Interval = 100 * time.Millisecond

// Guard checks the free space of the disk that holds one directory.
type Guard struct {
	fs  vfs.FS
	dir string
	min uint64 // 0: off

	mu    sync.Mutex
	read  time.Time
	avail uint64
	known bool // the filesystem reports its usage
}

// New guards dir on fs, refusing writes while fewer than minFree bytes are
// free; minFree <= 0 turns the guard off. A filesystem that cannot report
// its usage (vfs.MemFS by default) never refuses.
func New(fs vfs.FS, dir string, minFree int64) *Guard {
	g := &Guard{fs: fs, dir: dir}
	if minFree > 0 {
		g.min = uint64(minFree)
	}
	return g
}

// Check returns nil if a write may go ahead, else an error wrapping
// ErrDiskFull that says how much is free.
func (g *Guard) Check() error {
	if g == nil || g.min == 0 {
		return nil
	}
	now := time.Now()
	g.mu.Lock()
	defer g.mu.Unlock()
	if now.Sub(g.read) >= Interval {
		u, err := g.fs.GetDiskUsage(g.dir)
		g.read, g.avail, g.known = now, u.AvailBytes, err == nil
	}
	if !g.known || g.avail >= g.min {
		return nil
	}
	return fmt.Errorf("%w: %s: %d bytes free, keeping %d", ErrDiskFull, g.dir, g.avail, g.min)
}
