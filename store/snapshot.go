package store

import (
	"fmt"

	"github.com/oncewal/oncewal/internal/keyspace"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/oncewal/oncewal/snapshot"
)

// Describe reads the cut of the shard store in dir — its identity, highest
// committed epoch, applied LSN and last batch — without changing a byte of
// it. It is the snapshot.Describer of shard stores: a donor describes its
// checkpoint with it, and a fetch checks the staged store with it.
func Describe(fs vfs.FS, dir string) (snapshot.Cut, error) {
	cut, err := describe(fs, dir)
	return cut, CorruptError(dir, err)
}

func describe(fs vfs.FS, dir string) (snapshot.Cut, error) {
	db, err := openPeek(fs, dir)
	if err != nil {
		return snapshot.Cut{}, fmt.Errorf("store: describing store %s: %w", dir, err)
	}
	defer func() { _ = guard(db.Close) }()
	id, recorded, err := ReadIdentity(db)
	if err != nil {
		return snapshot.Cut{}, err
	}
	if !recorded {
		return snapshot.Cut{}, fmt.Errorf("%w: %s records no identity", ErrNotStore, dir)
	}
	pos, _, err := ReadPosition(db)
	if err != nil {
		return snapshot.Cut{}, fmt.Errorf("store: describing store %s: %w", dir, err)
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
func IdentityString(opts *Options) string {
	o := *opts
	o.EnsureDefaults()
	return identityOf(&o).String()
}

// DropLeaderRows deletes the leader-only rows (keyspace.LeaderOnly) from the
// store staged in dir, synced, before it is installed.
func DropLeaderRows(dir string, o *Options) error {
	var db *pebble.DB
	if err := guard(func() (err error) {
		db, err = pebble.Open(dir, pebbleOptions(o, nil))
		return err
	}); err != nil {
		return fmt.Errorf("opening the staged store: %w", err)
	}
	err := guard(func() error {
		b := db.NewBatch()
		defer b.Close()
		for _, p := range keyspace.LeaderOnly {
			if err := b.DeleteRange([]byte(p), keyspace.UpperBound(p), nil); err != nil {
				return err
			}
		}
		return b.Commit(pebble.Sync)
	})
	if cerr := guard(db.Close); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("dropping leader-only rows from the staged store: %w", err)
	}
	return nil
}
