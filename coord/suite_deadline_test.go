package coord

import (
	"testing"
	"time"
)

// shortTTL is the lease of the deadline tests: etcd's smallest whole
// seconds that Validate allows, so that renewals (every TTL/3) come often.
const shortTTL = 2 * time.Second

// testDeadlineAdvancesWithRenewals: right after Campaign the deadline is
// ahead, and within one TTL of now; it moves forward as the lease is
// renewed, never back, while Done stays open (invariant 7).
func testDeadlineAdvancesWithRenewals(t *testing.T, e engine) {
	a, _ := e.open(t, shortTTL)
	if got := a.LeaseTTL(); got != shortTTL {
		t.Fatalf("LeaseTTL %v, want the configured %v", got, shortTTL)
	}
	ctx := ctxT(t)
	l, err := a.Campaign(ctx, "c1", nodeA)
	if err != nil {
		t.Fatal(err)
	}
	d0 := l.Deadline()
	if now := time.Now(); !d0.After(now) || d0.After(now.Add(shortTTL)) {
		t.Fatalf("deadline at the win is %v from now; want ahead, by no more than the TTL %v", d0.Sub(now), shortTTL)
	}
	// Renewals come every TTL/3; wait (bounded) until two have moved it.
	tick := time.NewTicker(shortTTL / 20)
	defer tick.Stop()
	timeout := time.After(bound)
	last, moves := d0, 0
	for moves < 2 {
		select {
		case <-tick.C:
		case <-l.Done():
			t.Fatal("Done closed while the lease was being renewed")
		case <-timeout:
			t.Fatalf("deadline moved %d times in %v, want renewals every %v", moves, bound, shortTTL/3)
		}
		d := l.Deadline()
		if d.Before(last) {
			t.Fatalf("deadline moved back by %v", last.Sub(d))
		}
		if d.After(last) {
			moves++
			last = d
		}
	}
	if !last.After(d0.Add(shortTTL / 3)) {
		t.Fatalf("two renewals moved the deadline by %v only, want more than TTL/3", last.Sub(d0))
	}
}

// testDeadlinePassesWhenTheLeaseEnds: once the lease is revoked (or
// expires), Done closes and the deadline is no later than now; a resign
// makes it so before Resign returns, before the next candidate can win.
func testDeadlinePassesWhenTheLeaseEnds(t *testing.T, e engine) {
	a, b := e.open(t, shortTTL)
	ctx := ctxT(t)
	l, err := a.Campaign(ctx, "c1", nodeA)
	if err != nil {
		t.Fatal(err)
	}
	e.kill(t, l)
	waitDone(t, l)
	if d := l.Deadline(); d.After(time.Now()) {
		t.Fatalf("deadline %v ahead after the lease ended and Done closed", time.Until(d))
	}

	l, err = b.Campaign(ctx, "c1", nodeB)
	if err != nil {
		t.Fatal(err)
	}
	if !l.Deadline().After(time.Now()) {
		t.Fatal("a new term's deadline is not ahead")
	}
	if err := l.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.Done():
	default:
		t.Fatal("Done open after Resign returned")
	}
	if d := l.Deadline(); d.After(time.Now()) {
		t.Fatalf("deadline %v ahead after Resign returned", time.Until(d))
	}
}
