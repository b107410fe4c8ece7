//go:build linux

package wal

import (
	"os"
	"syscall"
)

// syncData makes appended data durable. fdatasync suffices for appends: the
// file size is metadata needed to read the data, so it is flushed too, while
// timestamps are not.
func syncData(f *os.File) error {
	for {
		err := syscall.Fdatasync(int(f.Fd()))
		if err != syscall.EINTR {
			return err
		}
	}
}
