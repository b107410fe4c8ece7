package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/stretchr/testify/require"

	"github.com/oncewal/oncewal/idempotency"
	"github.com/oncewal/oncewal/testutil"
)

// The tests here move the WAL clock by hand, so waiting claims recheck it
// every millisecond (LedgerOptions.WaitRecheck).
func waitEnv(t *testing.T, lopts *idempotency.LedgerOptions) *env {
	o := idempotency.LedgerOptions{WaitRecheck: time.Millisecond}
	if lopts != nil {
		o = *lopts
		if o.WaitRecheck == 0 {
			o.WaitRecheck = time.Millisecond
		}
	}
	return newEnv(t, nil, &o)
}

type claimResult struct {
	c   *idempotency.Claim
	err error
}

// waitClaim starts a waiting claim and returns where its answer arrives.
func waitClaim(ctx context.Context, l *idempotency.Ledger, key, payload string) <-chan claimResult {
	ch := make(chan claimResult, 1)
	go func() {
		c, err := l.ClaimWith(ctx, "ops", key, []byte(payload), idempotency.ClaimOptions{Wait: true})
		ch <- claimResult{c, err}
	}()
	return ch
}

// parked waits until n waiting claims are asleep on l.
func parked(t *testing.T, l *idempotency.Ledger, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for l.Waiting() < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d waiting claims parked, want %d", l.Waiting(), n)
		}
		time.Sleep(50 * time.Microsecond)
	}
}

func notYet(t *testing.T, ch <-chan claimResult) {
	t.Helper()
	select {
	case r := <-ch:
		t.Fatalf("waiting claim returned while the owner holds the key: %+v, %v", r.c, r.err)
	default:
	}
}

func answer(t *testing.T, ch <-chan claimResult) *idempotency.Claim {
	t.Helper()
	select {
	case r := <-ch:
		require.NoError(t, r.err)
		return r.c
	case <-time.After(10 * time.Second):
		t.Fatal("waiting claim never returned")
		return nil
	}
}

// TestLedgerExtendSlowOwnerWaiterReplays: an owner that works five times
// the default lease keeps the key by extending it; a duplicate delivered
// meanwhile waits instead of polling, and replays the outcome when the owner
// completes. Without Extend the duplicate would get a fresh claim after one
// minute and run the request a second time.
func TestLedgerExtendSlowOwnerWaiterReplays(t *testing.T) {
	e := waitEnv(t, &idempotency.LedgerOptions{WaitRecheck: time.Hour}) // woken by the owner's records only
	owner := e.claim("k", "p")
	require.Equal(t, owner.Time+int64(time.Minute), owner.LeaseEnd)
	dup := waitClaim(context.Background(), e.l, "k", "p")
	parked(t, e.l, 1)
	lease := owner.LeaseEnd
	for range 8 { // 8 × 40 s of work, a heartbeat after each step
		e.clock.Advance(40 * time.Second)
		end, err := e.l.Extend(owner, 0)
		require.NoError(t, err)
		require.Greater(t, end, lease)
		lease = end
		notYet(t, dup)
		in := e.claim("k", "p") // a non-waiting duplicate sees the extended lease
		require.Equal(t, idempotency.InFlight, in.Status)
		require.Equal(t, lease, in.LeaseEnd)
	}
	require.Equal(t, owner.LeaseEnd, owner.Time+int64(time.Minute), "the answer's fields do not change; Extend returns the lease end")
	require.NoError(t, e.l.Complete(owner, []byte("done after 5m20s")))
	r := answer(t, dup)
	require.Equal(t, idempotency.Replay, r.Status)
	require.True(t, r.Replayed)
	require.Equal(t, "done after 5m20s", string(r.Outcome))
	require.Equal(t, owner.Token, r.Token)
	require.Zero(t, e.l.Waiting())
	// A longer extension than the lease, and the limits.
	c := e.claim("k2", "p")
	end, err := e.l.Extend(c, time.Hour)
	require.NoError(t, err)
	e.clock.Advance(59 * time.Minute)
	require.Equal(t, idempotency.InFlight, e.claim("k2", "p").Status)
	require.Equal(t, end, e.claim("k2", "p").LeaseEnd)
	before := snapshot(t, e.db)
	for _, d := range []time.Duration{-time.Second, idempotency.MaxRetention + 1} {
		_, err = e.l.Extend(c, d)
		require.ErrorIs(t, err, idempotency.ErrBadOptions)
	}
	require.Equal(t, before, snapshot(t, e.db), "a refused extension changes nothing")
	require.NoError(t, e.l.Complete(c, nil))
	_, err = e.l.Extend(c, 0)
	require.ErrorIs(t, err, idempotency.ErrSettled)
	_, err = e.l.Extend(e.claim("k2", "p"), 0)
	require.ErrorIs(t, err, idempotency.ErrNotOwner, "a replay is not an owner")
}

// TestLedgerStaleOwnerCannotExtendOrCommit: once a claim's lease ended and
// another claim took the key, the old owner can neither extend nor settle,
// and nothing it tries is logged.
func TestLedgerStaleOwnerCannotExtendOrCommit(t *testing.T) {
	e := waitEnv(t, nil)
	stale := e.claim("k", "p")
	e.clock.Advance(time.Minute)
	taker := e.claim("k", "p")
	require.Equal(t, idempotency.Fresh, taker.Status)
	before := snapshot(t, e.db)
	_, err := e.l.Extend(stale, 0)
	require.ErrorIs(t, err, idempotency.ErrNotOwner)
	require.ErrorIs(t, e.l.Complete(stale, []byte("late")), idempotency.ErrNotOwner)
	require.ErrorIs(t, e.l.Fail(stale, []byte("late"), 0), idempotency.ErrNotOwner)
	require.ErrorIs(t, e.l.Release(stale), idempotency.ErrNotOwner)
	require.Equal(t, before, snapshot(t, e.db))
	// The taker is unaffected.
	_, err = e.l.Extend(taker, 0)
	require.NoError(t, err)
	require.NoError(t, e.l.Complete(taker, []byte("once")))
	require.Equal(t, "once", string(e.claim("k", "p").Outcome))
}

// TestLedgerWaitingClaimEnds: a waiting claim returns what Claim would
// answer once the owner stops holding the key, however that happens.
func TestLedgerWaitingClaimEnds(t *testing.T) {
	t.Run("release", func(t *testing.T) {
		e := waitEnv(t, &idempotency.LedgerOptions{WaitRecheck: time.Hour})
		owner := e.claim("k", "p")
		w := waitClaim(context.Background(), e.l, "k", "p")
		parked(t, e.l, 1)
		require.NoError(t, e.l.Release(owner))
		c := answer(t, w)
		require.Equal(t, idempotency.Fresh, c.Status, "a released request re-executes")
		require.NotEqual(t, owner.Token, c.Token)
		require.NoError(t, e.l.Complete(c, []byte("second try")))
	})
	t.Run("fail", func(t *testing.T) {
		e := waitEnv(t, &idempotency.LedgerOptions{WaitRecheck: time.Hour})
		owner := e.claim("k", "p")
		w := waitClaim(context.Background(), e.l, "k", "p")
		parked(t, e.l, 1)
		require.NoError(t, e.l.Fail(owner, []byte("card declined"), 0))
		c := answer(t, w)
		require.Equal(t, idempotency.Replay, c.Status, "a failure replays while it is retained")
		require.True(t, c.CachedFailure)
		require.Equal(t, "card declined", string(c.Outcome))
		require.Equal(t, c.Time+int64(10*time.Second), c.Expires)
	})
	t.Run("fail-final-scope", func(t *testing.T) {
		e := waitEnv(t, &idempotency.LedgerOptions{Scopes: map[string]idempotency.ScopeOptions{"ops": {FinalFailures: true}}})
		owner := e.claim("k", "p")
		w := waitClaim(context.Background(), e.l, "k", "p")
		parked(t, e.l, 1)
		require.NoError(t, e.l.Fail(owner, []byte("card declined"), 0))
		c := answer(t, w)
		require.True(t, c.CachedFailure)
		require.Equal(t, c.Time+int64(24*time.Hour), c.Expires, "a final failure replays as long as a success")
	})
	t.Run("owner-crash-lease-end", func(t *testing.T) {
		e := waitEnv(t, nil)
		owner := e.claim("k", "p") // its caller crashes: nobody settles or extends
		w := waitClaim(context.Background(), e.l, "k", "p")
		parked(t, e.l, 1)
		// The waiter rechecks the WAL clock and sleeps on (each recheck
		// ticks the test clock by 1ns).
		e.clock.Advance(time.Minute - time.Second)
		for range 5 {
			parked(t, e.l, 1)
			time.Sleep(2 * time.Millisecond)
		}
		notYet(t, w)
		e.clock.Advance(time.Second)
		c := answer(t, w)
		require.Equal(t, idempotency.Fresh, c.Status, "the lease ended on the WAL clock")
		require.GreaterOrEqual(t, c.Time, owner.LeaseEnd)
		require.ErrorIs(t, e.l.Complete(owner, nil), idempotency.ErrNotOwner)
	})
	t.Run("context", func(t *testing.T) {
		e := waitEnv(t, nil)
		e.claim("k", "p")
		ctx, cancel := context.WithCancel(context.Background())
		w := waitClaim(ctx, e.l, "k", "p")
		parked(t, e.l, 1)
		before := snapshot(t, e.db)
		cancel()
		r := <-w
		require.ErrorIs(t, r.err, context.Canceled)
		require.Nil(t, r.c)
		require.Zero(t, e.l.Waiting())
		require.Equal(t, before, snapshot(t, e.db))
		_, err := e.l.ClaimWith(ctx, "ops", "k", []byte("p"), idempotency.ClaimOptions{Wait: true})
		require.ErrorIs(t, err, context.Canceled, "a done context is refused before anything is decided")
	})
	t.Run("close", func(t *testing.T) {
		e := waitEnv(t, nil)
		e.claim("k", "p")
		w := waitClaim(context.Background(), e.l, "k", "p")
		parked(t, e.l, 1)
		require.NoError(t, e.l.Close())
		r := <-w
		require.ErrorIs(t, r.err, idempotency.ErrClosed)
	})
	t.Run("conflict", func(t *testing.T) {
		e := waitEnv(t, nil)
		e.claim("k", "p")
		_, err := e.l.ClaimWith(context.Background(), "ops", "k", []byte("other"), idempotency.ClaimOptions{Wait: true})
		require.ErrorIs(t, err, idempotency.ErrConflict, "a conflict answers at once, it does not wait")
	})
}

// TestLedgerWaitingClaimsOneFresh: of many waiters woken by a release,
// exactly one gets the key; the rest wait on and replay its outcome.
func TestLedgerWaitingClaimsOneFresh(t *testing.T) {
	e := waitEnv(t, &idempotency.LedgerOptions{WaitRecheck: time.Hour}) // woken by the owner's records only
	owner := e.claim("k", "p")
	const n = 8
	var ws []<-chan claimResult
	for range n {
		ws = append(ws, waitClaim(context.Background(), e.l, "k", "p"))
	}
	parked(t, e.l, n)
	all := make(chan claimResult, n)
	for _, w := range ws {
		go func() { all <- <-w }()
	}
	require.NoError(t, e.l.Release(owner))
	first := answer(t, all)
	require.Equal(t, idempotency.Fresh, first.Status)
	parked(t, e.l, n-1) // the others went back to sleep
	require.NoError(t, e.l.Complete(first, []byte("v")))
	for range n - 1 {
		c := answer(t, all)
		require.Equal(t, idempotency.Replay, c.Status, "exactly one waiter gets the key")
		require.Equal(t, "v", string(c.Outcome))
	}
}

// TestLedgerWaitTimedByWALClock: with the default WAL clock (the wall clock)
// a waiter wakes at the lease end by itself — its recheck is an hour here,
// so only the lease-end timer can wake it.
func TestLedgerWaitTimedByWALClock(t *testing.T) {
	table, err := idempotency.OpenLedgerTable(testutil.MemDB(t), nil)
	require.NoError(t, err)
	l, err := idempotency.OpenLedger(table, &idempotency.LedgerOptions{Lease: 30 * time.Millisecond, WaitRecheck: time.Hour})
	require.NoError(t, err)
	defer l.Close()
	owner, err := l.Claim("ops", "k", nil)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := l.ClaimWith(ctx, "ops", "k", nil, idempotency.ClaimOptions{Wait: true})
	require.NoError(t, err)
	require.Equal(t, idempotency.Fresh, c.Status)
	require.GreaterOrEqual(t, c.Time, owner.LeaseEnd)
}

// TestLedgerHeartbeatBesideHandler: a heartbeat goroutine extends while the
// handler completes; the calls are serialized (run with -race) and the
// heartbeat learns the claim is settled.
func TestLedgerHeartbeatBesideHandler(t *testing.T) {
	e := waitEnv(t, nil)
	for i := range 20 {
		c := e.claim(fmt.Sprint("k", i), "p")
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				if _, err := e.l.Extend(c, 0); err != nil {
					if !errors.Is(err, idempotency.ErrSettled) {
						t.Error(err)
					}
					return
				}
			}
		}()
		require.NoError(t, e.l.Complete(c, []byte("ok")))
		wg.Wait()
	}
}

// TestLedgerProbeClosedStore: a readiness probe on a store closed under the
// ledger fails with ErrStoreUnavailable instead of panicking, and so do
// requests; a store whose ledger clock is unreadable fails the probe too.
func TestLedgerProbeClosedStore(t *testing.T) {
	e := newEnv(t, nil, nil)
	require.NoError(t, e.l.Probe())
	c := e.claim("k", "p")
	// A corrupt clock value: the store is broken.
	require.NoError(t, e.db.Set([]byte("l/clock"), []byte{9, 9}, pebble.Sync))
	require.ErrorIs(t, e.l.Probe(), idempotency.ErrStoreUnavailable)
	require.ErrorIs(t, e.l.Probe(), idempotency.ErrBadRecord)
	require.NoError(t, e.db.Delete([]byte("l/clock"), pebble.Sync))
	require.NoError(t, e.l.Probe())

	require.NoError(t, e.db.Close())
	err := e.l.Probe()
	require.ErrorIs(t, err, idempotency.ErrStoreUnavailable)
	require.ErrorIs(t, err, pebble.ErrClosed)
	_, err = e.l.Claim("ops", "k2", []byte("p"))
	require.ErrorIs(t, err, idempotency.ErrStoreUnavailable)
	require.ErrorIs(t, e.l.Complete(c, nil), idempotency.ErrStoreUnavailable)
	_, _, err = e.l.Lookup("ops", "k")
	require.ErrorIs(t, err, idempotency.ErrStoreUnavailable)
	require.NoError(t, e.l.Close())
	require.ErrorIs(t, e.l.Probe(), idempotency.ErrClosed)
	e.db = nil // closed already
}

// TestLedgerOptionsValidated: negative or oversized durations and bad scope
// options are refused with every problem named; zero means the default.
func TestLedgerOptionsValidated(t *testing.T) {
	e := newEnv(t, nil, nil)
	bad := idempotency.LedgerOptions{TTL: -1, Lease: -time.Second, FailureTTL: idempotency.MaxRetention + 1, WaitRecheck: -1,
		Scopes: map[string]idempotency.ScopeOptions{
			strings.Repeat("s", idempotency.MaxScopeLen+1): {},
			"a": {FailureTTL: -1},
			"b": {FailureTTL: time.Second, FinalFailures: true},
		}}
	_, err := idempotency.OpenLedger(e.table, &bad)
	require.ErrorIs(t, err, idempotency.ErrBadOptions)
	for _, want := range []string{"TTL -1ns is negative", "Lease -1s is negative", "FailureTTL 876000h0m0.000000001s exceeds",
		"WaitRecheck -1ns", "scope of 201 bytes", `Scopes["a"].FailureTTL -1ns`, `Scopes["b"]: FinalFailures and FailureTTL`} {
		require.Contains(t, err.Error(), want)
	}
	require.ErrorIs(t, bad.Validate(), idempotency.ErrBadOptions)
	_, err = idempotency.OpenLedgerTable(e.db, &idempotency.TableOptions{SweepLimit: -1})
	require.ErrorIs(t, err, idempotency.ErrBadOptions)

	var zero idempotency.LedgerOptions
	require.NoError(t, zero.Validate())
	zero.EnsureDefaults()
	require.Equal(t, idempotency.LedgerOptions{TTL: 24 * time.Hour, Lease: time.Minute, FailureTTL: 10 * time.Second,
		WaitRecheck: time.Second}, func() idempotency.LedgerOptions { z := zero; z.NewToken = nil; return z }())
	require.Equal(t, time.Minute, e.l.Lease())
	require.Equal(t, 24*time.Hour, e.l.ReplayWindow())

	// Per call: an oversized action changes nothing.
	before := snapshot(t, e.db)
	_, err = e.l.ClaimWith(context.Background(), "ops", "k", nil,
		idempotency.ClaimOptions{Action: strings.Repeat("a", idempotency.MaxActionLen+1)})
	require.ErrorIs(t, err, idempotency.ErrBadOptions)
	require.Equal(t, before, snapshot(t, e.db))
}

// TestLedgerConflictNamesEarlierAction: a conflict says what the key was
// first used for, from the claim's recorded action, in flight, after the
// outcome, after an extension and after a reopen.
func TestLedgerConflictNamesEarlierAction(t *testing.T) {
	e := newEnv(t, nil, nil)
	const action = "POST /v1/transfers amount=5"
	c, err := e.l.ClaimWith(context.Background(), "ops", "k", []byte("A"), idempotency.ClaimOptions{Action: action})
	require.NoError(t, err)
	require.Equal(t, action, c.Action)
	check := func(state idempotency.EntryState) {
		t.Helper()
		_, err := e.l.ClaimWith(context.Background(), "ops", "k", []byte("B"), idempotency.ClaimOptions{Action: "POST /v1/refunds"})
		var ce *idempotency.ConflictError
		require.True(t, errors.As(err, &ce), "%v", err)
		require.Equal(t, action, ce.Existing.Action)
		require.Equal(t, state, ce.Existing.State)
		require.Equal(t, "POST /v1/refunds", ce.GotAction)
		require.Contains(t, err.Error(), `first used for "`+action+`"`)
		same := e.claim("k", "A")
		require.Equal(t, action, same.Action, "in-flight and replay answers carry the action too")
	}
	check(idempotency.StateInFlight)
	_, err = e.l.Extend(c, 0)
	require.NoError(t, err)
	check(idempotency.StateInFlight)
	require.NoError(t, e.l.Complete(c, []byte("ok")))
	check(idempotency.StateCompleted)
	e.reopen()
	check(idempotency.StateCompleted)
	// Without an action the message still says when and what state.
	plain := e.claim("k2", "A")
	_, err = e.l.Claim("ops", "k2", []byte("B"))
	require.ErrorIs(t, err, idempotency.ErrConflict)
	require.Contains(t, err.Error(), "first used (in-flight entry from WAL time")
	require.NoError(t, e.l.Release(plain))
}

// TestLedgerFailureRetention: how long a failure replays is a documented
// choice per ledger, per scope and per call.
func TestLedgerFailureRetention(t *testing.T) {
	e := newEnv(t, nil, &idempotency.LedgerOptions{FailureTTL: 5 * time.Second, Scopes: map[string]idempotency.ScopeOptions{
		"payments": {FinalFailures: true},
		"webhooks": {FailureTTL: time.Minute},
	}})
	require.Equal(t, 5*time.Second, e.l.FailureRetention("ops"))
	require.Equal(t, 24*time.Hour, e.l.FailureRetention("payments"))
	require.Equal(t, time.Minute, e.l.FailureRetention("webhooks"))
	fail := func(scope, key string, ttl time.Duration) *idempotency.Claim {
		t.Helper()
		c, err := e.l.Claim(scope, key, nil)
		require.NoError(t, err)
		require.NoError(t, e.l.Fail(c, []byte("no"), ttl))
		r, err := e.l.Claim(scope, key, nil)
		require.NoError(t, err)
		require.True(t, r.CachedFailure)
		return r
	}
	for scope, want := range map[string]time.Duration{"ops": 5 * time.Second, "payments": 24 * time.Hour, "webhooks": time.Minute} {
		r := fail(scope, "k", 0)
		require.Equal(t, r.Time+int64(want), r.Expires, scope)
	}
	r := fail("ops", "final", e.l.ReplayWindow()) // per call: this failure is final
	require.Equal(t, r.Time+int64(24*time.Hour), r.Expires)
	r = fail("payments", "brief", time.Second) // per call beats the scope
	require.Equal(t, r.Time+int64(time.Second), r.Expires)
	c := e.claim("neg", "p")
	require.ErrorIs(t, e.l.Fail(c, nil, -time.Second), idempotency.ErrBadOptions)
	require.NoError(t, e.l.Fail(c, nil, 0), "a refused Fail leaves the claim usable")
}
