package follower_test

import (
	"context"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/oncewal/oncewal/store"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"github.com/oncewal/oncewal/follower"
	"github.com/oncewal/oncewal/internal/diskguard"
	"github.com/oncewal/oncewal/metrics"
	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/sim"
	"github.com/stretchr/testify/require"
)

// feedConn delivers a log's batches in order, then waits for ctx, and keeps
// the highest position acknowledged.
type feedConn struct {
	log   [][]byte
	next  int
	acked atomic.Uint64
}

func (c *feedConn) Recv(ctx context.Context) ([]byte, error) {
	if c.next < len(c.log) {
		c.next++
		return c.log[c.next-1], nil
	}
	<-ctx.Done()
	return nil, ctx.Err()
}

func (c *feedConn) Send(_ context.Context, a replication.Ack) error {
	if !a.Refused && a.AppliedLSN > c.acked.Load() {
		c.acked.Store(a.AppliedLSN)
	}
	return nil
}

func (c *feedConn) Close() error { return nil }

type feedDialer struct {
	once sync.Once
	conn *feedConn
}

func (d *feedDialer) Dial(ctx context.Context, _ replication.Ack) (replication.FollowerConn, error) {
	var c replication.FollowerConn
	d.once.Do(func() { c = d.conn })
	if c == nil {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return c, nil
}

// within runs fn on a goroutine and fails the test if it has not returned
// after d.
func within[T any](t *testing.T, d time.Duration, what string, fn func() T) T {
	t.Helper()
	done := make(chan T, 1)
	go func() { done <- fn() }()
	select {
	case v := <-done:
		return v
	case <-time.After(d):
		buf := make([]byte, 1<<20)
		t.Logf("%s", buf[:runtime.Stack(buf, true)])
		t.Fatalf("%s did not return within %v", what, d)
		panic("unreachable")
	}
}

// TestServeOnFullDisk: the disk fills up while the follower serves. Pebble
// cannot flush, so it holds the next commit that needs room in the
// memtables, with no deadline (a write stall), and its Flush and Close wait
// too. Serve must still return when its ctx ends and Close must return
// store.ErrStalled wrapping ENOSPC, both in bounded time, with the stall in
// Stats; once the disk has room again the store closes itself, and a
// reopen holds every acknowledged batch and goes on to the oracle's state.
func TestServeOnFullDisk(t *testing.T) {
	w := recordLog(t, sim.WorkloadOptions{Seed: 7, Sessions: 50, Requests: 20000, BatchSize: 100}, 1, nil)
	log := encodeLog(t, w, 0, 1)
	var last uint64
	for _, b := range w.Shards[0] {
		last += uint64(len(b))
	}

	mem := vfs.NewMem()
	var full atomic.Bool
	var injected atomic.Int64
	inj := errorfs.InjectorFunc(func(op errorfs.Op) error {
		if full.Load() && strings.HasSuffix(op.Path, ".sst") &&
			(op.Kind == errorfs.OpFileWrite || op.Kind == errorfs.OpFileWriteAt || op.Kind == errorfs.OpFilePreallocate || op.Kind == errorfs.OpCreate) {
			injected.Add(1)
			return syscall.ENOSPC
		}
		return nil
	})
	opts := testOptions(errorfs.Wrap(mem, inj))
	f, err := follower.Open("/f", opts)
	require.NoError(t, err)

	full.Store(true)
	conn := &feedConn{log: log}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	served := make(chan error, 1)
	go func() { served <- f.Serve(ctx, &feedDialer{conn: conn}) }()
	deadline := time.Now().Add(time.Minute)
	for !f.Stats().WriteStalled {
		require.True(t, time.Now().Before(deadline), "the store never stalled (%d injected errors, acked %d)", injected.Load(), conn.acked.Load())
		time.Sleep(5 * time.Millisecond)
	}
	require.Positive(t, f.Stats().BackgroundErrors)
	err = metrics.FollowerReady(f, 0)()
	require.ErrorIs(t, err, metrics.ErrNotReady)
	require.ErrorContains(t, err, "stalled")
	acked := conn.acked.Load()
	require.Less(t, acked, last, "the whole log went in before the stall: the test needs a longer one")

	cancel()
	require.NoError(t, within(t, 10*time.Second, "Serve after its ctx ended", func() error { return <-served }))
	err = within(t, 30*time.Second, "Close on a full disk", f.Close)
	require.ErrorIs(t, err, store.ErrStalled)
	require.ErrorIs(t, err, syscall.ENOSPC)

	// The disk recovers: the stalled commit and the close complete in the
	// background, and the store can be opened again.
	full.Store(false)
	var g *follower.Follower
	deadline = time.Now().Add(time.Minute)
	for {
		g, err = follower.Open("/f", testOptions(mem))
		if err == nil {
			break
		}
		require.True(t, time.Now().Before(deadline), "the stalled store never closed: %v", err)
		time.Sleep(20 * time.Millisecond)
	}
	lsn, _ := g.Position()
	require.GreaterOrEqual(t, lsn, acked, "an acknowledged batch was lost")
	for _, raw := range log {
		_, err := g.Apply(raw)
		require.NoError(t, err)
	}
	require.NoError(t, w.Oracle.Verify(g.State()))
	require.NoError(t, g.Close())
}

// TestCloseOnFullDisk: Close on a full disk, with batches in the memtable
// and no background error yet, must not flush — the flush would rotate
// Pebble's WAL, and a failed close of the old WAL is a panic with Pebble's
// mutex released: a fatal error that kills the process. Close returns, and
// a reopen once the disk has room holds every batch applied.
func TestCloseOnFullDisk(t *testing.T) {
	w := recordLog(t, sim.WorkloadOptions{Seed: 8, Sessions: 20, Requests: 500, BatchSize: 50}, 1, nil)
	log := encodeLog(t, w, 0, 1)
	mem := vfs.NewMem()
	var full atomic.Bool
	inj := errorfs.InjectorFunc(func(op errorfs.Op) error {
		if full.Load() && (op.Kind == errorfs.OpFileWrite || op.Kind == errorfs.OpFileWriteAt ||
			op.Kind == errorfs.OpFilePreallocate || op.Kind == errorfs.OpCreate) {
			return syscall.ENOSPC
		}
		return nil
	})
	f, err := follower.Open("/f", testOptions(errorfs.Wrap(mem, inj)))
	require.NoError(t, err)
	var lsn uint64
	for _, raw := range log {
		res, err := f.Apply(raw)
		require.NoError(t, err)
		lsn = res.Ack.AppliedLSN
	}
	mem.TestingSetDiskUsage(vfs.DiskUsage{AvailBytes: 4 << 10, TotalBytes: 64 << 20, UsedBytes: 64<<20 - 4<<10})
	full.Store(true)
	_ = within(t, 30*time.Second, "Close on a full disk", f.Close) // closing the WAL may fail: ENOSPC

	full.Store(false)
	g, err := follower.Open("/f", testOptions(mem))
	require.NoError(t, err)
	got, _ := g.Position()
	require.Equal(t, lsn, got)
	require.NoError(t, w.Oracle.Verify(g.State()))
	require.NoError(t, g.Close())
}

// TestMinFreeBytes: below Options.Store.MinFreeBytes of free space, Apply refuses
// a batch with replication.ErrDiskFull and changes nothing, and Serve holds
// its batches (Stats.DiskFull, /readyz not ready) instead of writing them;
// once there is room, the follower goes on to the oracle's state.
func TestMinFreeBytes(t *testing.T) {
	w := recordLog(t, sim.WorkloadOptions{Seed: 9, Sessions: 20, Requests: 2000, BatchSize: 50}, 1, nil)
	log := encodeLog(t, w, 0, 1)
	mem := vfs.NewMem()
	o := testOptions(mem)
	o.Store.MinFreeBytes = 1 << 20
	f, err := follower.Open("/f", o)
	require.NoError(t, err)
	res, err := f.Apply(log[0])
	require.NoError(t, err)
	first := res.Ack.AppliedLSN

	mem.TestingSetDiskUsage(vfs.DiskUsage{AvailBytes: 1<<20 - 1, TotalBytes: 1 << 30})
	time.Sleep(diskguard.Interval) // the guard's last reading expires
	res, err = f.Apply(log[1])
	require.ErrorIs(t, err, store.ErrDiskFull)
	require.True(t, res.Ack.Refused)
	lsn, _ := f.Position()
	require.Equal(t, first, lsn)
	require.True(t, f.Stats().DiskFull)

	conn := &feedConn{log: log}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	served := make(chan error, 1)
	go func() { served <- f.Serve(ctx, &feedDialer{conn: conn}) }()
	time.Sleep(3 * diskguard.Interval)
	lsn, _ = f.Position()
	require.Equal(t, first, lsn, "a batch was applied on a full disk")
	err = metrics.FollowerReady(f, 0)()
	require.ErrorIs(t, err, metrics.ErrNotReady)
	require.ErrorContains(t, err, "nearly full")

	mem.TestingSetDiskUsage(vfs.DiskUsage{AvailBytes: 1 << 30, TotalBytes: 1 << 30})
	var last uint64
	for _, b := range w.Shards[0] {
		last += uint64(len(b))
	}
	deadline := time.Now().Add(time.Minute)
	for conn.acked.Load() < last {
		require.True(t, time.Now().Before(deadline), "the follower never resumed: acked %d of %d", conn.acked.Load(), last)
		time.Sleep(5 * time.Millisecond)
	}
	require.False(t, f.Stats().DiskFull)
	require.NoError(t, w.Oracle.Verify(f.State()))
	cancel()
	require.NoError(t, <-served)
	require.NoError(t, f.Close())
}
