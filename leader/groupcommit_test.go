package leader_test

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncewal/oncewal/store"

	"github.com/oncewal/oncewal/leader"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/testutil"
	"github.com/oncewal/oncewal/wal"
	"github.com/stretchr/testify/require"
)

// groupLeader opens a ledger log over n with its WAL on fs (walDir).
func (n *node) groupLeader(fs vfs.FS, onAppend func(wal.Header, []byte), wall ...func() int64) (*leader.LedgerLog, error) {
	o := &leader.LedgerLogOptions{
		WALDir: "/wal", FS: fs, DB: n.db, Tracker: n.tracker, Window: n.window, Table: n.table, State: n.state,
		OnAppend: onAppend,
	}
	if len(wall) > 0 {
		o.Wall = wall[0]
	}
	return leader.OpenLedgerLog(o)
}

// spinUntil waits until cond holds, at most 10 s (a serialized log would
// never let it), and reports whether it did.
func spinUntil(cond func() bool) bool {
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); runtime.Gosched() {
		if cond() {
			return true
		}
	}
	return false
}

// readWAL returns every batch of shard 0's log on fs, raw.
func readWAL(t *testing.T, fs vfs.FS) (hs []wal.Header, raws [][]byte) {
	t.Helper()
	r, err := wal.OpenReaderFS(fs, "/wal", 0)
	require.NoError(t, err)
	defer r.Close()
	for {
		h, raw, err := r.Next()
		if errors.Is(err, io.EOF) {
			return hs, raws
		}
		require.NoError(t, err)
		hs = append(hs, h)
		raws = append(raws, append([]byte(nil), raw...))
	}
}

// TestLedgerLogConcurrentAppendsInOrder: appenders on many goroutines,
// sharing sessions, some closing them: the log's batches are contiguous and
// in LSN order; every session's SeqNos are contiguous in log order and none
// follows its close; OnAppend sees each batch once, in order, synced, with
// the WAL's exact bytes, before the local store applies it; the local store ends at the log's end, and a
// follower applies the whole log without a refusal.
func TestLedgerLogConcurrentAppendsInOrder(t *testing.T) {
	mem := vfs.NewMem()
	a := openNode(t, mem)
	var l *leader.LedgerLog
	var seen []wal.Header
	var seenRaw [][]byte
	var misplaced []string
	onAppend := func(h wal.Header, raw []byte) { // called one at a time
		require.GreaterOrEqual(t, l.Writer().DurableLSN(), h.LastLSN(), "shipped before its sync")
		// Shipped before the local store applies it (the followers apply
		// while it does), after every earlier batch was applied. Checked
		// after the appenders end: a failure here, on an appender's
		// goroutine, would leave the log's locks held.
		if applied, _ := l.Position(); applied != h.FirstLSN-1 && len(misplaced) < 3 {
			misplaced = append(misplaced, fmt.Sprintf("batch at LSN %d handed over with the store at %d", h.FirstLSN, applied))
		}
		seen = append(seen, h)
		seenRaw = append(seenRaw, append([]byte(nil), raw...))
	}
	var err error
	l, err = a.groupLeader(mem, onAppend)
	require.NoError(t, err)

	const workers, perWorker = 16, 30
	shared := []session.ID{{1}, {2}, {3}}
	var mu sync.Mutex
	var got []wal.Header
	var closedRefused atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 3))
			own := session.ID{0x80, byte(w)}
			for i := range perWorker {
				evs := []wal.Event{{Op: wal.OpAdd, Session: own, Key: []byte("n"), Delta: 1}}
				for range rng.IntN(4) {
					evs = append(evs, wal.Event{Op: wal.OpAdd, Session: shared[rng.IntN(len(shared))], Key: []byte("n"), Delta: 1})
				}
				if w == 5 && i == perWorker/2 {
					evs = append(evs, wal.Event{Op: wal.OpClose, Session: shared[0]})
				}
				h, err := l.Append(evs...)
				if errors.Is(err, session.ErrSessionClosed) {
					closedRefused.Add(1)
					continue
				}
				require.NoError(t, err)
				mu.Lock()
				got = append(got, h)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	_, err = l.Append(wal.Event{Op: wal.OpAdd, Session: shared[0], Key: []byte("n"), Delta: 1})
	require.ErrorIs(t, err, session.ErrSessionClosed)
	t.Logf("%d appends refused for the closed session while others ran", closedRefused.Load())

	hs, raws := readWAL(t, mem)
	require.Empty(t, misplaced, "OnAppend before the local apply, after the batches before it")
	require.Equal(t, hs, seen, "OnAppend: every batch once, in log order")
	require.Equal(t, raws, seenRaw, "OnAppend gets the WAL's bytes")
	require.ElementsMatch(t, hs, got, "every append returned its own batch")
	next := hs[0].FirstLSN
	for _, h := range hs {
		require.Equal(t, next, h.FirstLSN, "contiguous LSNs")
		next = h.LastLSN() + 1
	}
	seqs := map[session.ID]session.SeqNo{}
	closed := map[session.ID]bool{}
	for _, raw := range raws {
		_, evs, err := wal.DecodeBatch(raw, nil)
		require.NoError(t, err)
		for _, ev := range evs {
			require.False(t, closed[ev.Session], "event after its session's close")
			seqs[ev.Session]++
			require.Equal(t, seqs[ev.Session], ev.Seq, "SeqNos contiguous in log order")
			closed[ev.Session] = ev.Op == wal.OpClose
		}
	}
	lsn, _ := l.Position()
	require.Equal(t, next-1, lsn)

	b := openNode(t, vfs.NewMem())
	r := b.receiver()
	for _, raw := range raws {
		_, err := r.Apply(raw)
		require.NoError(t, err)
	}
	st := r.Stats()
	require.EqualValues(t, next-1, st.Applied, "every event applies on a follower: %+v", st)
	require.NoError(t, l.Close())
	require.NoError(t, a.db.Close())
	require.NoError(t, b.db.Close())
}

// TestLedgerLogSyncFailureFailsLater: a failed fdatasync fails the batch it
// was to cover, the batches written while it ran, and every later append,
// with ErrLogFailed wrapping the WAL's ErrWriterFailed; none of them is
// applied locally or handed to OnAppend.
func TestLedgerLogSyncFailureFailsLater(t *testing.T) {
	mem := vfs.NewMem()
	a := openNode(t, mem)
	injected := errors.New("injected fdatasync failure")
	gate := &testutil.SyncGate{}
	walFS := errorfs.Wrap(mem, gate)
	var shipped []wal.Header
	l, err := a.groupLeader(walFS, func(h wal.Header, _ []byte) { shipped = append(shipped, h) })
	require.NoError(t, err)
	sid := session.ID{7}
	add := wal.Event{Op: wal.OpAdd, Session: sid, Key: []byte("n"), Delta: 1}
	for range 3 {
		_, err := l.Append(add)
		require.NoError(t, err)
	}
	okEnd, _ := l.Position()

	const others = 5
	errs := make(chan error, others+1)
	release := gate.Hold(injected) // the next sync is held, then fails
	go func() { _, err := l.Append(add); errs <- err }()
	release.Wait()
	for range others {
		go func() { _, err := l.Append(add); errs <- err }()
	}
	require.True(t, spinUntil(func() bool { return l.Writer().NextLSN() == okEnd+1+1+others }),
		"the others write while the sync is in flight")
	release.Release()
	for range others + 1 {
		err := <-errs
		require.ErrorIs(t, err, leader.ErrLogFailed)
		require.ErrorIs(t, err, wal.ErrWriterFailed)
		require.ErrorIs(t, err, injected)
	}
	_, err = l.Append(add)
	require.ErrorIs(t, err, leader.ErrLogFailed, "the log stays failed")
	lsn, _ := l.Position()
	require.Equal(t, okEnd, lsn, "nothing after the failed sync is applied locally")
	require.Len(t, shipped, 3, "nothing after the failed sync is shipped")
	n, err := a.state.Counter(sid, []byte("n"))
	require.NoError(t, err)
	require.EqualValues(t, 3, n)
	require.Error(t, l.Close())
	require.NoError(t, a.db.Close())
}

// TestLedgerLogExpiryJudgedByBatchInFlight: a session whose applied
// activity is about to pass the retention horizon gets an append A, and
// while A waits for its sync, an append B past that point: B is judged by
// A (the session is alive: followers apply A first), not by the store,
// which does not show A yet, and continues its SeqNos.
func TestLedgerLogExpiryJudgedByBatchInFlight(t *testing.T) {
	mem := vfs.NewMem()
	a := openNode(t, mem)
	gate := &testutil.SyncGate{}
	walFS := errorfs.Wrap(mem, gate)
	wall := testutil.NewClock()
	l, err := a.groupLeader(walFS, nil, wall.Now)
	require.NoError(t, err)
	sid := session.ID{4}
	add := wal.Event{Op: wal.OpAdd, Session: sid, Key: []byte("n"), Delta: 1}
	_, err = l.Append(add)
	require.NoError(t, err)

	wall.Advance(session.DefaultRetentionHorizon - time.Millisecond)
	release := gate.Hold(nil)
	errA := make(chan error, 1)
	go func() { _, err := l.Append(add); errA <- err }()
	release.Wait() // A is written, its sync in flight, not applied
	wall.Advance(time.Second)
	errB := make(chan error, 1)
	go func() { _, err := l.Append(add); errB <- err }()
	var bErr error
	bDone := false
	spinUntil(func() bool { // B is stamped and written too (or refused)
		select {
		case bErr = <-errB:
			bDone = true
		default:
		}
		return bDone || l.Writer().NextLSN() == 4
	})
	release.Release()
	require.NoError(t, <-errA)
	if !bDone {
		bErr = <-errB
	}
	require.NoError(t, bErr, "B is judged by A, not by the store")
	_, raws := readWAL(t, mem)
	require.Len(t, raws, 3)
	for i, raw := range raws {
		_, evs, err := wal.DecodeBatch(raw, nil)
		require.NoError(t, err)
		require.EqualValues(t, i+1, evs[0].Seq)
	}
	require.NoError(t, l.Close())
	require.NoError(t, a.db.Close())
}

// TestLedgerLogGroupCommitCrashImages: concurrent appenders (and ledger
// commits) on a crashable filesystem holding the WAL and the store, cloned
// as a power cut would leave it before every third filesystem operation of
// the run (ONCEWAL_LONG=1: every one), a random share of unsynced data kept. Every image reopens to a leader
// whose store, ledger and SeqNos agree with its WAL — equal to a follower
// that applies that WAL — and holds every append that had returned.
func TestLedgerLogGroupCommitCrashImages(t *testing.T) {
	total, _ := crashRun(t, -1, 0, nil) // count the filesystem operations
	step := int64(3)                    // ONCEWAL_LONG=1: every operation
	if os.Getenv("ONCEWAL_LONG") != "" {
		step = 1
	}
	images, checked, behind := 0, 0, 0
	for k := int64(0); k < total; k += step {
		rng := rand.New(rand.NewPCG(uint64(k), 11))
		images++
		n, wasBehind := crashRun(t, k, rng.IntN(101), rng)
		if n > k {
			checked++
		}
		if wasBehind {
			behind++
		}
	}
	t.Logf("%d filesystem operations, %d images checked, %d with the store behind the WAL", total, checked, behind)
	require.GreaterOrEqual(t, checked, images*3/4, "the operation count varies little between runs")
	require.Positive(t, behind, "some image must have the store behind its WAL (it commits without fsync)")
}

// crashRun runs the workload; at filesystem operation k (none if k < 0) it
// clones the filesystem and, after the run, checks the clone. It returns
// how many operations the run made and whether the image's store was behind
// its WAL before the reopen.
func crashRun(t *testing.T, k int64, pct int, rng *rand.Rand) (int64, bool) {
	mem := vfs.NewCrashableMem()
	var ackMu sync.Mutex
	var acked []wal.Header
	var img *vfs.MemFS
	var atCrash []wal.Header
	var ops atomic.Int64
	fs := errorfs.Wrap(mem, errorfs.InjectorFunc(func(errorfs.Op) error {
		if ops.Add(1)-1 == k {
			ackMu.Lock()
			img = mem.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: pct, RNG: rng})
			atCrash = append([]wal.Header(nil), acked...)
			ackMu.Unlock()
		}
		return nil
	}))
	a := openNode(t, fs)
	l, err := a.groupLeader(fs, nil)
	require.NoError(t, err)
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 25 {
				var h wal.Header
				var err error
				if w == 0 && i%5 == 0 {
					c := mustClaim(t, l, fmt.Sprintf("req-%d", i))
					h, err = l.Commit(c, []byte("ok"), wal.Event{Op: wal.OpAdd, Session: session.ID{9}, Key: []byte("n"), Delta: 1})
				} else {
					evs := make([]wal.Event, 1+i%7)
					for j := range evs {
						evs[j] = wal.Event{Op: wal.OpPut, Session: session.ID{byte(1 + (w+j)%5)}, Key: []byte(fmt.Sprintf("k%d", j)),
							Value: []byte(fmt.Sprintf("v%d-%d-%d", w, i, j))}
					}
					h, err = l.Append(evs...)
				}
				require.NoError(t, err)
				ackMu.Lock()
				acked = append(acked, h)
				ackMu.Unlock()
			}
		}()
	}
	wg.Wait()
	require.NoError(t, l.Close())
	require.NoError(t, a.db.Close())
	if img == nil {
		return ops.Load(), false
	}
	what := fmt.Sprintf("crash at op %d (%d%% unsynced kept)", k, pct)

	b := openNode(t, img)
	pre, _, _, err := store.ReadMeta(b.db)
	require.NoError(t, err)
	l2, err := b.groupLeader(img, nil)
	require.NoError(t, err, what)
	hs, raws := readWAL(t, img)
	inLog := map[wal.Header]bool{}
	for _, h := range hs {
		inLog[h] = true
	}
	for _, h := range atCrash {
		require.True(t, inLog[h], "%s: returned append %d..%d lost", what, h.FirstLSN, h.LastLSN())
	}
	end := uint64(0)
	if len(hs) > 0 {
		end = hs[len(hs)-1].LastLSN()
	}
	lsn, _ := l2.Position()
	require.Equal(t, end, lsn, what)

	// The store equals a follower's that applied this WAL.
	f := openNode(t, vfs.NewMem())
	r := f.receiver()
	for _, raw := range raws {
		_, err := r.Apply(raw)
		require.NoError(t, err, what)
	}
	require.Equal(t, f.ledgerRows(), b.ledgerRows(), what)
	for s := 1; s < 10; s++ {
		id := session.ID{byte(s)}
		want, _, _, err := f.tracker.Get(id)
		require.NoError(t, err)
		gotHWM, _, _, err := b.tracker.Get(id)
		require.NoError(t, err)
		require.Equal(t, want, gotHWM, "%s: session %d HWM", what, s)
		for j := range 7 {
			key := []byte(fmt.Sprintf("k%d", j))
			wv, _, _ := f.state.Get(id, key)
			gv, _, _ := b.state.Get(id, key)
			require.Equal(t, wv, gv, "%s: session %d key %s", what, s, key)
		}
		// SeqNos continue after the WAL's.
		h, err := l2.Append(wal.Event{Op: wal.OpPut, Session: id, Key: []byte("after"), Value: []byte("x")})
		require.NoError(t, err, what)
		_, evs, err := readLast(t, img)
		require.NoError(t, err)
		require.Equal(t, h.FirstLSN, evs[0].LSN, what)
		require.Equal(t, want+1, evs[0].Seq, "%s: session %d continues its SeqNos", what, s)
	}
	require.NoError(t, l2.Close())
	require.NoError(t, b.db.Close())
	require.NoError(t, f.db.Close())
	return ops.Load(), pre < end
}

// readLast decodes the last batch of the log on fs.
func readLast(t *testing.T, fs vfs.FS) (wal.Header, []wal.Event, error) {
	_, raws := readWAL(t, fs)
	return wal.DecodeBatch(raws[len(raws)-1], nil)
}
