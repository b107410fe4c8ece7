package main

import (
	"flag"

	"github.com/oncewal/oncewal/store"

	"github.com/oncewal/oncewal/internal/diskguard"
)

// minFreeFlag defines --min-free-bytes (store.Options.MinFreeBytes; the
// leader's stores and WAL keep it too).
func minFreeFlag(fs *flag.FlagSet) *int64 {
	return fs.Int64("min-free-bytes", diskguard.DefaultMinFree,
		"stop writing while the disk has less free space than this many bytes, and go on when there is room again (so that the stores never meet a full disk); -1: off")
}

func checkMinFree(c *flagCheck, v int64) {
	if v == 0 || v < -1 {
		c.failf("--min-free-bytes must be positive or -1 (off)")
	}
}

// memTableFlag defines --memtable-size (store.Options.MemTableSize: the
// memtable of every shard store; the leader's local stores too).
func memTableFlag(fs *flag.FlagSet) *int64 {
	return fs.Int64("memtable-size", store.DefaultMemTableSize,
		"memtable of each shard's store, in bytes; a shard that writes holds about two of them (store/doc.go, Memory per shard)")
}

func checkMemTable(c *flagCheck, v int64) {
	inRange(c, "memtable-size", v, store.MinMemTableSize, store.MaxMemTableSize)
}
