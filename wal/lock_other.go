//go:build !unix

package wal

import (
	"errors"
	"os"
	"syscall"
)

func fileID(os.FileInfo) (dev, ino uint64, ok bool) { return 0, 0, false }

func isLockContention(err error) bool { return errors.Is(err, syscall.EAGAIN) }

func lockHolder(string) (int, error) { return 0, nil }
