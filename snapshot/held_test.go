package snapshot_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/oncewal/oncewal/internal/rawdb"
	"github.com/oncewal/oncewal/store"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"github.com/oncewal/oncewal/snapshot"
	"github.com/stretchr/testify/require"
)

// lostAnswers wraps a donor whose first lose Begin answers are lost on the
// way back (the donor took the snapshot; the fetcher never hears of it) and
// whose End fails while deaf is set (a fetcher killed before its End).
type lostAnswers struct {
	*snapshot.Donor
	lose int
	deaf bool
}

func (s *lostAnswers) BeginFor(ctx context.Context, shard uint32, holder string) (snapshot.Manifest, error) {
	m, err := s.Donor.BeginFor(ctx, shard, holder)
	if err == nil && s.lose > 0 {
		s.lose--
		return snapshot.Manifest{}, errDisconnected
	}
	return m, err
}

func (s *lostAnswers) Begin(ctx context.Context, shard uint32) (snapshot.Manifest, error) {
	return s.BeginFor(ctx, shard, "")
}

func (s *lostAnswers) End(ctx context.Context, id string) error {
	if s.deaf {
		return errDisconnected
	}
	return s.Donor.End(ctx, id)
}

// countPins returns a DonorOptions.Pin that counts the pins it holds, and
// their number.
func countPins() (pin func() (func(), error), pinned func() int) {
	var mu sync.Mutex
	pins := 0
	pin = func() (func(), error) {
		mu.Lock()
		pins++
		mu.Unlock()
		return func() { mu.Lock(); pins--; mu.Unlock() }, nil
	}
	return pin, func() int { mu.Lock(); defer mu.Unlock(); return pins }
}

// TestLostBeginAnswerReleased: a snapshot whose Begin answer was lost, and
// one a killed fetcher never ended, no longer pin the donor's checkpoint
// and log until the idle timeout: the fetcher's next Begin for the same
// holder (the retry, or the restarted fetcher) releases them, and the
// donor counts them (DonorStats.Superseded). Without a holder the idle
// timeout releases them (IdledOut).
func TestLostBeginAnswerReleased(t *testing.T) {
	fs := vfs.NewMem()
	fx := newFixture(t, fs, -1)
	pin, pinned := countPins()
	d, err := snapshot.NewDonor(rawdb.Of(fx.donor), &snapshot.DonorOptions{FS: fs, Dir: "/donor/held", Describe: store.Describe, RateLimit: -1, Pin: pin})
	require.NoError(t, err)
	defer d.Close()
	opts := &snapshot.Options{RetryBackoff: time.Millisecond}

	// Two Begin answers lost: the retries release both (a random holder
	// per Fetch).
	_, _, err = snapshot.Fetch(context.Background(), &lostAnswers{Donor: d, lose: 2}, fs, target, fx.want(), opts)
	require.NoError(t, err)
	require.Zero(t, d.Serving(), "a snapshot whose Begin answer was lost is still served")
	require.Zero(t, pinned(), "a snapshot whose Begin answer was lost still pins the log")
	st := d.Stats()
	require.Equal(t, uint64(2), st.Superseded)
	require.Equal(t, uint64(3), st.Begun)
	require.Equal(t, uint64(1), st.Ended)

	// A fetcher killed before its End: the same holder's next Begin
	// releases its snapshot.
	held := *opts
	held.Holder = "f1/shard-0000"
	_, _, err = snapshot.Fetch(context.Background(), &lostAnswers{Donor: d, deaf: true}, fs, target, fx.want(), &held)
	require.NoError(t, err)
	require.Equal(t, 1, d.Serving())
	require.Equal(t, 1, pinned())
	_, _, err = snapshot.Fetch(context.Background(), d, fs, target, fx.want(), &held)
	require.NoError(t, err)
	require.Zero(t, d.Serving())
	require.Zero(t, pinned())
	require.Equal(t, uint64(3), d.Stats().Superseded)

	// Another holder's snapshot is not touched; the idle timeout bounds it.
	idle, err := snapshot.NewDonor(rawdb.Of(fx.donor), &snapshot.DonorOptions{FS: fs, Dir: "/donor/idle", Describe: store.Describe,
		RateLimit: -1, IdleTimeout: 2 * time.Second}) // longer than a fetch on a loaded machine
	require.NoError(t, err)
	defer idle.Close()
	_, err = idle.BeginFor(context.Background(), 0, "f2/shard-0000")
	require.NoError(t, err)
	other := *opts
	other.Holder = "f3/shard-0000"
	_, _, err = snapshot.Fetch(context.Background(), idle, fs, target, fx.want(), &other)
	require.NoError(t, err)
	st = idle.Stats()
	require.Equal(t, 1, st.Serving)
	require.Zero(t, st.Superseded)
	require.Eventually(t, func() bool { return idle.Stats().IdledOut == 1 }, 10*time.Second, 10*time.Millisecond)
	require.Zero(t, idle.Serving())
}

// meetFS holds the checkpoint of first back until the checkpoint of second
// has begun (its WAL flush is done): the two cuts then hold the same files.
func meetFS(first, second string) vfs.FS {
	met := make(chan struct{})
	return errorfs.Wrap(vfs.NewMem(), errorfs.InjectorFunc(func(op errorfs.Op) error {
		switch {
		case op.Kind != errorfs.OpMkdirAll:
		case op.Path == first:
			<-met
		case op.Path == second:
			close(met)
		}
		return nil
	}))
}

// TestConcurrentBeginsPinApart: two fetchers begin at once on an idle store
// (two followers rebuilt from one leader), so both checkpoints hold the
// same bytes. Each Begin is still its own snapshot with its own ID, and
// each End releases its own pin: an entry keyed by content alone would let
// the second Begin overwrite the first and leak the first's pin (the
// leader's WAL retained for good).
func TestConcurrentBeginsPinApart(t *testing.T) {
	fs := meetFS("/donor/pins/snap-1", "/donor/pins/snap-2")
	fx := newFixture(t, fs, -1)
	pin, pinned := countPins()
	d, err := snapshot.NewDonor(rawdb.Of(fx.donor), &snapshot.DonorOptions{FS: fs, Dir: "/donor/pins", Describe: store.Describe, RateLimit: -1, Pin: pin})
	require.NoError(t, err)
	defer d.Close()
	var ms [2]snapshot.Manifest
	var errs [2]error
	var wg sync.WaitGroup
	for i := range ms {
		wg.Go(func() { ms[i], errs[i] = d.BeginFor(context.Background(), 0, "f"+strconv.Itoa(i)) })
	}
	wg.Wait()
	require.NoError(t, errors.Join(errs[:]...))
	require.Equal(t, ms[0].Files, ms[1].Files, "the test did not make the two cuts alike")
	require.NotEqual(t, ms[0].ID, ms[1].ID, "two Begins share one ID")
	st := d.Stats()
	require.Equal(t, 2, st.Serving)
	require.Equal(t, uint64(2), st.Begun)
	for _, m := range ms {
		require.NoError(t, m.Check())
		require.NoError(t, d.End(context.Background(), m.ID))
	}
	require.Zero(t, pinned(), "a pin outlived its snapshot")
	require.Zero(t, d.Serving())
}

// TestClosedDonorNotRetried: a donor whose owner closed (DonorOptions.Hold
// refuses) is a refusal, not a dropped connection: Fetch returns
// ErrClosed, still wrapping the owner's error, after one Begin instead
// of retrying it Options.Retries times (about 1.5 s by default) on a donor
// that will not serve again.
func TestClosedDonorNotRetried(t *testing.T) {
	fs := vfs.NewMem()
	fx := newFixture(t, fs, -1)
	errOwnerClosed := errors.New("test: owner closed")
	holds := 0
	d, err := snapshot.NewDonor(rawdb.Of(fx.donor), &snapshot.DonorOptions{FS: fs, Dir: "/donor/closed", Describe: store.Describe,
		Hold: func() (func(), error) { holds++; return nil, errOwnerClosed }})
	require.NoError(t, err)
	defer d.Close()
	_, st, err := snapshot.Fetch(context.Background(), d, fs, target, fx.want(), nil)
	require.ErrorIs(t, err, snapshot.ErrClosed)
	require.ErrorIs(t, err, errOwnerClosed)
	require.Equal(t, 1, holds, "Begins asked of a closed donor")
	require.Zero(t, st.Retries)
	require.Zero(t, d.Serving())
}

// TestDonorBeginAfterClose: a closed Donor answers its package's ErrClosed
// (it used to cut and serve a new snapshot, which nobody would release),
// and a Begin racing Close leaves nothing served.
func TestDonorBeginAfterClose(t *testing.T) {
	fs := vfs.NewMem()
	fx := newFixture(t, fs, -1)
	pin, pinned := countPins()
	d, err := snapshot.NewDonor(rawdb.Of(fx.donor), &snapshot.DonorOptions{FS: fs, Dir: "/donor/after", Describe: store.Describe, RateLimit: -1, Pin: pin})
	require.NoError(t, err)
	_, err = d.Begin(context.Background(), 0)
	require.NoError(t, err)
	require.NoError(t, d.Close())
	require.Zero(t, d.Serving())
	_, err = d.Begin(context.Background(), 0)
	require.ErrorIs(t, err, snapshot.ErrClosed)
	require.Zero(t, d.Serving())
	require.Zero(t, pinned(), "a Begin after Close pinned the log")
	require.NoError(t, d.Close(), "Close is idempotent")
}
