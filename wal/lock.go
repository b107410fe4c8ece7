package wal

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// lockSuffix ends the name of a shard's lock file. It is not segSuffix, so
// segment listing never mistakes a lock file for a segment.
const lockSuffix = ".lock"

// LockName returns the name of the lock file that a Writer of shard holds in
// its directory: the shard as 10 decimal digits and ".lock" (e.g. shard 3 →
// "0000000003.lock").
func LockName(shard uint32) string {
	return fmt.Sprintf("%0*d%s", segShardDigit, shard, lockSuffix)
}

// DirLockName is the name of the lock file LockDir holds in a WAL directory:
// the lock of the directory as a whole, beside the shards' lock files.
const DirLockName = "wal" + lockSuffix

// isLockName reports whether name is LockName of some shard or DirLockName.
func isLockName(name string) bool {
	if name == DirLockName {
		return true
	}
	digits, ok := strings.CutSuffix(name, lockSuffix)
	if !ok || len(digits) != segShardDigit {
		return false
	}
	_, err := strconv.ParseUint(digits, 10, 32)
	return err == nil // ParseUint takes no sign
}

// dirLock is a held lock (a shard's or a directory's): the FS lock plus
// this process's claim.
type dirLock struct {
	fs      io.Closer
	claim   lockClaim
	claimed bool // claim is registered in processLocks
}

// lockClaim identifies a lock file (directory and name) within this process. The
// FS lock (fcntl on Unix) is owned by the process, not the descriptor, so a
// second lock of the same file by this process would succeed, and closing
// it would release the first. Pebble's default FS catches a second Lock of
// the same path string only; the directory's device and inode also catch
// another spelling of the same directory (relative path, symlink).
type lockClaim struct {
	dev, ino uint64
	name     string
}

var processLocks struct {
	sync.Mutex
	held map[lockClaim]bool
}

// lockShard takes the exclusive lock of shard's log in dir, creating the
// lock file if needed. A lock held by anyone — this process or another — is
// ErrLocked.
func lockShard(fs vfs.FS, dir string, shard uint32) (*dirLock, error) {
	return lockFile(fs, dir, LockName(shard), fmt.Sprintf("directory %s, shard %d", dir, shard))
}

// LockDir takes the exclusive lock of the WAL directory dir as a whole, for
// a process that writes the logs of several shards there (a leader node)
// and must find out that another process does before it opens anything
// else: a second LockDir of the directory — in this process, under any
// spelling of the path, or in another process — fails at once with
// ErrLocked naming the directory. The lock file is DirLockName. LockDir
// creates dir if it does not exist; a path that is not a WAL directory is
// refused (ErrNotWAL) before the lock file is created. The directory lock
// is independent of the shard locks: the holder still opens its Writers,
// which take theirs. Close releases it (idempotent).
func LockDir(dir string) (io.Closer, error) { return LockDirFS(vfs.Default, dir) }

// LockDirFS is LockDir on the filesystem fs.
func LockDirFS(fs vfs.FS, dir string) (io.Closer, error) {
	if err := checkDir(fs, dir); errors.Is(err, os.ErrNotExist) {
		if err := mkdirAllSynced(fs, dir); err != nil {
			return nil, err
		}
	} else if err != nil {
		return nil, err
	}
	if _, err := listDir(fs, dir); err != nil {
		return nil, err
	}
	l, err := lockFile(fs, dir, DirLockName, "directory "+dir)
	if err != nil {
		return nil, err
	}
	return &heldDirLock{l: l}, nil
}

// heldDirLock is LockDir's io.Closer: Close releases once.
type heldDirLock struct {
	once sync.Once
	l    *dirLock
	err  error
}

func (h *heldDirLock) Close() error {
	h.once.Do(func() { h.err = h.l.release() })
	return h.err
}

// lockFile takes the exclusive lock of the file name in dir, creating it if
// needed; what names the lock in ErrLocked. A lock held by anyone — this
// process or another — is ErrLocked.
func lockFile(fs vfs.FS, dir, name, what string) (*dirLock, error) {
	path := fs.PathJoin(dir, name)
	locked := func(cause error) error {
		return fmt.Errorf("%w: %s (lock file %s): %w", ErrLocked, what, path, cause)
	}
	l := &dirLock{}
	st, err := fs.Stat(dir)
	if err != nil {
		return nil, err
	}
	if dev, ino, ok := fileID(st); ok {
		l.claim, l.claimed = lockClaim{dev: dev, ino: ino, name: name}, true
		processLocks.Lock()
		defer processLocks.Unlock()
		if processLocks.held[l.claim] {
			return nil, locked(errors.New("held by this process"))
		}
	}
	c, err := fs.Lock(path)
	if err != nil {
		if isLockContention(err) {
			return nil, locked(err)
		}
		return nil, fmt.Errorf("wal: locking %s: %w", path, err)
	}
	l.fs = c
	if l.claimed {
		if processLocks.held == nil {
			processLocks.held = map[lockClaim]bool{}
		}
		processLocks.held[l.claim] = true
	}
	return l, nil
}

// release drops the lock. The lock file stays: removing it could let two
// openers lock two different files of the same name.
func (l *dirLock) release() error {
	if l.claimed {
		processLocks.Lock()
		defer processLocks.Unlock()
		delete(processLocks.held, l.claim)
	}
	return l.fs.Close()
}
