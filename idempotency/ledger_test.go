package idempotency_test

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/require"
	"lukechampine.com/blake3"

	"github.com/oncewal/oncewal/idempotency"
	"github.com/oncewal/oncewal/testutil"
)

type env struct {
	t     testing.TB
	fs    vfs.FS
	db    *pebble.DB
	table *idempotency.LedgerTable
	l     *idempotency.Ledger
	clock *testutil.Clock
	topts idempotency.TableOptions
	lopts idempotency.LedgerOptions
}

func newEnv(t testing.TB, topts *idempotency.TableOptions, lopts *idempotency.LedgerOptions) *env {
	e := &env{t: t, fs: vfs.NewMem(), clock: testutil.NewTickingClock(1)}
	if topts != nil {
		e.topts = *topts
	}
	if lopts != nil {
		e.lopts = *lopts
	}
	e.lopts.Now = e.clock.Now
	e.open()
	t.Cleanup(func() {
		if e.db != nil {
			_ = e.l.Close()
			require.NoError(t, e.db.Close())
		}
	})
	return e
}

func (e *env) open() {
	e.db = testutil.OpenDB(e.t, e.fs, "db")
	var err error
	e.table, err = idempotency.OpenLedgerTable(e.db, &e.topts)
	require.NoError(e.t, err)
	lo := e.lopts
	e.l, err = idempotency.OpenLedger(e.table, &lo)
	require.NoError(e.t, err)
}

func (e *env) reopen() {
	require.NoError(e.t, e.l.Close())
	require.NoError(e.t, e.db.Close())
	e.open()
}

func (e *env) claim(key, payload string) *idempotency.Claim {
	e.t.Helper()
	c, err := e.l.Claim("ops", key, []byte(payload))
	require.NoError(e.t, err)
	return c
}

func snapshot(t testing.TB, db *pebble.DB) map[string]string {
	it, err := db.NewIter(nil)
	require.NoError(t, err)
	out := map[string]string{}
	for it.First(); it.Valid(); it.Next() {
		out[string(it.Key())] = string(it.Value())
	}
	require.NoError(t, it.Close())
	return out
}

func TestLedgerReplayVerbatim(t *testing.T) {
	e := newEnv(t, nil, nil)
	c := e.claim("req-1", "add 5")
	require.Equal(t, idempotency.Fresh, c.Status)
	require.False(t, c.Replayed)
	outcome := []byte{0, 1, 2, 0xff, '\n', 0} // arbitrary bytes come back unchanged
	require.NoError(t, e.l.Complete(c, outcome))
	require.ErrorIs(t, e.l.Complete(c, outcome), idempotency.ErrSettled)

	check := func() {
		r := e.claim("req-1", "add 5")
		require.Equal(t, idempotency.Replay, r.Status)
		require.True(t, r.Replayed)
		require.False(t, r.CachedFailure)
		require.Equal(t, outcome, r.Outcome)
		require.Equal(t, c.Token, r.Token)
		r.Outcome[0] = 9 // the caller's copy; the ledger keeps its own
		// A replay is not an owner.
		require.ErrorIs(t, e.l.Complete(r, []byte("x")), idempotency.ErrNotOwner)
	}
	check()
	check()
	e.reopen() // durable
	check()
	// Same key in another scope is another request.
	c2, err := e.l.Claim("webhooks", "req-1", []byte("other"))
	require.NoError(t, err)
	require.Equal(t, idempotency.Fresh, c2.Status)
	require.Equal(t, 24*time.Hour, e.l.ReplayWindow())
}

func TestLedgerConflict(t *testing.T) {
	e := newEnv(t, nil, nil)
	c := e.claim("k", "payload A")
	// While in flight.
	before := snapshot(t, e.db)
	_, err := e.l.Claim("ops", "k", []byte("payload B"))
	require.ErrorIs(t, err, idempotency.ErrConflict)
	var ce *idempotency.ConflictError
	require.True(t, errors.As(err, &ce))
	require.Equal(t, idempotency.StateInFlight, ce.Existing.State)
	require.Equal(t, idempotency.FingerprintOf([]byte("payload A")), ce.Existing.Fingerprint)
	require.Equal(t, idempotency.FingerprintOf([]byte("payload B")), ce.Got)
	require.Equal(t, "k", ce.Key)
	require.Equal(t, before, snapshot(t, e.db), "a conflict changes nothing")
	// After completion.
	require.NoError(t, e.l.Complete(c, []byte("ok")))
	_, err = e.l.Claim("ops", "k", []byte("payload B"))
	require.True(t, errors.As(err, &ce))
	require.Equal(t, idempotency.StateCompleted, ce.Existing.State)
	require.Equal(t, "ok", string(ce.Existing.Outcome))
	require.Contains(t, err.Error(), "different payload")
	// The right payload still replays.
	require.Equal(t, idempotency.Replay, e.claim("k", "payload A").Status)
}

func TestLedgerReleaseThenReexecute(t *testing.T) {
	e := newEnv(t, nil, nil)
	c := e.claim("k", "p")
	require.Equal(t, idempotency.InFlight, e.claim("k", "p").Status)
	require.NoError(t, e.l.Release(c))
	require.ErrorIs(t, e.l.Release(c), idempotency.ErrSettled)
	require.ErrorIs(t, e.l.Complete(c, nil), idempotency.ErrSettled)
	_, found, err := e.l.Lookup("ops", "k")
	require.NoError(t, err)
	require.False(t, found, "a released key is free")
	c2 := e.claim("k", "p")
	require.Equal(t, idempotency.Fresh, c2.Status, "a released request re-executes")
	require.NotEqual(t, c.Token, c2.Token)
	require.NoError(t, e.l.Complete(c2, []byte("done")))
	r := e.claim("k", "p")
	require.Equal(t, idempotency.Replay, r.Status)
	require.Equal(t, "done", string(r.Outcome))
}

func TestLedgerCachedFailureExpires(t *testing.T) {
	e := newEnv(t, nil, nil)
	c := e.claim("k", "p")
	require.NoError(t, e.l.Fail(c, []byte("insufficient funds"), 0)) // default 10s
	r := e.claim("k", "p")
	require.Equal(t, idempotency.Replay, r.Status)
	require.True(t, r.CachedFailure)
	require.True(t, r.Replayed)
	require.Equal(t, "insufficient funds", string(r.Outcome))
	require.Equal(t, r.Time+int64(10*time.Second), r.Expires)
	e.clock.Advance(10*time.Second - 10)
	require.Equal(t, idempotency.Replay, e.claim("k", "p").Status)
	e.clock.Advance(10)
	c2 := e.claim("k", "p")
	require.Equal(t, idempotency.Fresh, c2.Status, "a cached failure expires and the request re-executes")
	// A custom TTL.
	require.NoError(t, e.l.Fail(c2, []byte("busy"), time.Second))
	e.clock.Advance(time.Second)
	require.Equal(t, idempotency.Fresh, e.claim("k", "p").Status)
}

func TestLedgerLeaseExpiry(t *testing.T) {
	e := newEnv(t, nil, nil)
	abandoned := e.claim("k", "p") // its caller crashes
	in := e.claim("k", "p")
	require.Equal(t, idempotency.InFlight, in.Status)
	require.Equal(t, abandoned.LeaseEnd, in.LeaseEnd)
	require.Equal(t, abandoned.Time+int64(time.Minute), in.LeaseEnd)
	e.clock.Advance(time.Minute - 10)
	require.Equal(t, idempotency.InFlight, e.claim("k", "p").Status)
	e.clock.Advance(10)
	taker := e.claim("k", "p")
	require.Equal(t, idempotency.Fresh, taker.Status, "an abandoned claim frees itself when its lease ends")
	// The original owner wakes up: it no longer owns the key.
	require.ErrorIs(t, e.l.Complete(abandoned, []byte("late")), idempotency.ErrNotOwner)
	require.ErrorIs(t, e.l.Release(abandoned), idempotency.ErrNotOwner)
	require.NoError(t, e.l.Complete(taker, []byte("once")))
	require.Equal(t, "once", string(e.claim("k", "p").Outcome))

	// A slow owner whose lease ended is stale even if nobody took the key
	// yet (a waiter may be about to): it can neither complete nor extend,
	// and nothing is logged. Releasing is a no-op: there is nothing to free.
	slow := e.claim("k2", "p")
	e.clock.Advance(2 * time.Minute)
	before := snapshot(t, e.db)
	require.ErrorIs(t, e.l.Complete(slow, []byte("slow")), idempotency.ErrNotOwner)
	require.ErrorIs(t, e.l.Fail(slow, []byte("slow"), 0), idempotency.ErrNotOwner)
	_, err := e.l.Extend(slow, 0)
	require.ErrorIs(t, err, idempotency.ErrNotOwner)
	require.Equal(t, before, snapshot(t, e.db))
	require.NoError(t, e.l.Release(slow))
	require.Equal(t, idempotency.Fresh, e.claim("k2", "p").Status)
	// Survives a reopen in flight, too: the lease is on the WAL clock.
	held := e.claim("k3", "p")
	e.reopen()
	require.Equal(t, idempotency.InFlight, e.claim("k3", "p").Status)
	e.clock.Advance(time.Minute)
	require.Equal(t, idempotency.Fresh, e.claim("k3", "p").Status)
	_ = held
}

// TestLedgerFreesOrphanedClaims: with FreeOrphanedClaims, a claim in
// flight when the ledger reopens (its owner died with the process) is free
// at once, and its owner can no longer settle it; a claim taken after the
// reopen is held for its lease, completed ones still replay. Without the
// option the orphan is held until its lease ends (TestLedgerLeaseExpiry).
func TestLedgerFreesOrphanedClaims(t *testing.T) {
	e := newEnv(t, nil, &idempotency.LedgerOptions{FreeOrphanedClaims: true})
	orphan := e.claim("k", "p")
	done := e.claim("d", "p")
	require.NoError(t, e.l.Complete(done, []byte("out")))
	extended := e.claim("x", "p")
	_, err := e.l.Extend(extended, 10*time.Minute)
	require.NoError(t, err)
	require.Equal(t, idempotency.InFlight, e.claim("k", "p").Status, "before the reopen the owner is alive")
	e.reopen()
	for _, key := range []string{"k", "x"} {
		taker := e.claim(key, "p")
		require.Equal(t, idempotency.Fresh, taker.Status, "claim %q in flight at the reopen is orphaned", key)
		require.Equal(t, idempotency.InFlight, e.claim(key, "p").Status, "the new claim on %q is held", key)
		require.NoError(t, e.l.Complete(taker, []byte("once")))
	}
	require.ErrorIs(t, e.l.Complete(orphan, []byte("late")), idempotency.ErrNotOwner)
	require.Equal(t, "out", string(e.claim("d", "p").Outcome))
	require.Equal(t, "once", string(e.claim("k", "p").Outcome))
}

func TestLedgerReplayWindowEnds(t *testing.T) {
	e := newEnv(t, nil, &idempotency.LedgerOptions{TTL: time.Hour})
	require.Equal(t, time.Hour, e.l.ReplayWindow())
	c := e.claim("k", "p")
	require.NoError(t, e.l.Complete(c, []byte("v1")))
	e.clock.Advance(time.Hour - 10)
	require.Equal(t, idempotency.Replay, e.claim("k", "p").Status)
	e.clock.Advance(10)
	require.Equal(t, idempotency.Fresh, e.claim("k", "p").Status,
		"past the replay window a retry re-executes: the window is the guarantee's limit")
}

func TestLedgerSweepThrottled(t *testing.T) {
	e := newEnv(t, &idempotency.TableOptions{SweepInterval: time.Minute}, nil)
	count := func() int {
		n := 0
		require.NoError(t, e.table.Scan(func(string, string, idempotency.Entry) error { n++; return nil }))
		return n
	}
	// The first logged decision sweeps (nothing swept before).
	c := e.claim("first", "p")
	require.NoError(t, e.l.Fail(c, nil, time.Second))
	require.Equal(t, uint64(1), e.table.Stats().Sweeps)
	// 50 short-lived failures, each decision 100ms of WAL time apart.
	for i := range 50 {
		c := e.claim(fmt.Sprintf("f%d", i), "p")
		require.NoError(t, e.l.Fail(c, nil, time.Second))
		e.clock.Advance(100 * time.Millisecond)
	}
	require.Equal(t, uint64(1), e.table.Stats().Sweeps, "no sweep before the interval has passed")
	require.Equal(t, 51, count(), "expired entries stay until swept...")
	r := e.claim("f0", "p")
	require.Equal(t, idempotency.Fresh, r.Status, "...but already count as absent")
	require.NoError(t, e.l.Release(r))
	keep := e.claim("keep", "p")
	require.NoError(t, e.l.Complete(keep, nil)) // 24h TTL
	e.clock.Advance(time.Minute)
	c = e.claim("trigger", "p")
	require.Equal(t, uint64(2), e.table.Stats().Sweeps, "one sweep per interval")
	require.Equal(t, 2, count(), "the sweep deleted every expired entry: left are keep and trigger")
	require.Equal(t, uint64(51), e.table.Stats().Swept, "first, f1..f49 and f0's release tombstone")
	require.NoError(t, e.l.Complete(c, nil))
	require.Equal(t, uint64(2), e.table.Stats().Sweeps)
	// The index holds exactly the live entries.
	idx := 0
	for k := range snapshot(t, e.db) {
		if strings.HasPrefix(k, "l/x/") {
			idx++
		}
	}
	require.Equal(t, 2, idx)
}

func TestLedgerSweepLimit(t *testing.T) {
	e := newEnv(t, &idempotency.TableOptions{SweepInterval: time.Second, SweepLimit: 10}, nil)
	for i := range 25 {
		c := e.claim(fmt.Sprintf("k%d", i), "p")
		require.NoError(t, e.l.Fail(c, nil, time.Millisecond))
	}
	swept := e.table.Stats().Swept
	for i := range 3 {
		e.clock.Advance(time.Second)
		c := e.claim(fmt.Sprintf("t%d", i), "p")
		require.NoError(t, e.l.Release(c))
	}
	require.Equal(t, swept+25, e.table.Stats().Swept)
}

func TestLedgerInvalidKeys(t *testing.T) {
	e := newEnv(t, nil, nil)
	c := e.claim("ok", "p")
	require.NoError(t, e.l.Complete(c, []byte("v")))
	before := snapshot(t, e.db)
	bad := []struct{ scope, key string }{
		{"ops", ""}, {"ops", " "}, {"ops", "\t\n \r"}, {"ops", strings.Repeat("k", 201)},
		{strings.Repeat("s", 201), "k"}, {"ops", " " + strings.Repeat("k", 200)},
	}
	for _, b := range bad {
		_, err := e.l.Claim(b.scope, b.key, []byte("p"))
		require.ErrorIs(t, err, idempotency.ErrInvalidKey, "%q/%q", b.scope, b.key)
		_, _, err = e.l.Lookup(b.scope, b.key)
		require.ErrorIs(t, err, idempotency.ErrInvalidKey)
	}
	require.Equal(t, before, snapshot(t, e.db), "invalid keys change nothing")
	for _, k := range []string{strings.Repeat("k", 200), " padded ", "ünïcödé", "x"} {
		c, err := e.l.Claim(strings.Repeat("s", 200), k, nil)
		require.NoError(t, err)
		require.Equal(t, idempotency.Fresh, c.Status)
	}
	// Outcomes are bounded.
	c = e.claim("big", "p")
	require.ErrorIs(t, e.l.Complete(c, make([]byte, idempotency.MaxOutcomeSize+1)), idempotency.ErrOutcomeTooLarge)
	require.NoError(t, e.l.Complete(c, make([]byte, 10)))
}

func TestLedgerConcurrentClaims(t *testing.T) {
	e := newEnv(t, nil, nil)
	const goroutines = 32
	for round := range 4 {
		key := fmt.Sprintf("hot-%d", round)
		var fresh atomic.Int32
		var winner atomic.Pointer[idempotency.Claim]
		statuses := make([]idempotency.Status, goroutines)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for g := range goroutines {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				c, err := e.l.Claim("ops", key, []byte("same"))
				if err != nil {
					t.Error(err)
					return
				}
				statuses[g] = c.Status
				if c.Status == idempotency.Fresh {
					fresh.Add(1)
					winner.Store(c)
				}
			}()
		}
		close(start)
		wg.Wait()
		require.Equal(t, int32(1), fresh.Load(), "exactly one fresh claim")
		for _, s := range statuses {
			require.Contains(t, []idempotency.Status{idempotency.Fresh, idempotency.InFlight}, s)
		}
		// Completion races with more claims: each sees in-flight or the replay.
		var wg2 sync.WaitGroup
		for range goroutines {
			wg2.Add(1)
			go func() {
				defer wg2.Done()
				c, err := e.l.Claim("ops", key, []byte("same"))
				if err != nil {
					t.Error(err)
					return
				}
				if c.Status == idempotency.Fresh || (c.Status == idempotency.Replay && string(c.Outcome) != "result") {
					t.Errorf("unexpected %v %q", c.Status, c.Outcome)
				}
			}()
		}
		require.NoError(t, e.l.Complete(winner.Load(), []byte("result")))
		wg2.Wait()
	}
}

func TestLedgerCloseProbeReset(t *testing.T) {
	e := newEnv(t, nil, nil)
	require.NoError(t, e.l.Probe())
	c := e.claim("k", "p")
	require.NoError(t, e.l.Complete(c, []byte("v")))
	require.NoError(t, e.l.Reset())
	require.Equal(t, idempotency.Fresh, e.claim("k", "p").Status, "Reset (tests only) forgets everything")
	require.NoError(t, e.l.Close())
	require.NoError(t, e.l.Close())
	require.ErrorIs(t, e.l.Probe(), idempotency.ErrClosed)
	_, err := e.l.Claim("ops", "k", nil)
	require.ErrorIs(t, err, idempotency.ErrClosed)
}

func TestLedgerLogFailureChangesNothing(t *testing.T) {
	boom := errors.New("disk on fire")
	var fail atomic.Bool
	e := newEnv(t, nil, nil)
	var inner idempotency.LogFunc
	e.lopts.Log = func(recs []idempotency.Record) error {
		if fail.Load() {
			return boom
		}
		return inner(recs)
	}
	// Reopen with the wrapping log; inner is a ledger with the default log.
	require.NoError(t, e.l.Close())
	plain, err := idempotency.OpenLedger(e.table, &idempotency.LedgerOptions{Now: e.clock.Now})
	require.NoError(t, err)
	inner = plainLog(plain)
	lo := e.lopts
	e.l, err = idempotency.OpenLedger(e.table, &lo)
	require.NoError(t, err)

	before := snapshot(t, e.db)
	fail.Store(true)
	_, err = e.l.Claim("ops", "k", []byte("p"))
	require.ErrorIs(t, err, boom)
	require.Equal(t, before, snapshot(t, e.db))
	fail.Store(false)
	c := e.claim("k", "p")
	require.Equal(t, idempotency.Fresh, c.Status)
	fail.Store(true)
	require.ErrorIs(t, e.l.Complete(c, []byte("v")), boom)
	fail.Store(false)
	require.NoError(t, e.l.Complete(c, []byte("v")), "a failed log leaves the claim unsettled")
}

// plainLog applies records through a throwaway ledger's direct log path.
func plainLog(l *idempotency.Ledger) idempotency.LogFunc {
	return func(recs []idempotency.Record) error {
		b := l.Table().DB().NewBatch()
		defer b.Close()
		tx := l.Table().Begin(b)
		for i := range recs {
			if err := tx.Apply(&recs[i]); err != nil {
				return err
			}
		}
		if err := tx.Finish(); err != nil {
			return err
		}
		return b.Commit(pebble.Sync)
	}
}

func TestFingerprintIsBLAKE3(t *testing.T) {
	for _, n := range []int{0, 1, 63, 64, 65, 1000, 1024, 1025, 2048, 5000, 70000} {
		p := bytes.Repeat([]byte{byte(n)}, n)
		require.Equal(t, idempotency.Fingerprint(blake3.Sum256(p)), idempotency.FingerprintOf(p), "len %d", n)
	}
}

// TestTableApplyIdempotent: applying a log of records twice over, or with
// stale records redelivered late, leaves the same table as applying it once.
func TestTableApplyIdempotent(t *testing.T) {
	a := newEnv(t, &idempotency.TableOptions{SweepInterval: -1}, nil)
	var recs []idempotency.Record
	a.lopts.Log = nil
	logged := func(rs []idempotency.Record) error {
		recs = append(recs, rs...)
		return plainLog(a.l)(rs)
	}
	lo := idempotency.LedgerOptions{Now: a.clock.Now, Log: logged}
	l, err := idempotency.OpenLedger(a.table, &lo)
	require.NoError(t, err)
	for i := range 30 {
		c, err := l.Claim("s", fmt.Sprintf("k%d", i%7), []byte("p"))
		require.NoError(t, err)
		if c.Status != idempotency.Fresh {
			continue
		}
		if i%4 == 0 { // a heartbeat before settling
			_, err := l.Extend(c, time.Duration(i+1)*time.Second)
			require.NoError(t, err)
		}
		switch i % 3 {
		case 0:
			require.NoError(t, l.Complete(c, []byte{byte(i)}))
		case 1:
			require.NoError(t, l.Release(c))
		case 2:
			require.NoError(t, l.Fail(c, []byte("f"), time.Millisecond))
		}
		a.clock.Advance(time.Millisecond)
	}
	b := newEnv(t, &idempotency.TableOptions{SweepInterval: -1}, nil)
	apply := func(rs ...idempotency.Record) {
		bat := b.db.NewBatch()
		tx := b.table.Begin(bat)
		for i := range rs {
			require.NoError(t, tx.Apply(&rs[i]))
		}
		require.NoError(t, tx.Finish())
		require.NoError(t, bat.Commit(pebble.Sync))
	}
	for i := range 2 { // end on a released key
		c, err := l.Claim("s", fmt.Sprintf("last%d", i), []byte("p"))
		require.NoError(t, err)
		require.NoError(t, l.Release(c))
	}
	for i, r := range recs {
		apply(r, r) // twice in one batch
		apply(r)    // and again later
		if i > 2 {
			apply(recs[i-2]) // a stale redelivery
		}
	}
	apply(recs[len(recs)-2]) // the last key's claim, redelivered after its release
	apply(recs[len(recs)-4])
	require.Equal(t, snapshot(t, a.db), snapshot(t, b.db))
	require.NotZero(t, b.table.Stats().Stale)
}

// TestLedgerStats: every claim answer and owner decision is counted by
// outcome (the metrics export them).
func TestLedgerStats(t *testing.T) {
	e := newEnv(t, nil, &idempotency.LedgerOptions{Lease: time.Second})
	a := e.claim("a", "p") // fresh
	require.Equal(t, idempotency.InFlight, e.claim("a", "p").Status)
	_, err := e.l.Claim("ops", "a", []byte("other"))
	require.ErrorIs(t, err, idempotency.ErrConflict)
	_, err = e.l.Extend(a, 0)
	require.NoError(t, err)
	require.NoError(t, e.l.Complete(a, []byte("ok")))
	require.Equal(t, idempotency.Replay, e.claim("a", "p").Status)
	b := e.claim("b", "p")
	require.NoError(t, e.l.Fail(b, []byte("bad"), 0))
	c := e.claim("c", "p")
	require.NoError(t, e.l.Release(c))
	d := e.claim("d", "p")
	e.clock.Advance(2 * time.Second) // the lease ends
	require.ErrorIs(t, e.l.Complete(d, nil), idempotency.ErrNotOwner)
	require.Equal(t, idempotency.LedgerStats{Fresh: 4, Replay: 1, InFlight: 1, Conflicts: 1,
		Completed: 1, Failed: 1, Released: 1, Extended: 1, NotOwner: 1}, e.l.Stats())
}
