package snapshot_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oncewal/oncewal/internal/rawdb"
	"github.com/oncewal/oncewal/store"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/oncewal/oncewal/follower"
	"github.com/oncewal/oncewal/sim"
	"github.com/oncewal/oncewal/snapshot"
	"github.com/stretchr/testify/require"
)

var quiet = slog.New(slog.DiscardHandler)

func smallMemtable(o *pebble.Options) { o.MemTableSize = 256 << 10 }

func storeOptions(fs vfs.FS) *follower.Options {
	return &follower.Options{Store: store.Options{FS: fs, Logger: quiet, PebbleOptions: smallMemtable, HWMLogBatches: 2}}
}

// fixture: a donor store that applied the whole log and a target store that
// applied its first part, on one filesystem.
type fixture struct {
	fs      vfs.FS
	log     *sim.Log
	batches [][]byte
	donor   *follower.Follower
	d       *snapshot.Donor
	oldLSN  uint64
	newLSN  uint64
}

const target = "/node/store"

func newFixture(t *testing.T, fs vfs.FS, donorBatches int) *fixture {
	t.Helper()
	log, err := sim.Record(sim.GenerateWorkload(sim.WorkloadOptions{Seed: 3, Sessions: 6, Requests: 300, RetryRate: 0.1, CloseRate: 0.03, BatchSize: 12}), 1)
	require.NoError(t, err)
	batches, err := log.Encode(0, 0, 1)
	require.NoError(t, err)
	fx := &fixture{fs: fs, log: log, batches: batches}
	if donorBatches < 0 {
		donorBatches = len(batches)
	}
	fx.donor, err = follower.Open("/donor/store", storeOptions(fs))
	require.NoError(t, err)
	t.Cleanup(func() { _ = fx.donor.Close() })
	for _, raw := range batches[:donorBatches] {
		_, err := fx.donor.Apply(raw)
		require.NoError(t, err)
	}
	fx.newLSN, _ = fx.donor.Position()
	fx.d, err = snapshot.NewDonor(rawdb.Of(fx.donor), &snapshot.DonorOptions{FS: fs, Dir: "/donor/snapshots", Describe: store.Describe, RateLimit: -1})
	require.NoError(t, err)
	t.Cleanup(func() { _ = fx.d.Close() })

	f, err := follower.Open(target, storeOptions(fs))
	require.NoError(t, err)
	for _, raw := range batches[:len(batches)/3] {
		_, err := f.Apply(raw)
		require.NoError(t, err)
	}
	fx.oldLSN, _ = f.Position()
	require.NoError(t, f.Close())
	return fx
}

func (fx *fixture) want() snapshot.Want {
	return snapshot.Want{Shard: 0, Identity: store.IdentityString(&storeOptions(fx.fs).Store), MinLSN: fx.oldLSN, MinEpoch: 1, Describe: store.Describe}
}

// finish opens the target store, checks it is at one of the allowed
// positions, replicates the whole log into it and checks it against the
// oracle.
func (fx *fixture) finish(t *testing.T, fs vfs.FS, allowed ...uint64) uint64 {
	t.Helper()
	f, err := follower.Open(target, storeOptions(fs))
	require.NoError(t, err)
	defer func() { require.NoError(t, f.Close()) }()
	lsn, _ := f.Position()
	require.Contains(t, allowed, lsn, "the store opened at LSN %d: neither the old nor the new store", lsn)
	for _, raw := range fx.batches {
		_, err := f.Apply(raw)
		require.NoError(t, err)
	}
	require.NoError(t, fx.log.Oracle.Verify(f.State()))
	for _, p := range []string{target + ".rebuild", target + ".rebuild-old", target + ".rebuild-marker"} {
		_, err := fs.Stat(p)
		require.Error(t, err, "%s left behind", p)
	}
	return lsn
}

func TestRebuildInstallsTheDonorsCut(t *testing.T) {
	fx := newFixture(t, vfs.NewMem(), -1)
	m, st, err := snapshot.Rebuild(context.Background(), fx.d, fx.fs, target, fx.want(), &snapshot.Options{ChunkSize: 4096})
	require.NoError(t, err)
	require.Equal(t, fx.newLSN, m.Cut.AppliedLSN)
	require.EqualValues(t, 1, m.Cut.Epoch)
	require.Equal(t, m.Bytes(), st.Bytes)
	require.Zero(t, fx.d.Serving(), "the donor released the snapshot")
	require.Equal(t, fx.newLSN, fx.finish(t, fx.fs, fx.newLSN))
}

// TestCrashAtEveryInstallStep crashes (CrashClone, keeping a random share of
// unsynced writes) after each durable step of the install and of a recovery
// itself interrupted, and at the point where the fetch has staged the
// snapshot: every image opens as the old store or the new one, and then
// replicates to the oracle's state.
func TestCrashAtEveryInstallStep(t *testing.T) {
	mem := vfs.NewCrashableMem()
	fx := newFixture(t, mem, -1)
	_, _, err := snapshot.Fetch(context.Background(), fx.d, mem, target, fx.want(), nil)
	require.NoError(t, err)
	rng := rand.New(rand.NewPCG(1, 2))
	type image struct {
		step string
		fs   *vfs.MemFS
	}
	crash := func(step string) image {
		return image{step, mem.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: rng.IntN(101), RNG: rng})}
	}
	images := []image{crash("staged")}
	var steps []string
	snapshot.SetInstallStep(func(step string) {
		steps = append(steps, step)
		images = append(images, crash(step))
	})
	defer snapshot.SetInstallStep(nil)
	require.NoError(t, snapshot.Install(mem, target))
	require.Equal(t, []string{"marker-written", "marker", "old", "new", "removed-old", "done"}, steps)

	// A crash during the recovery of each image is recovered too.
	var nested []image
	for _, img := range images[:len(images)-1] {
		// Recover a copy, so that the image itself is opened below too.
		copied := img.fs.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 100, RNG: rng})
		snapshot.SetInstallStep(func(step string) {
			nested = append(nested, image{img.step + "/" + step, copied.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: rng.IntN(101), RNG: rng})})
		})
		require.NoError(t, snapshot.Recover(copied, target))
	}
	snapshot.SetInstallStep(nil)
	seen := map[uint64]int{}
	for _, img := range append(images, nested...) {
		lsn := fx.finish(t, img.fs, fx.oldLSN, fx.newLSN)
		seen[lsn]++
		// Before the marker the old store stays; from it on, the new one.
		switch {
		case img.step == "staged" || strings.HasPrefix(img.step, "marker-written"):
			require.Equal(t, fx.oldLSN, lsn, img.step)
		case img.step == "marker" || strings.HasPrefix(img.step, "marker/"):
			require.Equal(t, fx.newLSN, lsn, img.step)
		}
	}
	require.Positive(t, seen[fx.oldLSN])
	require.Positive(t, seen[fx.newLSN])
	t.Logf("%d crash images (%d in recoveries): %d opened as the old store, %d as the new", len(images)+len(nested), len(nested), seen[fx.oldLSN], seen[fx.newLSN])
}

// faultySource wraps a Source with the faults of a network and of a bad
// donor.
type faultySource struct {
	snapshot.Source
	mu       sync.Mutex
	reads    int
	flipAt   int  // flip a byte of this read (1-based); 0 none
	eofAt    int  // end the file early at this read
	dropEach int  // fail every dropEach-th read with a disconnect
	forgetAt int  // report the snapshot unknown at this read
	badSum   bool // tamper with the manifest
}

var errDisconnected = errors.New("test: disconnected")

func (s *faultySource) Begin(ctx context.Context, shard uint32) (snapshot.Manifest, error) {
	m, err := s.Source.Begin(ctx, shard)
	if err == nil && s.badSum {
		m.Cut.AppliedLSN++
	}
	return m, err
}

func (s *faultySource) Read(ctx context.Context, id, name string, off int64, p []byte) (int, error) {
	s.mu.Lock()
	s.reads++
	r := s.reads
	s.mu.Unlock()
	switch {
	case r == s.forgetAt:
		return 0, snapshot.ErrUnknownSnapshot
	case s.dropEach > 0 && r%s.dropEach == 0:
		n, _ := s.Source.Read(ctx, id, name, off, p[:len(p)/2])
		return n, errDisconnected
	case r == s.eofAt:
		n, _ := s.Source.Read(ctx, id, name, off, p[:len(p)/2])
		return n, io.EOF
	}
	n, err := s.Source.Read(ctx, id, name, off, p)
	if r == s.flipAt && n > 0 {
		p[n/2] ^= 0x40
	}
	return n, err
}

// dirState is what "untouched" means: every file of the store and its
// sibling paths, with its sum.
func dirState(t *testing.T, fs vfs.FS) []snapshot.File {
	t.Helper()
	files, err := snapshot.HashDir(fs, target)
	require.NoError(t, err)
	parent, err := fs.List("/node")
	require.NoError(t, err)
	slices.Sort(parent)
	return append(files, snapshot.File{Name: "siblings: " + strings.Join(parent, ",")})
}

func TestBadSnapshotsAreRefusedAndTheOldStoreIsUntouched(t *testing.T) {
	fs := vfs.NewMem()
	fx := newFixture(t, fs, -1)
	behind := func() snapshot.Want { w := fx.want(); w.MinLSN = fx.newLSN + 1; return w }
	otherShard := func() snapshot.Want { w := fx.want(); w.Shard = 1; return w }
	otherIdentity := func() snapshot.Want {
		w := fx.want()
		w.Identity = store.IdentityString(&store.Options{WindowCapacity: 7})
		return w
	}
	newerEpoch := func() snapshot.Want { w := fx.want(); w.MinEpoch = 2; return w }
	for _, tc := range []struct {
		name string
		src  *faultySource
		want func() snapshot.Want
		is   error
	}{
		{"corrupted chunk", &faultySource{flipAt: 3}, fx.want, snapshot.ErrCorrupt},
		{"truncated transfer", &faultySource{eofAt: 2}, fx.want, snapshot.ErrTruncated},
		{"tampered manifest", &faultySource{badSum: true}, fx.want, snapshot.ErrCorrupt},
		{"another shard", &faultySource{}, otherShard, snapshot.ErrMismatch},
		{"another identity", &faultySource{}, otherIdentity, snapshot.ErrMismatch},
		{"older epoch", &faultySource{}, newerEpoch, snapshot.ErrOlderEpoch},
		{"donor behind", &faultySource{}, behind, snapshot.ErrDonorBehind},
		{"donor lost the snapshot every time", &faultySource{forgetAt: 1, dropEach: 1}, fx.want, snapshot.ErrUnknownSnapshot},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := dirState(t, fs)
			tc.src.Source = fx.d
			if tc.name == "donor lost the snapshot every time" {
				tc.src = &faultySource{Source: &forgetful{fx.d}}
			}
			_, _, err := snapshot.Rebuild(context.Background(), tc.src, fs, target, tc.want(), &snapshot.Options{ChunkSize: 4096, RetryBackoff: time.Millisecond})
			require.ErrorIs(t, err, tc.is)
			require.Equal(t, before, dirState(t, fs), "the old store changed")
			require.Zero(t, fx.d.Serving(), "the donor still holds the snapshot")
		})
	}
	require.Equal(t, fx.oldLSN, fx.finish(t, fs, fx.oldLSN))
}

// forgetful is a donor that restarts between every Begin and Read.
type forgetful struct{ snapshot.Source }

func (f *forgetful) Read(context.Context, string, string, int64, []byte) (int, error) {
	return 0, snapshot.ErrUnknownSnapshot
}

func TestFetchResumesAfterDisconnectsAndRestartsALostSnapshot(t *testing.T) {
	fs := vfs.NewMem()
	fx := newFixture(t, fs, -1)
	src := &faultySource{Source: fx.d, dropEach: 3, forgetAt: 5}
	m, st, err := snapshot.Rebuild(context.Background(), src, fs, target, fx.want(), &snapshot.Options{ChunkSize: 4096, RetryBackoff: time.Millisecond})
	require.NoError(t, err)
	require.Positive(t, st.Retries, "disconnects resumed")
	require.Equal(t, 1, st.Restarts, "a lost snapshot started over")
	require.Equal(t, fx.newLSN, m.Cut.AppliedLSN)
	require.Zero(t, fx.d.Serving())
	fx.finish(t, fs, fx.newLSN)
}

func TestThrottle(t *testing.T) {
	fs := vfs.NewMem()
	fx := newFixture(t, fs, -1)
	m, _, err := snapshot.Fetch(context.Background(), fx.d, fs, target, fx.want(), nil)
	require.NoError(t, err)
	// At a rate of a quarter of the snapshot per 100ms, the fetch cannot
	// end before ~300ms (the first chunk goes at once); no upper bound is
	// asserted (a shared machine).
	rate := m.Bytes() * 10 / 4
	start := time.Now()
	_, _, err = snapshot.Fetch(context.Background(), fx.d, fs, target, fx.want(), &snapshot.Options{ChunkSize: int(m.Bytes()/16 + 1), RateLimit: rate})
	require.NoError(t, err)
	require.GreaterOrEqual(t, time.Since(start), 250*time.Millisecond)
}

func TestOptionsValidate(t *testing.T) {
	o := (&snapshot.Options{}).EnsureDefaults()
	require.NoError(t, o.Validate())
	require.Equal(t, 1<<20, o.ChunkSize)
	require.EqualValues(t, snapshot.DefaultRateLimit, o.RateLimit)
	bad := &snapshot.Options{ChunkSize: snapshot.MaxChunkSize + 1, Retries: -1, RetryBackoff: -1}
	err := bad.Validate()
	require.ErrorIs(t, err, snapshot.ErrBadOptions)
	for _, s := range []string{"ChunkSize", "Retries", "RetryBackoff"} {
		require.ErrorContains(t, err, s)
	}
	_, _, err = snapshot.Fetch(context.Background(), nil, vfs.NewMem(), "/x", snapshot.Want{}, bad)
	require.ErrorIs(t, err, snapshot.ErrBadOptions)
	_, err = snapshot.NewDonor(nil, &snapshot.DonorOptions{IdleTimeout: -1})
	require.ErrorIs(t, err, snapshot.ErrBadOptions)
	for _, s := range []string{"Dir", "Describe", "IdleTimeout"} {
		require.ErrorContains(t, err, s)
	}
}

// TestBeginOnClosedStore: a donor whose store was closed under it (a
// follower donating, then closed) refuses Begin with an error wrapping
// pebble.ErrClosed — Pebble panics with it — and leaves no checkpoint
// behind; a Hold that refuses refuses the Begin before any cut.
func TestBeginOnClosedStore(t *testing.T) {
	fs := vfs.NewMem()
	fx := newFixture(t, fs, -1)
	held := errors.New("closing")
	refusing, err := snapshot.NewDonor(rawdb.Of(fx.donor), &snapshot.DonorOptions{FS: fs, Dir: "/donor/held", Describe: store.Describe,
		Hold: func() (func(), error) { return nil, held }})
	require.NoError(t, err)
	_, err = refusing.Begin(context.Background(), 0)
	require.ErrorIs(t, err, held)
	require.NoError(t, fx.donor.Close())
	_, err = fx.d.Begin(context.Background(), 0)
	require.ErrorIs(t, err, pebble.ErrClosed)
	require.Zero(t, fx.d.Serving())
	left, err := fs.List("/donor/snapshots")
	require.NoError(t, err)
	require.Empty(t, left)
}
