package follower

import (
	"fmt"

	"github.com/oncewal/oncewal/store"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/oncewal/oncewal/snapshot"
)

// Describe reads the cut of the shard store in dir — its identity, highest
// committed epoch, applied LSN and last batch — without changing a byte of
// it. It is the snapshot.Describer of shard stores: a donor describes its
// checkpoint with it, and a fetch checks the staged store with it.
func Describe(fs vfs.FS, dir string) (snapshot.Cut, error) {
	cut, err := describe(fs, dir)
	return cut, CorruptStoreError(dir, err)
}

func describe(fs vfs.FS, dir string) (snapshot.Cut, error) {
	db, err := openPeek(fs, dir)
	if err != nil {
		return snapshot.Cut{}, fmt.Errorf("follower: describing store %s: %w", dir, err)
	}
	defer func() { _ = guard(db.Close) }()
	id, recorded, err := ReadIdentity(db)
	if err != nil {
		return snapshot.Cut{}, err
	}
	if !recorded {
		return snapshot.Cut{}, fmt.Errorf("%w: %s records no identity", ErrNotStore, dir)
	}
	pos, _, err := store.ReadPosition(db)
	if err != nil {
		return snapshot.Cut{}, fmt.Errorf("follower: describing store %s: %w", dir, err)
	}
	return snapshot.Cut{
		Shard:      id.Shard,
		Epoch:      pos.Epoch,
		AppliedLSN: pos.AppliedLSN,
		LastBatch:  pos.LastBatch,
		Identity:   id.String(),
	}, nil
}

// IdentityString is the printed identity a store opened with opts records:
// what snapshot.Want.Identity asks of a snapshot for it.
func IdentityString(opts *StoreOptions) string {
	o := *opts
	o.EnsureDefaults()
	return identityOf(&o).String()
}
