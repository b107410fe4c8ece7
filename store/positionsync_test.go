package store_test

import (
	"io"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"github.com/oncewal/oncewal/internal/crashmem"
	"github.com/oncewal/oncewal/internal/drill"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/store"
	"github.com/oncewal/oncewal/testutil"
	"github.com/oncewal/oncewal/wal"
	"github.com/stretchr/testify/require"
)

// dupStep is one batch of a dupScript: its bytes, its last LSN, whether it
// is fresh, and every session's counter once it is applied.
type dupStep struct {
	raw    []byte
	last   uint64
	fresh  bool
	totals []int64
}

// dupScript is a log of shard 0, epoch 1, over sessions ids: pattern's
// 'F' is a fresh batch adding to every session at its next SeqNo, 'D' a
// duplicate-only batch: an earlier fresh batch's events logged again at
// new LSNs (a client's retries a leader logged once more), which changes
// nothing but the position.
func dupScript(t *testing.T, ids []session.ID, pattern string) []dupStep {
	t.Helper()
	var steps []dupStep
	var fresh [][]wal.Event
	totals := make([]int64, len(ids))
	lsn, seq := uint64(1), session.SeqNo(1)
	for i, c := range pattern {
		var events []wal.Event
		switch c {
		case 'F':
			for j, id := range ids {
				events = append(events, add(id, seq, int64(1+j+i), nil))
				totals[j] += int64(1 + j + i)
			}
			seq++
			fresh = append(fresh, events)
		case 'D':
			events = fresh[i%len(fresh)]
		default:
			t.Fatalf("dupScript: %q", c)
		}
		raw, err := wal.AppendBatch(nil, 0, 1, lsn, events)
		require.NoError(t, err)
		lsn += uint64(len(events))
		steps = append(steps, dupStep{raw: raw, last: lsn - 1, fresh: c == 'F', totals: append([]int64(nil), totals...)})
	}
	return steps
}

// totalsAt is what the counters hold once steps are applied up to LSN
// applied (a batch boundary: batches commit whole).
func totalsAt(t *testing.T, steps []dupStep, applied uint64) []int64 {
	t.Helper()
	if applied == 0 {
		return make([]int64, len(steps[0].totals))
	}
	for _, s := range steps {
		if s.last == applied {
			return s.totals
		}
	}
	t.Fatalf("LSN %d is no batch's end", applied)
	return nil
}

func counters(t *testing.T, st *store.Store, ids []session.ID) []int64 {
	t.Helper()
	out := make([]int64, len(ids))
	for j, id := range ids {
		n, err := st.State().Counter(id, []byte("n"))
		require.NoError(t, err)
		out[j] = n
	}
	return out
}

func quietStore(t *testing.T, fs vfs.FS) *store.Store {
	t.Helper()
	st, err := store.Open("/s", &store.Options{FS: fs, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	return st
}

// pipeline starts steps in order with up to depth Pendings not yet waited
// for, as a follower's Serve does, and waits for all of them before a
// step in pauses and at the end; each ack goes to onAck with its step.
func pipeline(t *testing.T, st *store.Store, steps []dupStep, depth int, pauses map[int]bool, onAck func(i int, ack uint64)) {
	t.Helper()
	type started struct {
		i int
		p *store.Pending
	}
	var queue []started
	wait := func() {
		s := queue[0]
		queue = queue[1:]
		res, err := s.p.Wait()
		require.NoError(t, err, "batch %d", s.i)
		require.False(t, res.Ack.Refused)
		onAck(s.i, res.Ack.AppliedLSN)
	}
	for i, s := range steps {
		if pauses[i] {
			for len(queue) > 0 {
				wait()
			}
		}
		if len(queue) == depth {
			wait()
		}
		queue = append(queue, started{i, st.Start(s.raw)})
	}
	for len(queue) > 0 {
		wait()
	}
}

// walWrites selects the writes and syncs of Pebble's WAL and MANIFEST: the
// crash points of TestPositionOnlyCrashSweep.
func walWrites(op errorfs.Op) bool {
	switch op.Kind {
	case errorfs.OpCreate, errorfs.OpFileWrite, errorfs.OpFileSync, errorfs.OpFileSyncData, errorfs.OpRename:
		return strings.HasSuffix(op.Path, ".log") || strings.Contains(op.Path, "MANIFEST")
	}
	return false
}

// TestPositionOnlyCrashSweep crashes a store at every WAL write and sync,
// and right after every ack, while it applies, pipelined, runs of
// duplicate-only batches (committed without a sync of their own) between
// fresh ones, keeping none or half of what was not synced. The reopened store stands at or past every
// position an ack reported before the crash, holds exactly the state of
// the log up to there, and applying the whole log again — the lost
// duplicate-only batches among it — ends in the oracle's state.
func TestPositionOnlyCrashSweep(t *testing.T) {
	ids := []session.ID{session.NewID(), session.NewID(), session.NewID()}
	steps := dupScript(t, ids, "FFF"+strings.Repeat("D", 20)+"F"+strings.Repeat("D", 22)+"FF"+strings.Repeat("D", 5))
	pauses := map[int]bool{12: true, 30: true, len(steps) - 3: true}
	final := steps[len(steps)-1]

	type point struct {
		fs                *testutil.CrashFS
		acked, waited     atomic.Uint64 // highest ack so far; highest last LSN waited for
		ackedAt, waitedAt atomic.Uint64 // the same when the image was taken
		image             *vfs.MemFS
	}
	// run crashes at the k-th WAL write or sync, or, for k < 0, right
	// after the ack of batch -k-1 (the test's own crash clone, while
	// Pebble's goroutines run); k = -1<<20 only counts.
	run := func(k, pct int) *point {
		c := &point{}
		mem := vfs.NewCrashableMem()
		clone := vfs.CrashCloneCfg{UnsyncedDataPercent: pct, RNG: rand.New(rand.NewPCG(uint64(k), uint64(pct)))}
		var image *vfs.MemFS
		c.fs = testutil.NewCrashFS(mem, testutil.CrashOptions{
			At: k, Count: walWrites, Continue: true, Disarmed: true, Clone: clone,
			OnCrash: func() {
				c.ackedAt.Store(c.acked.Load())
				c.waitedAt.Store(c.waited.Load())
			},
		})
		st := quietStore(t, c.fs)
		for _, s := range steps[:3] {
			_, err := st.Apply(s.raw)
			require.NoError(t, err)
		}
		c.fs.Arm()
		pipeline(t, st, steps[3:], 3, pauses, func(i int, ack uint64) {
			last := steps[3+i].last
			require.LessOrEqual(t, ack, last, "an ack reported a position past its batch")
			require.GreaterOrEqual(t, ack, c.acked.Load(), "acks went backwards")
			c.acked.Store(ack)
			c.waited.Store(last)
			if i == -k-1 {
				image = mem.CrashClone(clone)
				c.ackedAt.Store(ack)
				c.waitedAt.Store(last)
			}
		})
		require.Equal(t, final.last, c.acked.Load(), "the last batch was not acknowledged at its own position")
		require.Equal(t, final.totals, counters(t, st, ids))
		require.NoError(t, st.Close())
		if k >= 0 {
			image = c.fs.Image()
		}
		c.image = image
		return c
	}
	points := run(-1<<20, 0).fs.Counted()
	require.Greater(t, points, 10)
	crashed, lagging := 0, 0
	for _, pct := range []int{0, 50} {
		for k := -(len(steps) - 3); k < points; k++ {
			c := run(k, pct)
			img := c.image
			if img == nil {
				continue // Pebble's writes coalesced differently this run
			}
			crashed++
			if c.waitedAt.Load() > c.ackedAt.Load() {
				lagging++ // a waited-for batch's ack was behind it: its commit not synced yet
			}
			st := quietStore(t, img)
			applied, _ := st.Position()
			require.GreaterOrEqual(t, applied, c.ackedAt.Load(),
				"crash point %d (%d%% unsynced kept): recovered at LSN %d, but LSN %d was acknowledged", k, pct, applied, c.ackedAt.Load())
			require.Equal(t, totalsAt(t, steps, applied), counters(t, st, ids), "crash point %d (%d%%): state at LSN %d", k, pct, applied)
			for _, s := range steps {
				res, err := st.Apply(s.raw)
				require.NoError(t, err)
				if s.last > applied && !s.fresh {
					require.Zero(t, res.Applied, "a duplicate-only batch applied something")
				}
			}
			applied, _ = st.Position()
			require.Equal(t, final.last, applied)
			require.Equal(t, final.totals, counters(t, st, ids), "crash point %d (%d%%)", k, pct)
			require.NoError(t, st.Close())
		}
	}
	require.Greater(t, crashed, 2*(len(steps)-3), "too few crash images were taken")
	require.Positive(t, lagging, "no crash came while an ack lagged its batch (no position-only commit awaited its sync)")
	t.Logf("%d WAL crash points and %d acks, %d recoveries verified, %d while an ack lagged its batch", points, len(steps)-3, crashed, lagging)
}

// TestPositionOnlyBatchesShareSyncs: a pipelined run of duplicate-only
// batches syncs the WAL once per DefaultPositionSyncEvery batches, not once
// per batch; each ack reports the last synced position: its own batch's
// for the first (started with nothing in flight) and every 16th after it,
// the one before for the rest. The last batch of the run, with nothing
// started after it, is acknowledged at its own position (Wait syncs it),
// as is a duplicate-only batch applied alone.
func TestPositionOnlyBatchesShareSyncs(t *testing.T) {
	ids := []session.ID{session.NewID(), session.NewID()}
	const dups = 70
	steps := dupScript(t, ids, "FF"+strings.Repeat("D", dups+1))
	fs := &testutil.SyncFS{FS: vfs.NewMem()}
	st := quietStore(t, fs)
	defer st.Close()
	for _, s := range steps[:2] {
		res, err := st.Apply(s.raw)
		require.NoError(t, err)
		require.Equal(t, s.last, res.Ack.AppliedLSN)
	}
	syncs0 := fs.Syncs()
	run := steps[2 : 2+dups]
	pipeline(t, st, run, 4, nil, func(i int, ack uint64) {
		// The last synced commit at or before batch i: the run's first,
		// every 16th after it, and the run's last.
		synced := run[i/store.DefaultPositionSyncEvery*store.DefaultPositionSyncEvery].last
		if i == len(run)-1 {
			synced = run[i].last
		}
		require.Equal(t, synced, ack, "ack of duplicate-only batch %d", i)
		applied, _ := st.Position()
		require.Equal(t, ack, applied, "Position is not the acknowledged position")
	})
	syncs := fs.Syncs() - syncs0
	require.LessOrEqual(t, syncs, int64(dups/store.DefaultPositionSyncEvery+3),
		"%d WAL syncs for %d duplicate-only batches", syncs, dups)
	t.Logf("%d duplicate-only batches, %d WAL syncs", dups, syncs)

	last := steps[len(steps)-1]
	syncs0 = fs.Syncs()
	res, err := st.Apply(last.raw)
	require.NoError(t, err)
	require.Equal(t, int64(1), fs.Syncs()-syncs0, "WAL syncs of one Apply")
	require.Zero(t, res.Applied)
	require.Equal(t, last.last, res.Ack.AppliedLSN, "Apply of a duplicate-only batch did not ack its own position")
	require.Equal(t, last.last, st.Hello().AppliedLSN)
	require.Equal(t, last.totals, counters(t, st, ids))
}

// TestPositionAckNeverPassesFailedSync: when the WAL sync that would make
// duplicate-only batches durable fails — Wait's own when the stream pauses,
// or the synced commit of the 16th in a row — no ack has reported a
// position beyond the last sync that succeeded: the batches from the
// failure on are refused (ErrFailed) at that position, and a power
// failure that keeps nothing unsynced comes back at or past every ack.
func TestPositionAckNeverPassesFailedSync(t *testing.T) {
	for _, tc := range []struct {
		name   string
		dups   int // duplicate-only batches started
		failAt int // the sync fails from the start of this one (dups: at the pause)
	}{
		{"paused", 5, 5},
		{"16th", 20, store.DefaultPositionSyncEvery}, // the first is synced (nothing in flight), then 15 are not
	} {
		t.Run(tc.name, func(t *testing.T) {
			ids := []session.ID{session.NewID(), session.NewID()}
			steps := dupScript(t, ids, "FF"+strings.Repeat("D", tc.dups))
			mem := vfs.NewCrashableMem()
			syncs := &errorfs.Toggle{Injector: errorfs.InjectorFunc(func(op errorfs.Op) error {
				if (op.Kind == errorfs.OpFileSync || op.Kind == errorfs.OpFileSyncData) && strings.HasSuffix(op.Path, ".log") {
					return errorfs.ErrInjected
				}
				return nil
			})}
			st := quietStore(t, errorfs.Wrap(crashmem.Wrap(mem), syncs))
			for _, s := range steps[:2] {
				_, err := st.Apply(s.raw)
				require.NoError(t, err)
			}
			durable := steps[2].last // the first duplicate-only batch: started idle, synced
			var queue []*store.Pending
			var acked uint64
			failed := false
			wait := func() {
				res, err := queue[0].Wait()
				queue = queue[1:]
				if err != nil {
					require.ErrorIs(t, err, store.ErrFailed)
					require.True(t, res.Ack.Refused)
					failed = true
				} else {
					require.False(t, failed, "a batch after a failed sync was acknowledged")
				}
				require.Equal(t, durable, res.Ack.AppliedLSN, "an ack reported a position no sync made durable")
				acked = max(acked, res.Ack.AppliedLSN)
			}
			for i, s := range steps[2:] {
				if i == tc.failAt {
					syncs.On()
				}
				if len(queue) == 4 {
					wait()
				}
				queue = append(queue, st.Start(s.raw))
			}
			if tc.failAt == tc.dups {
				syncs.On()
			}
			for len(queue) > 0 {
				wait()
			}
			require.True(t, failed, "the failed sync was not reported")
			crashed := mem.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 0})
			// The failed store is abandoned as a crashed process leaves it
			// (Kill reports its failure again).
			require.ErrorIs(t, drill.Kill(st), store.ErrFailed)

			st = quietStore(t, crashed)
			defer st.Close()
			applied, _ := st.Position()
			require.GreaterOrEqual(t, applied, acked)
			require.Equal(t, totalsAt(t, steps, applied), counters(t, st, ids))
			for _, s := range steps {
				_, err := st.Apply(s.raw)
				require.NoError(t, err)
			}
			require.Equal(t, steps[len(steps)-1].totals, counters(t, st, ids))
		})
	}
}
