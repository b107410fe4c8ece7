package store

import (
	"fmt"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// StoreInfo is what PeekStore reads from a store's metadata.
type StoreInfo struct {
	// Exists: the directory holds a Pebble store (LayoutStore).
	Exists bool
	// Applied and Epoch are the applied LSN and the highest committed
	// epoch (0 for a store without oncewal metadata).
	Applied, Epoch uint64
	// Leader: a leader made the store its own (replication.keyLeader), at
	// LeaderEpoch.
	Leader      bool
	LeaderEpoch uint64
	// Promise is the highest epoch the store promised to a fencing leader
	// (Store.Promise; 0: none): no leader may serve it below that epoch.
	Promise uint64
}

// PeekStore reads the metadata of the store in dir without changing a byte
// of it (a read-only Pebble open on a filesystem that refuses writes, as
// Open's identity check). An absent or empty directory is the zero
// StoreInfo; anything but a store is a *LayoutError; a damaged one is
// ErrCorrupt (CorruptError).
func PeekStore(fs vfs.FS, dir string) (StoreInfo, error) {
	info, err := peekStore(fs, dir)
	return info, CorruptError(dir, err)
}

func peekStore(fs vfs.FS, dir string) (StoreInfo, error) {
	if fs == nil {
		fs = vfs.Default
	}
	switch layout, detail, err := DirLayout(fs, dir); {
	case err != nil:
		return StoreInfo{}, err
	case layout == LayoutEmpty:
		return StoreInfo{}, nil
	case layout != LayoutStore:
		return StoreInfo{}, &LayoutError{Dir: dir, Found: layout, Want: LayoutStore, Detail: detail}
	}
	db, err := openPeek(fs, dir)
	if err != nil {
		return StoreInfo{}, fmt.Errorf("store: reading store %s: %w", dir, err)
	}
	defer func() { _ = guard(db.Close) }()
	info := StoreInfo{Exists: true}
	if info.Applied, info.Epoch, _, err = ReadMeta(db); err != nil {
		return StoreInfo{}, err
	}
	if info.LeaderEpoch, info.Leader, err = readLeaderMark(db); err != nil {
		return StoreInfo{}, err
	}
	if info.Promise, err = ReadPromise(db); err != nil {
		return StoreInfo{}, err
	}
	return info, nil
}
