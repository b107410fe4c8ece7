package coord

import (
	"context"
	"errors"
	"testing"
	"time"
)

// bound is how long a test waits for an election before failing instead of
// hanging; elections here take milliseconds.
const bound = 30 * time.Second

// engine is one implementation under the shared suite: open gives two
// nodes' coordinators on one engine (one etcd, one Memory) whose leases
// last ttl (0: the default), kill ends a term's lease as etcd would on
// expiry or revocation.
type engine struct {
	name string
	open func(t *testing.T, ttl time.Duration) (a, b Coordinator)
	kill func(t *testing.T, l Leadership)
}

var (
	nodeA = Candidate{ID: "a", Addr: "10.0.0.1:7000"}
	nodeB = Candidate{ID: "b", Addr: "10.0.0.2:7000"}
)

// runSuite runs every contract test against e.
func runSuite(t *testing.T, e engine) {
	for _, tc := range []struct {
		name string
		fn   func(*testing.T, engine)
	}{
		{"OneWinsTheOtherObserves", testOneWinsTheOtherObserves},
		{"ResignHandsOverAtAHigherEpoch", testResignHandsOver},
		{"LeaseEndDeposes", testLeaseEndDeposes},
		{"EpochsOnlyGrow", testEpochsOnlyGrow},
		{"CancelledCampaignLeavesNoKey", testCancelledCampaign},
		{"BadInputAndClosed", testBadInputAndClosed},
		{"Watch", testWatch},
		{"WatchSlowReaderGetsLatest", testWatchSlowReaderGetsLatest},
		{"WatchEnds", testWatchEnds},
		{"UpdateConflictRetries", testUpdateConflictRetries},
		{"UpdateDeleteErrorsAndBadInput", testUpdateDeleteErrorsAndBadInput},
		{"DeadlineAdvancesWithRenewals", testDeadlineAdvancesWithRenewals},
		{"DeadlinePassesWhenTheLeaseEnds", testDeadlinePassesWhenTheLeaseEnds},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, e) })
	}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	t.Cleanup(cancel)
	return ctx
}

// campaignAsync campaigns in a goroutine; the result arrives on the channel.
type result struct {
	l   Leadership
	err error
}

func campaignAsync(ctx context.Context, c Coordinator, me Candidate) <-chan result {
	ch := make(chan result, 1)
	go func() {
		l, err := c.Campaign(ctx, "c1", me)
		ch <- result{l, err}
	}()
	return ch
}

func wait(t *testing.T, ch <-chan result) Leadership {
	t.Helper()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("campaign: %v", r.err)
		}
		return r.l
	case <-time.After(bound):
		t.Fatalf("campaign not won within %v", bound)
		return nil
	}
}

// observeUntil reads ch until a report satisfies ok, and returns it.
func observeUntil(t *testing.T, ch <-chan Leader, ok func(Leader) bool) Leader {
	t.Helper()
	timeout := time.After(bound)
	for {
		select {
		case l, open := <-ch:
			if !open {
				t.Fatal("observation ended")
			}
			if ok(l) {
				return l
			}
		case <-timeout:
			t.Fatalf("no such leader observed within %v", bound)
		}
	}
}

func waitDone(t *testing.T, l Leadership) {
	t.Helper()
	select {
	case <-l.Done():
	case <-time.After(bound):
		t.Fatalf("Done not closed within %v after the term ended", bound)
	}
}

func testOneWinsTheOtherObserves(t *testing.T, e engine) {
	a, b := e.open(t, 0)
	ctx := ctxT(t)
	la, err := a.Campaign(ctx, "c1", nodeA)
	if err != nil {
		t.Fatal(err)
	}
	if la.Epoch() == 0 || la.Leader() != (Leader{Candidate: nodeA, Epoch: la.Epoch()}) {
		t.Fatalf("leadership %+v, want node a at a non-zero epoch", la.Leader())
	}
	obs, err := b.Observe(ctx, "c1")
	if err != nil {
		t.Fatal(err)
	}
	if got := observeUntil(t, obs, func(Leader) bool { return true }); got != la.Leader() {
		t.Fatalf("b observes %+v, want %+v", got, la.Leader())
	}
	// b campaigns; while a's guarded write succeeds, b cannot have won.
	bres := campaignAsync(ctx, b, nodeB)
	if err := la.Guarded(ctx, Put("k", []byte("by a"))); err != nil {
		t.Fatalf("a's guarded write: %v", err)
	}
	v, ok, err := b.Get(ctx, "c1", "k")
	if err != nil || !ok || string(v) != "by a" {
		t.Fatalf("b reads k = %q, %v, %v; want a's write", v, ok, err)
	}
	select {
	case r := <-bres:
		t.Fatalf("b won (%v, %v) while a leads", r.l, r.err)
	default:
	}
	if err := la.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	wait(t, bres)
}

func testResignHandsOver(t *testing.T, e engine) {
	a, b := e.open(t, 0)
	ctx := ctxT(t)
	la, err := a.Campaign(ctx, "c1", nodeA)
	if err != nil {
		t.Fatal(err)
	}
	obs, err := a.Observe(ctx, "c1")
	if err != nil {
		t.Fatal(err)
	}
	observeUntil(t, obs, func(l Leader) bool { return l == la.Leader() })
	bres := campaignAsync(ctx, b, nodeB)
	if err := la.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	waitDone(t, la)
	if err := la.Guarded(ctx, Put("k", []byte("late"))); !errors.Is(err, ErrLostLeadership) {
		t.Fatalf("guarded write after resigning: %v, want ErrLostLeadership", err)
	}
	if err := la.Resign(ctx); err != nil {
		t.Fatalf("second resign: %v", err)
	}
	lb := wait(t, bres)
	if lb.Epoch() <= la.Epoch() {
		t.Fatalf("b's epoch %d not above a's %d", lb.Epoch(), la.Epoch())
	}
	if got := observeUntil(t, obs, func(l Leader) bool { return l.ID == "b" }); got != lb.Leader() {
		t.Fatalf("a observes %+v, want %+v", got, lb.Leader())
	}
	if _, ok, _ := b.Get(ctx, "c1", "k"); ok {
		t.Fatal("the deposed leader's write landed")
	}
}

func testLeaseEndDeposes(t *testing.T, e engine) {
	a, b := e.open(t, 0)
	ctx := ctxT(t)
	la, err := a.Campaign(ctx, "c1", nodeA)
	if err != nil {
		t.Fatal(err)
	}
	bres := campaignAsync(ctx, b, nodeB)
	e.kill(t, la)
	waitDone(t, la)
	if err := la.Guarded(ctx, Put("k", []byte("by a"))); !errors.Is(err, ErrLostLeadership) {
		t.Fatalf("guarded write after the lease ended: %v, want ErrLostLeadership", err)
	}
	lb := wait(t, bres)
	if lb.Epoch() <= la.Epoch() {
		t.Fatalf("b's epoch %d not above a's %d", lb.Epoch(), la.Epoch())
	}
	if err := lb.Guarded(ctx, Put("k", []byte("by b"))); err != nil {
		t.Fatal(err)
	}
	if v, _, err := a.Get(ctx, "c1", "k"); err != nil || string(v) != "by b" {
		t.Fatalf("k = %q, %v; want b's write only", v, err)
	}
}

func testEpochsOnlyGrow(t *testing.T, e engine) {
	a, b := e.open(t, 0)
	ctx := ctxT(t)
	obs, err := b.Observe(ctx, "c1")
	if err != nil {
		t.Fatal(err)
	}
	var last uint64
	for i := range 6 {
		c, me := a, nodeA
		if i%2 == 1 {
			c, me = b, nodeB
		}
		l, err := c.Campaign(ctx, "c1", me)
		if err != nil {
			t.Fatal(err)
		}
		if l.Epoch() <= last {
			t.Fatalf("term %d: epoch %d not above the previous %d", i, l.Epoch(), last)
		}
		last = l.Epoch()
		observeUntil(t, obs, func(o Leader) bool { return o == l.Leader() })
		if i%3 == 2 {
			e.kill(t, l)
			waitDone(t, l)
		} else if err := l.Resign(ctx); err != nil {
			t.Fatal(err)
		}
		observeUntil(t, obs, func(o Leader) bool { return o == Leader{} })
	}
}

func testCancelledCampaign(t *testing.T, e engine) {
	a, b := e.open(t, 0)
	ctx := ctxT(t)
	la, err := a.Campaign(ctx, "c1", nodeA)
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	bres := campaignAsync(cctx, b, nodeB)
	cancel()
	if r := <-bres; r.err == nil {
		t.Fatalf("a cancelled campaign won at epoch %d", r.l.Epoch())
	}
	if err := la.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	// The cancelled candidate left no key behind: nobody leads.
	obs, err := a.Observe(ctx, "c1")
	if err != nil {
		t.Fatal(err)
	}
	observeUntil(t, obs, func(o Leader) bool { return o == Leader{} })
}

func testBadInputAndClosed(t *testing.T, e engine) {
	a, _ := e.open(t, 0)
	ctx := ctxT(t)
	for _, bad := range []func() error{
		func() error { _, err := a.Campaign(ctx, "", nodeA); return err },
		func() error { _, err := a.Campaign(ctx, "x/y", nodeA); return err },
		func() error { _, err := a.Campaign(ctx, "c1", Candidate{Addr: "x"}); return err },
		func() error { _, err := a.Observe(ctx, ""); return err },
		func() error { _, _, err := a.Get(ctx, "c1", ""); return err },
	} {
		if err := bad(); !errors.Is(err, ErrBadInput) {
			t.Errorf("got %v, want ErrBadInput", err)
		}
	}
	la, err := a.Campaign(ctx, "c1", nodeA)
	if err != nil {
		t.Fatal(err)
	}
	if err := la.Guarded(ctx, Put("", nil)); !errors.Is(err, ErrBadInput) {
		t.Errorf("guarded write of an empty key: %v, want ErrBadInput", err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	waitDone(t, la)
	if _, err := a.Campaign(ctx, "c1", nodeA); !errors.Is(err, ErrClosed) {
		t.Errorf("campaign after Close: %v, want ErrClosed", err)
	}
	if _, err := a.Observe(ctx, "c1"); !errors.Is(err, ErrClosed) {
		t.Errorf("observe after Close: %v, want ErrClosed", err)
	}
	if err := la.Guarded(ctx); !errors.Is(err, ErrClosed) {
		t.Errorf("guarded write after Close: %v, want ErrClosed", err)
	}
	if err := a.Close(); !errors.Is(err, ErrClosed) {
		t.Errorf("second Close: %v, want ErrClosed", err)
	}
}
