package wal

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// tmpSuffix ends the name of the file into which OpenWriter copies the valid
// prefix of a segment with a torn tail (cutTail): the segment's name plus
// ".tmp". Listing skips such files; the next OpenWriter of the shard removes
// a stale one.
const tmpSuffix = ".tmp"

// isTempName reports whether name is a segment's temporary copy.
func isTempName(name string) bool {
	seg, ok := strings.CutSuffix(name, tmpSuffix)
	if !ok {
		return false
	}
	_, _, err := ParseSegmentName(seg)
	return err == nil
}

// syncDir makes creations, renames and removals in dir durable.
func syncDir(fs vfs.FS, dir string) error {
	d, err := fs.OpenDir(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// MkdirAllSynced creates dir and any missing parents on fs, and syncs the
// directory above each one it created, so that the new directory survives a
// crash along with what is later written into it: a directory entry is
// durable only once its parent is synced, and a store or log whose
// directory vanishes in a power failure loses what it acknowledged. Every
// directory of a store or log is created through it.
func MkdirAllSynced(fs vfs.FS, dir string) error {
	var created []string
	for d := dir; ; {
		if _, err := fs.Stat(d); err == nil {
			break
		} else if !errors.Is(err, os.ErrNotExist) {
			return err
		}
		created = append(created, d)
		parent := fs.PathDir(d)
		if parent == d {
			break
		}
		d = parent
	}
	if len(created) == 0 {
		return nil
	}
	if err := fs.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, d := range created {
		if err := syncDir(fs, fs.PathDir(d)); err != nil {
			return err
		}
	}
	return nil
}

// removeTemps removes what a crash left of shard's cutTail copies. Called
// under the lock.
func removeTemps(fs vfs.FS, dir string, shard uint32) error {
	names, err := fs.List(dir)
	if err != nil {
		return err
	}
	removed := false
	for _, name := range names {
		if !isTempName(name) {
			continue
		}
		if sh, _, _ := ParseSegmentName(strings.TrimSuffix(name, tmpSuffix)); sh != shard {
			continue
		}
		if err := fs.Remove(fs.PathJoin(dir, name)); err != nil {
			return err
		}
		removed = true
	}
	if removed {
		return syncDir(fs, dir)
	}
	return nil
}

// cutTail shortens seg to seg.size bytes. vfs.File has no Truncate, so the
// valid prefix is copied to a temporary file, synced, and renamed over the
// segment, and the directory synced: a crash at any point leaves either the
// old segment (its torn tail is cut again on the next open) or the new one,
// plus at most a stale temporary file.
func cutTail(fs vfs.FS, dir string, seg sizedSegment, buf []byte) (err error) {
	path := fs.PathJoin(dir, seg.name)
	tmp := path + tmpSuffix
	src, err := fs.Open(path)
	if err != nil {
		return err
	}
	defer src.Close()
	dst, err := fs.Create(tmp, vfs.WriteCategoryUnspecified)
	if err != nil {
		return err
	}
	defer func() {
		if dst != nil {
			_ = dst.Close()
		}
		if err != nil {
			_ = fs.Remove(tmp)
			err = fmt.Errorf("wal: cutting the torn tail of segment %s: %w", seg.name, err)
		}
	}()
	buf = buf[:cap(buf)]
	if len(buf) < 1<<20 {
		buf = make([]byte, 1<<20)
	}
	for off := int64(0); off < seg.size; {
		n := min(int64(len(buf)), seg.size-off)
		if _, err := src.ReadAt(buf[:n], off); err != nil {
			return err
		}
		if _, err := dst.Write(buf[:n]); err != nil {
			return err
		}
		off += n
	}
	if err := dst.Sync(); err != nil {
		return err
	}
	err, dst = dst.Close(), nil
	if err != nil {
		return err
	}
	if err := fs.Rename(tmp, path); err != nil {
		return err
	}
	return syncDir(fs, dir)
}

// SyncDir makes creations, renames and removals in dir durable (fsync of the
// directory). Packages that rename files into place (snapshot installs) use
// it after every rename they depend on.
func SyncDir(fs vfs.FS, dir string) error { return syncDir(fs, dir) }
