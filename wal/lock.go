package wal

import (
	"errors"
	"fmt"
	"io"
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

// isLockName reports whether name is LockName of some shard.
func isLockName(name string) bool {
	digits, ok := strings.CutSuffix(name, lockSuffix)
	if !ok || len(digits) != segShardDigit {
		return false
	}
	_, err := strconv.ParseUint(digits, 10, 32)
	return err == nil // ParseUint takes no sign
}

// dirLock is a held shard lock: the FS lock plus this process's claim.
type dirLock struct {
	fs      io.Closer
	claim   lockClaim
	claimed bool // claim is registered in processLocks
}

// lockClaim identifies a (directory, shard) pair within this process. The
// FS lock (fcntl on Unix) is owned by the process, not the descriptor, so a
// second lock of the same file by this process would succeed, and closing
// it would release the first. Pebble's default FS catches a second Lock of
// the same path string only; the directory's device and inode also catch
// another spelling of the same directory (relative path, symlink).
type lockClaim struct {
	dev, ino uint64
	name     string // the lock file's name in that directory
}

var processLocks struct {
	sync.Mutex
	held map[lockClaim]bool
}

// lockShard takes the exclusive lock of shard's log in dir, creating the
// lock file if needed. A lock held by anyone — this process or another — is
// ErrLocked.
func lockShard(fs vfs.FS, dir string, shard uint32) (*dirLock, error) {
	l, err := lockFile(fs, dir, LockName(shard))
	if errors.Is(err, ErrLocked) {
		err = fmt.Errorf("%w (shard %d)", err, shard)
	}
	return l, err
}

// LockFile takes an exclusive lock on the file name in dir (created if
// needed) for a process that owns more than a log in a directory (a leader
// node: its stores and its WAL), with the Writer's semantics: a lock held by
// anyone — this process or another — fails at once with ErrLocked naming the
// directory. Close releases it; the file stays.
func LockFile(fs vfs.FS, dir, name string) (io.Closer, error) {
	l, err := lockFile(fs, dir, name)
	if err != nil {
		return nil, err
	}
	return closerFunc(l.release), nil
}

// CheckLockFile returns ErrLocked, as LockFile would, when this process or
// another holds the lock on name in dir, and nil otherwise — without
// touching the file: a caller that must read what the lock guards before it
// may create the lock (a refusal must leave nothing behind) checks here
// first. Another process's lock shows here on the operating system's
// filesystem (vfs.Default); on any other FS only when taken (LockFile).
func CheckLockFile(fs vfs.FS, dir, name string) error {
	st, err := fs.Stat(dir)
	if err != nil || !st.IsDir() {
		return nil // nothing to hold a lock in (the caller reports what dir is)
	}
	dev, ino, ok := fileID(st)
	if !ok {
		return nil
	}
	processLocks.Lock()
	defer processLocks.Unlock()
	if processLocks.held[lockClaim{dev: dev, ino: ino, name: name}] {
		return fmt.Errorf("%w: directory %s (lock file %s): held by this process", ErrLocked, dir, fs.PathJoin(dir, name))
	}
	if fs != vfs.Default {
		return nil
	}
	path := fs.PathJoin(dir, name)
	pid, err := lockHolder(path)
	if err != nil {
		return fmt.Errorf("wal: checking the lock %s: %w", path, err)
	}
	if pid != 0 {
		return fmt.Errorf("%w: directory %s (lock file %s): held by process %d; another process is using it: stop that process first, or use another directory",
			ErrLocked, dir, path, pid)
	}
	return nil
}

type closerFunc func() error

func (f closerFunc) Close() error { return f() }

func lockFile(fs vfs.FS, dir, name string) (*dirLock, error) {
	path := fs.PathJoin(dir, name)
	locked := func(cause error) error {
		return fmt.Errorf("%w: directory %s (lock file %s): %w; another process is using it: stop that process first, or use another directory", ErrLocked, dir, path, cause)
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
