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

// PrepareRebuilt readies the store staged in dir for install in place of
// a store that promised promise to a fencing leader (0: none): it deletes
// the donor's leader-only rows (keyspace.LeaderOnly) and raises the staged
// store's promise to at least promise, synced. The promise is a fact of
// this replica, not of the donor's history: a rebuild must not undo a
// promise its store made (a donor at a lower epoch would otherwise be
// followed again); the donor's own promise is kept too (keyspace
// MetaPromise says why it is harmless).
func PrepareRebuilt(dir string, o *Options, promise uint64) error {
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
		theirs, err := ReadPromise(db)
		if err != nil {
			return err
		}
		if promise > theirs {
			if err := b.Set(keyPromise, appendMetaU64(nil, promise), nil); err != nil {
				return err
			}
		}
		return b.Commit(pebble.Sync)
	})
	if cerr := guard(db.Close); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("preparing the staged store (leader-only rows, promise): %w", err)
	}
	return nil
}
