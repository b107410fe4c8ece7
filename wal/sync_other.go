//go:build !linux

package wal

import "os"

func syncData(f *os.File) error { return f.Sync() }
