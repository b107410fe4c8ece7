package store

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/oncewal/oncewal/wal"
)

// Layout is what a directory holds, as far as its entries tell (DirLayout
// reads the listing only, so it never changes anything).
type Layout int

// Layouts, from DirLayout.
const (
	// LayoutEmpty: the directory is absent or empty. A lone Pebble LOCK
	// file, left by a failed open of an older binary, counts as empty, and
	// so do the files of a Pebble store whose creation was interrupted
	// (a MANIFEST, OPTIONS or LOCK without a manifest marker naming a
	// MANIFEST that is there, and no data file: Pebble retries such a
	// creation).
	LayoutEmpty Layout = iota
	// LayoutStore: one Pebble store — a follower's store, or one shard's
	// store inside a node directory.
	LayoutStore
	// LayoutNode: a follower node directory, one store per shard in
	// shard-NNNN (ShardDir).
	LayoutNode
	// LayoutLeader: a leader node directory (package leader): its lock file
	// LeaderLockFileName, or a WAL directory LeaderWALDirName that holds WAL
	// segments; and shard stores. (A folder named LeaderWALDirName without
	// segments is just a folder: LayoutOther.)
	LayoutLeader
	// LayoutWAL: WAL segments (package wal).
	LayoutWAL
	// LayoutOther: entries that are none of the above.
	LayoutOther
)

func (l Layout) String() string {
	switch l {
	case LayoutEmpty:
		return "empty directory"
	case LayoutStore:
		return "store"
	case LayoutNode:
		return "follower node directory"
	case LayoutLeader:
		return "leader node directory"
	case LayoutWAL:
		return "WAL directory"
	case LayoutOther:
		return "directory of other files"
	}
	return fmt.Sprintf("Layout(%d)", int(l))
}

// The names a leader node directory holds (package leader defines them as
// these; they live here so that a follower can recognise a leader's
// directory without importing package leader, which imports this one).
const (
	LeaderLockFileName = "LEADER.lock"
	LeaderWALDirName   = "wal"
)

// ErrWrongLayout: a directory holds something other than what it was opened
// as — a node directory or a WAL directory given as a single store, a single
// store given as a node directory, a directory of unrelated files. Returned
// as *LayoutError, before anything is written.
var ErrWrongLayout = errors.New("store: directory holds something else")

// LayoutError says what a directory holds and what it was opened as.
type LayoutError struct {
	Dir   string
	Found Layout
	Want  Layout
	// Detail names what gave it away (an entry of the directory).
	Detail string
}

func (e *LayoutError) Error() string {
	msg := fmt.Sprintf("store: %s is a %s (%s), not a %s", e.Dir, e.Found, e.Detail, e.Want)
	switch {
	case e.Want == LayoutStore && e.Found == LayoutNode:
		msg += "; open it as a node (OpenNode, oncewal follower --shards) or give one shard's store directory"
	case e.Want == LayoutNode && e.Found == LayoutStore:
		msg += "; open it as a single store (Open, oncewal follower --shard) or give the node directory that holds shard-NNNN"
	case e.Found == LayoutOther:
		msg += "; a new store needs an empty or absent directory"
	}
	return msg
}

func (e *LayoutError) Unwrap() error { return ErrWrongLayout }

// DirLayout tells from dir's entries (on fs; nil means the OS filesystem)
// what it holds, without opening or changing anything. An absent directory
// is LayoutEmpty; a path that is not a directory is an error.
func DirLayout(fs vfs.FS, dir string) (Layout, string, error) {
	if fs == nil {
		fs = vfs.Default
	}
	st, err := fs.Stat(dir)
	if errors.Is(err, os.ErrNotExist) {
		return LayoutEmpty, "", nil
	}
	if err != nil {
		return 0, "", err
	}
	if !st.IsDir() {
		return 0, "", fmt.Errorf("%w: %s is not a directory", ErrNotStore, dir)
	}
	names, err := fs.List(dir)
	if err != nil {
		return 0, "", err
	}
	var pebbleFile, shardDir, segment, other string
	var leader string
	created := pebbleCreated(names)
	for _, name := range names {
		switch {
		case name == LeaderLockFileName:
			leader = name
		case name == ShardCountFileName, name == ShardCountFileName+".tmp":
			// A node's record (leader or follower): the rest tells which.
		case name == LeaderWALDirName && isDir(fs, fs.PathJoin(dir, name)):
			if shards, err := wal.ListShardsFS(fs, fs.PathJoin(dir, name)); err == nil && len(shards) > 0 {
				leader = name + "/"
			} else if other == "" {
				other = name + "/ (no WAL segments in it)"
			}
		case isPebbleFile(name):
			if name != "LOCK" && pebbleFile == "" {
				pebbleFile = name
			}
		case isShardDir(fs, dir, name):
			if shardDir == "" {
				shardDir = name + "/"
			}
		case isSegment(name):
			if segment == "" {
				segment = name
			}
		default:
			if other == "" {
				other = name
			}
		}
	}
	switch {
	case leader != "":
		return LayoutLeader, leader, nil
	case pebbleFile != "" && created:
		return LayoutStore, pebbleFile, nil
	case pebbleFile != "" && shardDir == "" && segment == "" && other == "":
		// A Pebble store whose creation a crash interrupted: Pebble writes
		// its first MANIFEST, then commits it with the manifest marker and
		// a sync of the directory, before it writes a WAL, a table or
		// anything a caller could be told is durable. Without the marker
		// (or with a marker whose MANIFEST the crash lost: the directory
		// was not synced yet) nothing was ever stored here, and Pebble
		// itself retries such a creation.
		return LayoutEmpty, "", nil
	case pebbleFile != "":
		return LayoutStore, pebbleFile, nil
	case segment != "":
		return LayoutWAL, segment, nil
	case shardDir != "":
		return LayoutNode, shardDir, nil
	case other != "":
		return LayoutOther, other, nil
	}
	return LayoutEmpty, "", nil
}

func isDir(fs vfs.FS, path string) bool {
	st, err := fs.Stat(path)
	return err == nil && st.IsDir()
}

func isShardDir(fs vfs.FS, dir, name string) bool {
	_, ok := parseShardDirName(name)
	return ok && isDir(fs, fs.PathJoin(dir, name))
}

func isSegment(name string) bool {
	_, _, err := wal.ParseSegmentName(name)
	return err == nil
}

// isPebbleFile reports whether name is one of the files Pebble keeps in a
// store directory: its lock, manifests and their marker, options, WALs,
// tables, blob files, and temporary files of an interrupted write.
// pebbleCreated reports whether a directory listing shows a Pebble store
// that was created, not only begun: a manifest marker naming a MANIFEST
// that is there (or a format-1 store's CURRENT), or a file Pebble writes
// only into a created store (a WAL, a table, a blob file).
func pebbleCreated(names []string) bool {
	for _, name := range names {
		if name == "CURRENT" {
			return true
		}
		if rest, ok := strings.CutPrefix(name, "marker.manifest."); ok {
			// marker.manifest.<iteration>.<MANIFEST file name>
			if _, manifest, ok := strings.Cut(rest, "."); ok && slices.Contains(names, manifest) {
				return true
			}
		}
		for _, ext := range []string{".log", ".sst", ".blob"} {
			if num, ok := strings.CutSuffix(name, ext); ok && num != "" && strings.Trim(num, "0123456789") == "" {
				return true
			}
		}
	}
	return false
}

func isPebbleFile(name string) bool {
	switch {
	case name == "LOCK", name == "CURRENT",
		strings.HasPrefix(name, "MANIFEST-"), strings.HasPrefix(name, "OPTIONS-"),
		strings.HasPrefix(name, "marker."), strings.HasSuffix(name, ".dbtmp"):
		return true
	}
	for _, ext := range []string{".log", ".sst", ".blob"} {
		if num, ok := strings.CutSuffix(name, ext); ok && num != "" && strings.Trim(num, "0123456789") == "" {
			return true
		}
	}
	return false
}

// ShardDir is the directory of shard's store inside a node directory.
func ShardDir(nodeDir string, shard uint32) string {
	return filepath.Join(nodeDir, shardDirName(shard))
}

func shardDirName(shard uint32) string { return fmt.Sprintf("shard-%04d", shard) }

// parseShardDirName is the strict inverse of shardDirName.
func parseShardDirName(name string) (uint32, bool) {
	digits, ok := strings.CutPrefix(name, "shard-")
	if !ok {
		return 0, false
	}
	v, err := strconv.ParseUint(digits, 10, 32)
	if err != nil || shardDirName(uint32(v)) != name {
		return 0, false
	}
	return uint32(v), true
}

// NodeShards lists the shards that have a store directory in nodeDir (on fs;
// nil means the OS filesystem), sorted. Other entries are ignored.
func NodeShards(fs vfs.FS, nodeDir string) ([]uint32, error) {
	if fs == nil {
		fs = vfs.Default
	}
	names, err := fs.List(nodeDir)
	if err != nil {
		return nil, err
	}
	var out []uint32
	for _, name := range names {
		if s, ok := parseShardDirName(name); ok {
			if st, err := fs.Stat(fs.PathJoin(nodeDir, name)); err == nil && st.IsDir() {
				out = append(out, s)
			}
		}
	}
	slices.Sort(out)
	return out, nil
}
