package main

import (
	"errors"
	"fmt"
	"io"

	"github.com/oncewal/oncewal/store"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/oncewal/oncewal/snapshot"
	"github.com/oncewal/oncewal/wal"
)

// catchUpStore is one store promote --catch-up replaces: DIR's store of
// Shard, by a copy of the peer's store From, which stood at AppliedLSN and
// LastBatch when promote read it.
type catchUpStore struct {
	Shard      uint32       `json:"shard"`
	From       string       `json:"from"`
	AppliedLSN uint64       `json:"applied_lsn"`
	LastBatch  wal.BatchRef `json:"last_batch"`
}

// catchUpStoreDir is DIR's store of shard (a single store is shard 0).
func catchUpStoreDir(dir string, node bool, shard uint32) string {
	if node {
		return store.ShardDir(dir, shard)
	}
	return dir
}

// checkCatchUpIdentity refuses a catch-up whose source store records
// another identity (shard, window, retention) than the store it replaces:
// the copy must be acceptable to the leader opened on it and to the
// followers it ships to (follower.MismatchError otherwise).
func checkCatchUpIdentity(dir string, node bool, cu catchUpStore) error {
	mine, err := store.Describe(vfs.Default, catchUpStoreDir(dir, node, cu.Shard))
	if err != nil {
		return err
	}
	theirs, err := store.Describe(vfs.Default, cu.From)
	if err != nil {
		return err
	}
	if mine.Identity != theirs.Identity || mine.Shard != theirs.Shard {
		return fmt.Errorf("%w: --catch-up: %s records %s, %s records %s; a store can only be replaced by one of the same identity",
			errCannotPromote, cu.From, theirs.Identity, catchUpStoreDir(dir, node, cu.Shard), mine.Identity)
	}
	return nil
}

// catchUp replaces each of in's catch-up stores, still in in.Dir, with a
// verified copy of its source, unless it is there already (a run
// interrupted after it): the source's files are copied (synced) into the
// store's snapshot staging directory while its shared lock keeps a follower
// from starting on it, the copy's position is checked against what promote
// read and every block of it read, and snapshot.Install swaps it in
// atomically (snapshot.Recover, run first here and by every store open,
// finishes or drops an interrupted install).
func catchUp(fs vfs.FS, in promoteIntent, stderr io.Writer) error {
	for _, cu := range in.CatchUp {
		store := catchUpStoreDir(in.Dir, in.Node, cu.Shard)
		if err := snapshot.Recover(fs, store); err != nil {
			return err
		}
		if pos, err := readStorePosition(store, stderr); err == nil && pos.AppliedLSN == cu.AppliedLSN && pos.LastBatch == cu.LastBatch {
			continue // copied already
		}
		if err := copyStore(fs, cu.From, snapshot.StagingDir(store), stderr); err != nil {
			return fmt.Errorf("--catch-up: copying %s: %w", cu.From, err)
		}
		staged := snapshot.StagingDir(store)
		pos, err := readStorePosition(staged, stderr)
		if err != nil {
			return fmt.Errorf("--catch-up: the copy of %s: %w", cu.From, err)
		}
		if pos.AppliedLSN != cu.AppliedLSN || pos.LastBatch != cu.LastBatch {
			return fmt.Errorf("%w: --catch-up: %s moved while promote ran (LSN %d, last batch %s; read at LSN %d, last batch %s): stop it",
				errCannotPromote, cu.From, pos.AppliedLSN, fmtBatchRef(pos.LastBatch), cu.AppliedLSN, fmtBatchRef(cu.LastBatch))
		}
		if err := verifyStore(staged, stderr); err != nil {
			return fmt.Errorf("--catch-up: the copy of %s: %w", cu.From, err)
		}
		if err := snapshot.Install(fs, store); err != nil {
			return fmt.Errorf("--catch-up: installing the copy of %s in %s: %w", cu.From, store, err)
		}
	}
	return nil
}

// copyStore copies the files of the stopped store from into dst (made
// anew), each synced, then dst's directory and its parent.
func copyStore(fs vfs.FS, from, dst string, stderr io.Writer) error {
	// Held open read-only: its shared lock keeps a follower off the store
	// while its files are copied.
	db, err := openReadOnly(from, stderr)
	if err != nil {
		return err
	}
	defer db.Close()
	if err := fs.RemoveAll(dst); err != nil {
		return err
	}
	if err := fs.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	names, err := vfs.Default.List(from)
	if err != nil {
		return err
	}
	for _, name := range names {
		if err := copyFile(fs, vfs.Default.PathJoin(from, name), fs.PathJoin(dst, name)); err != nil {
			return err
		}
	}
	if err := syncDirFS(fs, dst); err != nil {
		return err
	}
	return syncDirFS(fs, fs.PathDir(dst))
}

func copyFile(fs vfs.FS, src, dst string) error {
	in, err := vfs.Default.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := fs.Create(dst, vfs.WriteCategoryUnspecified)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		return errors.Join(err, out.Close())
	}
	return errors.Join(out.Sync(), out.Close())
}
