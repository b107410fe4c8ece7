package main

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/oncewal/oncewal/store"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// errReadOnlyFS is what readOnlyFS returns for any attempt to change a file.
var errReadOnlyFS = errors.New("inspect opens stores read-only")

// readOnlyFS is the filesystem inspect gives Pebble. pebble.Options.ReadOnly
// already avoids writes, but Pebble still creates and truncates the LOCK file
// to lock the store (os.Create), which changes its mtime and fails on a
// read-only mount. readOnlyFS takes a shared read lock on the existing LOCK
// file instead — it still conflicts with the exclusive lock of a follower
// running in another process — and refuses every mutating call, so "inspect
// never changes the store" holds by construction, not by Pebble's goodwill.
type readOnlyFS struct{ vfs.FS }

func refuse(op, name string) error { return fmt.Errorf("%s %s: %w", op, name, errReadOnlyFS) }

func (readOnlyFS) Create(name string, _ vfs.DiskWriteCategory) (vfs.File, error) {
	return nil, refuse("create", name)
}
func (readOnlyFS) Link(oldname, _ string) error { return refuse("link", oldname) }
func (readOnlyFS) OpenReadWrite(name string, _ vfs.DiskWriteCategory, _ ...vfs.OpenOption) (vfs.File, error) {
	return nil, refuse("open for writing", name)
}
func (readOnlyFS) Remove(name string) error                 { return refuse("remove", name) }
func (readOnlyFS) RemoveAll(name string) error              { return refuse("remove", name) }
func (readOnlyFS) Rename(oldname, _ string) error           { return refuse("rename", oldname) }
func (readOnlyFS) MkdirAll(dir string, _ os.FileMode) error { return refuse("mkdir", dir) }
func (readOnlyFS) ReuseForWrite(oldname, _ string, _ vfs.DiskWriteCategory) (vfs.File, error) {
	return nil, refuse("reuse", oldname)
}

// Lock opens the existing lock file read-only and takes a shared lock on it.
func (readOnlyFS) Lock(name string) (io.Closer, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	if err := sharedLock(f); err != nil {
		f.Close()
		// A refused shared lock: a process holds the store
		// (store.ErrLocked).
		return nil, store.LockError(name, err)
	}
	return f, nil
}

func (fs readOnlyFS) Unwrap() vfs.FS { return fs.FS }
