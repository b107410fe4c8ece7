package follower_test

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/oncewal/oncewal/store"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"github.com/oncewal/oncewal/follower"
	"github.com/stretchr/testify/require"
)

// countingHandler counts the log records at Warn and above.
type countingHandler struct {
	slog.Handler
	n *atomic.Int64
}

func (h countingHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn {
		h.n.Add(1)
	}
	return nil
}

func (h countingHandler) Enabled(context.Context, slog.Level) bool { return true }

// openWithin runs open and fails the test if it has not returned after
// limit: the finding was an Open that never returned.
func openWithin[T any](t *testing.T, limit time.Duration, open func() (T, error)) (T, error) {
	t.Helper()
	type result struct {
		v   T
		err error
	}
	ch := make(chan result, 1)
	go func() {
		v, err := open()
		ch <- result{v, err}
	}()
	select {
	case r := <-ch:
		return r.v, r.err
	case <-time.After(limit):
		t.Fatalf("open still running after %v", limit)
	}
	panic("unreachable")
}

// TestOpenFullDisk reproduces the full-disk restart: a follower killed with
// unflushed writes reopens on a disk where every write fails with ENOSPC.
// Pebble's open flushes the replayed WAL, the flush fails, and Pebble
// retries it for ever — Open used to hang there, burning a core and logging
// ~100 lines a second. Now it returns store.ErrUnavailable wrapping ENOSPC,
// logs the error once, and once space is back a second Open takes the store
// over with everything it had.
func TestOpenFullDisk(t *testing.T) {
	dir := t.TempDir()
	lsn := filledStore(t, dir, follower.Options{}, true) // the WAL holds writes Open must flush

	var full atomic.Bool
	full.Store(true)
	var injected atomic.Int64
	inj := errorfs.InjectorFunc(func(op errorfs.Op) error {
		if full.Load() && (op.Kind == errorfs.OpFileWrite || op.Kind == errorfs.OpFileWriteAt || op.Kind == errorfs.OpFilePreallocate) {
			injected.Add(1)
			return syscall.ENOSPC
		}
		return nil
	})
	var lines atomic.Int64
	opts := &follower.Options{Store: store.Options{FS: errorfs.Wrap(vfs.Default, inj), Logger: slog.New(countingHandler{n: &lines})}}
	_, err := openWithin(t, time.Minute, func() (*follower.Follower, error) { return follower.Open(dir, opts) })
	require.ErrorIs(t, err, store.ErrUnavailable)
	require.ErrorIs(t, err, syscall.ENOSPC)
	require.Positive(t, injected.Load())
	require.Equal(t, int64(1), lines.Load(), "a failing flush is logged once, not at every retry")

	// Still full: a second Open answers at once with the same error.
	_, err = openWithin(t, time.Minute, func() (*follower.Follower, error) { return follower.Open(dir, opts) })
	require.ErrorIs(t, err, store.ErrUnavailable)
	time.Sleep(100 * time.Millisecond) // Pebble retries meanwhile, after a backoff each time
	require.Equal(t, int64(1), lines.Load(), "retries of a failing flush are not logged again within 30s")

	full.Store(false)
	// The Open joins the one still retrying and takes its store over.
	f, err := openWithin(t, time.Minute, func() (*follower.Follower, error) { return follower.Open(dir, opts) })
	require.NoError(t, err)
	got, _ := f.Position()
	require.Equal(t, lsn, got)
	require.Positive(t, f.Stats().BackgroundErrors)
	require.NoError(t, f.Close())
}

// TestOpenFatalDuringOpen: Pebble declares a failed MANIFEST write during
// the open's flush fatal and expects the process to die; the follower's
// open returns store.ErrUnavailable wrapping store.ErrFailed and
// the cause, and the process lives on.
func TestOpenFatalDuringOpen(t *testing.T) {
	dir := t.TempDir()
	filledStore(t, dir, follower.Options{}, true)
	inj := errorfs.InjectorFunc(func(op errorfs.Op) error {
		if op.Kind == errorfs.OpFileWrite && strings.Contains(filepath.Base(op.Path), "MANIFEST") {
			return syscall.ENOSPC
		}
		return nil
	})
	opts := &follower.Options{Store: store.Options{FS: errorfs.Wrap(vfs.Default, inj), Logger: quietLogger}}
	for range 2 { // the second Open finds the dead one and answers at once
		_, err := openWithin(t, time.Minute, func() (*follower.Follower, error) { return follower.Open(dir, opts) })
		require.ErrorIs(t, err, store.ErrUnavailable)
		require.ErrorIs(t, err, store.ErrFailed)
		require.ErrorIs(t, err, syscall.ENOSPC)
	}
}

// TestOpenContextCancel: an open stuck in the filesystem (a write that
// blocks) returns ctx's error when ctx ends; the open completes in the
// background once the write returns, and closes the store again, so the
// next Open opens it.
func TestOpenContextCancel(t *testing.T) {
	dir := t.TempDir()
	lsn := filledStore(t, dir, follower.Options{}, true)

	release := make(chan struct{})
	var blocked atomic.Bool
	inj := errorfs.InjectorFunc(func(op errorfs.Op) error {
		if op.Kind == errorfs.OpFileWrite && strings.HasSuffix(op.Path, ".sst") && blocked.CompareAndSwap(false, true) {
			<-release
		}
		return nil
	})
	opts := &follower.Options{Store: store.Options{FS: errorfs.Wrap(vfs.Default, inj), Logger: quietLogger}}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		for !blocked.Load() {
			time.Sleep(time.Millisecond)
		}
		cancel()
	}()
	_, err := openWithin(t, time.Minute, func() (*follower.Follower, error) { return follower.OpenContext(ctx, dir, opts) })
	require.ErrorIs(t, err, context.Canceled)
	close(release)

	f, err := openWithin(t, time.Minute, func() (*follower.Follower, error) { return follower.Open(dir, opts) })
	require.NoError(t, err)
	got, _ := f.Position()
	require.Equal(t, lsn, got)
	require.NoError(t, f.Close())
}

// TestOpenNewStoreFailureLeavesNothing: a new store that cannot be created
// leaves no directory, LOCK or other file behind.
func TestOpenNewStoreFailureLeavesNothing(t *testing.T) {
	root := t.TempDir()
	inj := errorfs.InjectorFunc(func(op errorfs.Op) error {
		if op.Kind == errorfs.OpCreate && strings.Contains(op.Path, "MANIFEST") {
			return syscall.EIO
		}
		return nil
	})
	opts := &follower.Options{Store: store.Options{FS: errorfs.Wrap(vfs.Default, inj), Logger: quietLogger}}
	absent := filepath.Join(root, "new")
	_, err := follower.Open(absent, opts)
	require.ErrorIs(t, err, syscall.EIO)
	require.NoDirExists(t, absent)

	empty := filepath.Join(root, "empty")
	require.NoError(t, os.Mkdir(empty, 0o755))
	_, err = follower.Open(empty, opts)
	require.ErrorIs(t, err, syscall.EIO)
	names, err := os.ReadDir(empty)
	require.NoError(t, err)
	require.Empty(t, names)
}
