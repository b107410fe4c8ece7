//go:build unix

package wal

import (
	"errors"
	"io/fs"
	"os"
	"syscall"
)

// fileID returns the device and inode of a file, when the FS is backed by
// the operating system's.
func fileID(fi os.FileInfo) (dev, ino uint64, ok bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, 0, false
	}
	return uint64(st.Dev), uint64(st.Ino), true
}

// isLockContention reports whether err from vfs.FS.Lock means someone else
// holds the lock: fcntl(F_SETLK) fails with EAGAIN or EACCES, and MemFS
// mimics EAGAIN. The same errnos wrapped in a *fs.PathError come from
// creating the lock file (a read-only directory), not from contention.
func isLockContention(err error) bool {
	if _, ok := errors.AsType[*fs.PathError](err); ok {
		return false
	}
	return errors.Is(err, syscall.EAGAIN) || errors.Is(err, syscall.EACCES)
}
