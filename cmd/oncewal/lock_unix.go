//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package main

import (
	"io"
	"os"
	"syscall"
)

// sharedLock takes a POSIX read lock on the whole file, the counterpart of
// the write lock Pebble takes: a running follower's lock makes it fail.
func sharedLock(f *os.File) error {
	spec := syscall.Flock_t{Type: syscall.F_RDLCK, Whence: io.SeekStart}
	return syscall.FcntlFlock(f.Fd(), syscall.F_SETLK, &spec)
}
