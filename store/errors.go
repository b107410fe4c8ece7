package store

import (
	"errors"

	"github.com/oncewal/oncewal/internal/diskguard"
)

// ErrStaging: composing a batch's Pebble batch failed — a read of the store
// (an HWM) or a write into the uncommitted batch (HWM flush, session GC,
// window journal, metadata). The batch is refused and nothing was
// committed; unlike ErrFailed, which only a failed commit sets and which
// sticks until the follower is reopened, the receiver stays usable and the
// next delivery is tried afresh.
var ErrStaging = errors.New("store: staging the batch failed")

// ErrDiskFull: the disk holding a store or a WAL has less free space than
// its guard keeps (store.Options.MinFreeBytes, leader.Options
// MinFreeBytes); the batch or the append was refused and nothing was
// written. It passes by itself once there is room again (see
// internal/diskguard for why oncewal stops before the disk is full).
var ErrDiskFull = diskguard.ErrDiskFull
