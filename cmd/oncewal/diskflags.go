package main

import (
	"flag"

	"github.com/oncewal/oncewal/internal/diskguard"
)

// minFreeFlag defines --min-free-bytes (follower.Options.MinFreeBytes; the
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
