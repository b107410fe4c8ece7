package snapshot

import (
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/oncewal/oncewal/wal"
)

// StagingDir is where Fetch stages a snapshot for the store in storeDir: a
// sibling, so that the install is a rename within one directory.
func StagingDir(storeDir string) string { return storeDir + ".rebuild" }

// oldDir holds the replaced store between steps 3 and 5 of an install.
func oldDir(storeDir string) string { return storeDir + ".rebuild-old" }

// markerPath is the install's commit point (see the package doc).
func markerPath(storeDir string) string { return storeDir + ".rebuild-marker" }

// ErrNothingStaged: Install found no staging directory.
var ErrNothingStaged = errors.New("snapshot: nothing staged to install")

// installStep, if set (tests), is called after each durable step of an
// install or a recovery, named as in the package doc.
var installStep func(step string)

func stepDone(step string) {
	if installStep != nil {
		installStep(step)
	}
}

// Install replaces the store in storeDir (if any) with the snapshot Fetch
// staged, in renames behind a marker (see the package doc); the store must
// be closed. After a crash, Recover finishes it.
func Install(fs vfs.FS, storeDir string) error {
	if _, err := fs.Stat(StagingDir(storeDir)); err != nil {
		return fmt.Errorf("%w for %s: %w", ErrNothingStaged, storeDir, err)
	}
	parent := fs.PathDir(storeDir)
	tmp := markerPath(storeDir) + ".tmp"
	if err := writeSynced(fs, tmp, []byte("oncewal snapshot install: roll forward\n")); err != nil {
		return fmt.Errorf("snapshot: writing the install marker: %w", err)
	}
	stepDone("marker-written")
	if err := fs.Rename(tmp, markerPath(storeDir)); err != nil {
		return fmt.Errorf("snapshot: committing the install: %w", err)
	}
	if err := wal.SyncDir(fs, parent); err != nil {
		return fmt.Errorf("snapshot: committing the install: %w", err)
	}
	stepDone("marker")
	return rollForward(fs, storeDir)
}

// Recover finishes an install a crash interrupted after its commit point
// (the marker), and otherwise removes what an unfinished fetch left: after
// it, storeDir holds exactly the old store or the new one. Every open of a
// shard store runs it first.
func Recover(fs vfs.FS, storeDir string) error {
	if exists(fs, markerPath(storeDir)) {
		return rollForward(fs, storeDir)
	}
	removed := false
	for _, p := range []string{StagingDir(storeDir), oldDir(storeDir), markerPath(storeDir) + ".tmp"} {
		if exists(fs, p) {
			if err := fs.RemoveAll(p); err != nil {
				return fmt.Errorf("snapshot: removing the leftover %s: %w", p, err)
			}
			removed = true
		}
	}
	if removed {
		return wal.SyncDir(fs, fs.PathDir(storeDir))
	}
	return nil
}

// rollForward runs steps 3–5 of an install; each is skipped if it is done,
// so a crash during a recovery is recovered the same way.
func rollForward(fs vfs.FS, storeDir string) error {
	parent := fs.PathDir(storeDir)
	staging, old := StagingDir(storeDir), oldDir(storeDir)
	step := func(name string, err error) error {
		if err == nil {
			err = wal.SyncDir(fs, parent)
		}
		if err != nil {
			return fmt.Errorf("snapshot: install of %s, step %s: %w", storeDir, name, err)
		}
		stepDone(name)
		return nil
	}
	if exists(fs, staging) {
		if exists(fs, storeDir) {
			if err := step("old", fs.Rename(storeDir, old)); err != nil {
				return err
			}
		}
		if err := step("new", fs.Rename(staging, storeDir)); err != nil {
			return err
		}
	}
	if exists(fs, old) {
		if err := step("removed-old", fs.RemoveAll(old)); err != nil {
			return err
		}
	}
	return step("done", fs.Remove(markerPath(storeDir)))
}

func exists(fs vfs.FS, path string) bool {
	_, err := fs.Stat(path)
	return err == nil
}

// writeSynced creates path with data and syncs it.
func writeSynced(fs vfs.FS, path string, data []byte) error {
	f, err := fs.Create(path, vfs.WriteCategoryUnspecified)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// removeStaging removes a failed fetch's staging directory.
func removeStaging(fs vfs.FS, storeDir string) {
	if exists(fs, StagingDir(storeDir)) {
		_ = fs.RemoveAll(StagingDir(storeDir))
		_ = wal.SyncDir(fs, fs.PathDir(storeDir))
	}
}
