//go:build unix

package wal

import (
	"errors"
	"io"
	"io/fs"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
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

// lockHolder reports the process holding an fcntl lock on the existing file
// path (0: none), without taking the lock or changing the file: opened
// read-only, asked with F_GETLK (taking it would truncate it, as Pebble's
// Lock creates the file). A missing file has no holder.
func lockHolder(path string) (pid int, err error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	defer f.Close()
	spec := unix.Flock_t{Type: unix.F_WRLCK, Whence: io.SeekStart}
	if err := unix.FcntlFlock(f.Fd(), unix.F_GETLK, &spec); err != nil {
		return 0, err
	}
	if spec.Type == unix.F_UNLCK {
		return 0, nil
	}
	return int(spec.Pid), nil
}
