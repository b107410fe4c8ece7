package leader_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncewal/oncewal/replication/inprocess"

	"github.com/oncewal/oncewal/idempotency"
	"github.com/oncewal/oncewal/leader"
	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/snapshot"
	"github.com/oncewal/oncewal/wal"
	"github.com/stretchr/testify/require"
)

// TestAppendAfterClose: a closed leader refuses with its package's
// ErrClosed, which wraps wal.ErrClosed (what callers tested before).
func TestAppendAfterClose(t *testing.T) {
	l := open(t, t.TempDir(), &leader.Options{Shards: 2})
	ev := wal.Event{Op: wal.OpPut, Session: session.NewID(), Key: []byte("k")}
	_, err := l.Append(ev)
	require.NoError(t, err)
	require.NoError(t, l.Close())
	_, err = l.Append(ev)
	require.ErrorIs(t, err, leader.ErrClosed)
	require.ErrorIs(t, err, wal.ErrClosed)
}

// closedErr reports whether err is one of the typed errors a closed leader
// (or a caller's own context) answers with.
func closedErr(err error) bool {
	for _, want := range []error{leader.ErrClosed, wal.ErrClosed, idempotency.ErrClosed,
		idempotency.ErrStoreUnavailable, context.Canceled, context.DeadlineExceeded} {
		if errors.Is(err, want) {
			return true
		}
	}
	return false
}

// TestCloseWhileRunning: Close while Run ships and runs retention passes
// every millisecond, while appends, WaitAcked, snapshot donors, Register /
// Unregister, Retain and Stats run on other goroutines, never panics (it
// used to: "pebble: closed" from the retention pass on the closed store)
// and never hangs: Run returns, every call in flight returns, and every
// call after Close returns a typed error (leader.ErrClosed,
// wal.ErrClosed) — never a panic.
func TestCloseWhileRunning(t *testing.T) {
	for round := range 12 {
		t.Run(fmt.Sprint(round), func(t *testing.T) { closeWhileRunning(t, round) })
	}
}

func closeWhileRunning(t *testing.T, round int) {
	rng := rand.New(rand.NewPCG(uint64(round), 7))
	dir := t.TempDir()
	tr := inprocess.New(inprocess.FaultsNone, 1)
	defer tr.Close()
	l := open(t, dir, &leader.Options{Shards: 1, Followers: []string{"f1"},
		Listener:          func(uint32) replication.Listener { return tr },
		RetentionInterval: time.Millisecond, SegmentSize: 4 << 10, Logger: discard()})
	donor, err := l.Donor(0, &snapshot.DonorOptions{RateLimit: -1})
	require.NoError(t, err)
	defer donor.Close()
	sh, _ := l.Shard(0)

	runDone := make(chan error, 1)
	go func() { runDone <- l.Run(context.Background()) }() // only Close stops it

	stop := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	loop := func(name string, fn func() error) {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if err := fn(); err != nil && !closedErr(err) {
					errs <- fmt.Errorf("%s: %w", name, err)
					return
				}
			}
		})
	}
	id := session.NewID()
	loop("append", func() error {
		_, err := l.Append(wal.Event{Op: wal.OpAdd, Session: id, Key: []byte("n"), Delta: 1})
		return err
	})
	loop("wait-acked", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
		defer cancel()
		err := sh.WaitAcked(ctx, sh.NextLSN()-1, leader.AckOne)
		return err
	})
	loop("donor", func() error {
		ctx := context.Background()
		m, err := donor.Begin(ctx, 0)
		if err != nil {
			return err
		}
		defer donor.End(ctx, m.ID)
		buf := make([]byte, 4<<10)
		for _, f := range m.Files {
			if _, err := donor.Read(ctx, m.ID, f.Name, 0, buf); err != nil && !errors.Is(err, io.EOF) {
				return err
			}
		}
		return nil
	})
	var claims atomic.Uint64
	loop("claim", func() error {
		c, err := sh.Ledger().Claim("s", fmt.Sprint(claims.Add(1)), []byte("p"))
		if err != nil {
			return err
		}
		_, err = sh.Commit(c, []byte("ok"), wal.Event{Op: wal.OpAdd, Session: id, Key: []byte("n"), Delta: 1})
		return err
	})
	loop("register", func() error {
		if err := l.Register("f2"); err != nil {
			return err
		}
		return l.Unregister("f2")
	})
	loop("retain", l.Retain)
	loop("stats", func() error { _ = l.Stats(); _ = sh.StoreStats(); return nil })

	time.Sleep(time.Duration(5+rng.IntN(40)) * time.Millisecond)
	closed := make(chan error, 1)
	go func() { closed <- l.Close() }()
	select {
	case err := <-closed:
		require.NoError(t, err)
	case <-time.After(20 * time.Second):
		t.Fatal("Close hung while Run ran")
	}
	select {
	case err := <-runDone:
		require.True(t, err == nil || errors.Is(err, leader.ErrClosed), "Run: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not return after Close")
	}
	time.Sleep(5 * time.Millisecond) // every loop runs at least once after Close
	close(stop)
	waited := make(chan struct{})
	go func() { wg.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-time.After(20 * time.Second):
		t.Fatal("a call hung after Close")
	}
	close(errs)
	for err := range errs {
		t.Error(err)
	}

	// After Close: typed errors, no panic.
	require.ErrorIs(t, l.Run(context.Background()), leader.ErrClosed)
	require.ErrorIs(t, l.Retain(), leader.ErrClosed)
	require.ErrorIs(t, l.Register("f3"), leader.ErrClosed)
	require.ErrorIs(t, l.Unregister("f1"), leader.ErrClosed)
	require.ErrorIs(t, sh.WaitAcked(context.Background(), 1, leader.AckOne), leader.ErrClosed)
	require.ErrorIs(t, l.WaitAcked(context.Background(), leader.AckOne), leader.ErrClosed)
	_, err = donor.Begin(context.Background(), 0)
	require.ErrorIs(t, err, leader.ErrClosed)
	_, err = l.Donor(0, &snapshot.DonorOptions{Dir: filepath.Join(t.TempDir(), "d")})
	require.ErrorIs(t, err, leader.ErrClosed)
	_, err = l.Append(wal.Event{Op: wal.OpAdd, Session: id, Key: []byte("n"), Delta: 1})
	require.ErrorIs(t, err, leader.ErrClosed)
	require.ErrorIs(t, err, wal.ErrClosed)
	_ = l.Stats()
	require.NoError(t, l.Close())
}
