package store

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/oncewal/oncewal/corruption"
	"github.com/oncewal/oncewal/wal"
)

// ShardCountFileName is the file in a leader or follower node directory
// that records the deployment's shard count, written (atomically: a synced
// temporary file renamed into place, the directory synced) when the
// directory is created. A session routes to a shard by a function of the
// count (replication.ShardRouter), so a directory served under another
// count would route sessions to shards whose logs and HWMs never saw them.
const ShardCountFileName = "SHARDS"

// ErrShardCount: a directory is being opened with another shard count than
// the one it records (ShardCountFileName) or, before the record existed,
// than the shards it holds. Nothing was changed.
var ErrShardCount = errors.New("store: shard count differs from the directory's")

// ShardCountError is the refusal of a changed shard count.
type ShardCountError struct {
	Dir          string
	Found, Asked int
	// Recorded: Found was read from ShardCountFileName (else it was
	// counted from the stores and WAL segments present).
	Recorded bool
}

func (e *ShardCountError) Error() string {
	from := "recorded in " + ShardCountFileName
	if !e.Recorded {
		from = "counted from its stores and WAL segments"
	}
	return fmt.Sprintf("%v: %s holds a deployment of %d shards (%s), not %d: the shard count is fixed for a deployment's lifetime; "+
		"start it with --shards %d", ErrShardCount, e.Dir, e.Found, from, e.Asked, e.Found)
}

func (e *ShardCountError) Unwrap() error { return ErrShardCount }

// ReadShardCount reads the shard count recorded in dir; ok is false when
// dir records none.
func ReadShardCount(fs vfs.FS, dir string) (n int, ok bool, err error) {
	f, err := fs.Open(fs.PathJoin(dir, ShardCountFileName))
	if errors.Is(err, os.ErrNotExist) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, 64))
	if err != nil {
		return 0, false, err
	}
	v, found := strings.CutPrefix(string(b), "oncewal shards ")
	if n, err = strconv.Atoi(strings.TrimSuffix(v, "\n")); !found || err != nil || n < 1 {
		return 0, false, corruption.Errorf("store: %s: unrecognised shard count record %q", fs.PathJoin(dir, ShardCountFileName), b)
	}
	return n, true, nil
}

// CheckShardCount refuses to open dir with shards shards (*ShardCountError)
// when it records another count, or, recording none, when present (the
// highest shard it holds + 1, 0 for none) is another non-zero count. It
// returns whether the count must be recorded (RecordShardCount) once the
// directory is opened. Read-only.
func CheckShardCount(fs vfs.FS, dir string, shards, present int) (record bool, err error) {
	n, ok, err := ReadShardCount(fs, dir)
	switch {
	case err != nil:
		return false, err
	case ok && n != shards:
		return false, &ShardCountError{Dir: dir, Found: n, Asked: shards, Recorded: true}
	case ok:
		return false, nil
	case present != 0 && present != shards:
		return false, &ShardCountError{Dir: dir, Found: present, Asked: shards}
	}
	return true, nil
}

// RecordShardCount records shards in dir (which must exist): a temporary
// file, synced, renamed into place, the directory synced — a crash leaves
// the old state or the record, never a partial one.
func RecordShardCount(fs vfs.FS, dir string, shards int) error {
	path := fs.PathJoin(dir, ShardCountFileName)
	tmp := path + ".tmp"
	f, err := fs.Create(tmp, vfs.WriteCategoryUnspecified)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(f, "oncewal shards %d\n", shards)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = fs.Rename(tmp, path)
	}
	if err != nil {
		_ = fs.Remove(tmp)
		return fmt.Errorf("store: recording the shard count in %s: %w", dir, err)
	}
	return wal.SyncDir(fs, dir)
}
