package testutil

import (
	"strings"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// SyncFS is an FS that counts the syncs of Pebble's WAL files (*.log) and
// delays each by Delay: with a Delay, a disk whose fsync is slow, so that
// batches arriving meanwhile queue up.
type SyncFS struct {
	vfs.FS
	Delay time.Duration
	syncs atomic.Int64
}

// Syncs is how many WAL syncs there were.
func (fs *SyncFS) Syncs() int64 { return fs.syncs.Load() }

type syncFile struct {
	vfs.File
	fs *SyncFS
}

func (fs *SyncFS) wrap(name string, f vfs.File, err error) (vfs.File, error) {
	if err != nil || !strings.HasSuffix(name, ".log") {
		return f, err
	}
	return syncFile{f, fs}, nil
}

// Create implements vfs.FS.
func (fs *SyncFS) Create(name string, c vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := fs.FS.Create(name, c)
	return fs.wrap(name, f, err)
}

// ReuseForWrite implements vfs.FS.
func (fs *SyncFS) ReuseForWrite(old, new string, c vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := fs.FS.ReuseForWrite(old, new, c)
	return fs.wrap(new, f, err)
}

func (f syncFile) Sync() error {
	f.fs.syncs.Add(1)
	time.Sleep(f.fs.Delay)
	return f.File.Sync()
}

func (f syncFile) SyncData() error {
	f.fs.syncs.Add(1)
	time.Sleep(f.fs.Delay)
	return f.File.SyncData()
}
