package wal

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"github.com/stretchr/testify/require"
)

// lockHelperEnv makes the test binary, re-executed by lockFromChild, open a
// Writer on the directory it names instead of running tests.
const lockHelperEnv = "ONCEWAL_WAL_LOCK_HELPER_DIR"

// lockCheckEnv makes the helper run CheckLockFile on the lock file it names
// instead of opening a Writer.
const lockCheckEnv = "ONCEWAL_WAL_LOCK_CHECK_NAME"

// TestLockHelperProcess is the child side of the cross-process lock tests:
// it opens a Writer of shard 0 on the directory in lockHelperEnv and prints
// "locked", "opened" or the error. Without the variable it does nothing.
func TestLockHelperProcess(t *testing.T) {
	dir := os.Getenv(lockHelperEnv)
	if dir == "" {
		t.Skip("helper process for the cross-process lock tests")
	}
	if name := os.Getenv(lockCheckEnv); name != "" {
		if err := CheckLockFile(vfs.Default, dir, name); errors.Is(err, ErrLocked) {
			fmt.Printf("locked: %v\n", err)
		} else {
			fmt.Printf("opened: CheckLockFile found no holder, err=%v\n", err)
		}
		return
	}
	w, err := OpenWriter(dir, nil)
	switch {
	case errors.Is(err, ErrLocked):
		fmt.Printf("locked: %v\n", err)
	case err != nil:
		fmt.Printf("error: %v\n", err)
	default:
		_, err = w.Append(1, testEvents(1, 1))
		fmt.Printf("opened: append err=%v close err=%v\n", err, w.Close())
	}
}

// lockFromChild runs OpenWriter(dir) in a separate process and returns what
// it printed. The deadline only catches a hang: a lock conflict must fail at
// once, not wait.
func lockFromChild(t *testing.T, dir string, env ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestLockHelperProcess$", "-test.v")
	cmd.Env = append(append(os.Environ(), lockHelperEnv+"="+dir), env...)
	out, err := cmd.CombinedOutput()
	require.NoError(t, ctx.Err(), "child hung: %s", out)
	require.NoError(t, err, "%s", out)
	for _, line := range strings.Split(string(out), "\n") {
		for _, p := range []string{"locked: ", "opened: ", "error: "} {
			if strings.HasPrefix(line, p) {
				return line
			}
		}
	}
	t.Fatalf("child printed no result: %s", out)
	return ""
}

func TestWriterLockSameProcess(t *testing.T) {
	dir := t.TempDir()
	w, err := OpenWriter(dir, &WriterOptions{Shard: 3})
	require.NoError(t, err)
	_, err = w.Append(1, testEvents(2, 1))
	require.NoError(t, err)

	_, err = OpenWriter(dir, &WriterOptions{Shard: 3})
	require.ErrorIs(t, err, ErrLocked)
	require.Contains(t, err.Error(), dir)
	require.Contains(t, err.Error(), "shard 3")
	// Another spelling of the same directory is the same lock: fcntl locks
	// belong to the process, so only the process-level claim catches it.
	wd, err := os.Getwd()
	require.NoError(t, err)
	rel, err := filepath.Rel(wd, dir)
	require.NoError(t, err)
	_, err = OpenWriter(rel, &WriterOptions{Shard: 3})
	require.ErrorIs(t, err, ErrLocked)
	link := filepath.Join(t.TempDir(), "link")
	require.NoError(t, os.Symlink(dir, link))
	_, err = OpenWriter(link+"/", &WriterOptions{Shard: 3})
	require.ErrorIs(t, err, ErrLocked)

	// The refused opens did not disturb the holder's lock or its log.
	_, err = w.Append(1, testEvents(2, 2))
	require.NoError(t, err)
	// With the lock file present the lock is tried before the log is read:
	// whatever the log looks like meanwhile, a held lock is ErrLocked.
	require.NoError(t, os.WriteFile(filepath.Join(dir, "junk"), nil, 0o644))
	_, err = OpenWriter(dir, &WriterOptions{Shard: 3})
	require.ErrorIs(t, err, ErrLocked)
	require.NoError(t, os.Remove(filepath.Join(dir, "junk")))

	// A different shard in the same directory is a different lock.
	w7, err := OpenWriter(dir, &WriterOptions{Shard: 7})
	require.NoError(t, err)
	require.NoError(t, w7.Close())

	// Close releases the lock.
	require.NoError(t, w.Close())
	w, err = OpenWriter(link, &WriterOptions{Shard: 3})
	require.NoError(t, err)
	require.Equal(t, uint64(5), w.NextLSN())
	require.NoError(t, w.Close())
	hs, _ := readAll(t, dir, 3, 0)
	require.Len(t, hs, 2)
}

func TestWriterLockOtherProcess(t *testing.T) {
	dir := t.TempDir()
	w, err := OpenWriter(dir, nil)
	require.NoError(t, err)
	_, err = w.Append(1, testEvents(2, 1))
	require.NoError(t, err)

	out := lockFromChild(t, dir)
	require.True(t, strings.HasPrefix(out, "locked: "), out)
	require.Contains(t, out, dir)
	// The child's refusal changed nothing for the holder.
	_, err = w.Append(1, testEvents(2, 2))
	require.NoError(t, err)

	// Released by Close: the child now opens and appends.
	require.NoError(t, w.Close())
	out = lockFromChild(t, dir)
	require.Equal(t, "opened: append err=<nil> close err=<nil>", out)
	hs, _ := readAll(t, dir, 0, 0)
	require.Len(t, hs, 3)

	// And the parent can lock again after the child exited.
	w, err = OpenWriter(dir, nil)
	require.NoError(t, err)
	require.NoError(t, w.Close())
}

func TestWriterLockReleasedAfterFailedOpen(t *testing.T) {
	dir := t.TempDir()
	w, err := OpenWriter(dir, nil)
	require.NoError(t, err)
	_, err = w.Append(1, testEvents(3, 1))
	require.NoError(t, err)
	require.NoError(t, w.Close())
	// Fail the first operation after the lock is taken, on the real FS.
	var locked atomic.Bool
	fs := errorfs.Wrap(vfs.Default, errorfs.InjectorFunc(func(op errorfs.Op) error {
		if op.Kind == errorfs.OpLock {
			locked.Store(true)
		} else if locked.Load() {
			return errorfs.ErrInjected
		}
		return nil
	}))
	for i := 0; i < 2; i++ {
		locked.Store(false)
		_, err = OpenWriter(dir, &WriterOptions{FS: fs})
		require.ErrorIs(t, err, errorfs.ErrInjected, "attempt %d fails on the injected error, not as locked", i)
		require.True(t, locked.Load())
	}
	// Released for another process and for this one.
	require.Equal(t, "opened: append err=<nil> close err=<nil>", lockFromChild(t, dir))
	w, err = OpenWriter(dir, nil)
	require.NoError(t, err)
	require.Equal(t, uint64(5), w.NextLSN())
	require.NoError(t, w.Close())

	// A corrupt log is refused before the lock is taken: as corrupt, every
	// time, never as locked.
	path := filepath.Join(dir, SegmentName(0, 1))
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	b[HeaderSize+2] ^= 0xff
	require.NoError(t, os.WriteFile(path, append(b, 1, 2, 3), 0o644))
	for i := 0; i < 2; i++ {
		_, err = OpenWriter(dir, nil)
		require.ErrorIs(t, err, ErrChecksum, "attempt %d", i)
	}
	out := lockFromChild(t, dir)
	require.True(t, strings.HasPrefix(out, "error: "), out)
	require.Contains(t, out, "checksum")
}

// TestCheckLockFileOtherProcess: CheckLockFile sees a lock another process
// holds, naming the lock file and the holder, without taking it or changing
// the file (taking it would truncate it: a refused start changes nothing).
func TestCheckLockFileOtherProcess(t *testing.T) {
	dir := t.TempDir()
	const name = "NODE.lock"
	check := func() string { return lockFromChild(t, dir, lockCheckEnv+"="+name) }
	require.True(t, strings.HasPrefix(check(), "opened: "), "no lock file yet")
	l, err := LockFile(vfs.Default, dir, name)
	require.NoError(t, err)
	path := filepath.Join(dir, name)
	// An old mtime, which a check that took the lock (creating the file
	// anew) would move. (Writing the file here would drop the lock: closing
	// any descriptor of a file releases the process's fcntl locks on it.)
	old := time.Now().Add(-time.Hour).Truncate(time.Second)
	require.NoError(t, os.Chtimes(path, old, old))
	before, err := os.Stat(path)
	require.NoError(t, err)
	got := check()
	require.True(t, strings.HasPrefix(got, "locked: "), got)
	require.Contains(t, got, path)
	require.Contains(t, got, fmt.Sprintf("held by process %d", os.Getpid()))
	after, err := os.Stat(path)
	require.NoError(t, err)
	require.Equal(t, old, before.ModTime())
	require.Equal(t, before.ModTime(), after.ModTime())
	require.NoError(t, l.Close())
	require.True(t, strings.HasPrefix(check(), "opened: "), "released")
}
