package leader

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/oncewal/oncewal/replication/inprocess"

	"github.com/oncewal/oncewal/replication"
)

func TestAckPolicyNeed(t *testing.T) {
	// majority counts the leader: of n+1 replicas, (n+1)/2+1 with the
	// leader, so (n+1)/2 followers.
	for n, want := range map[int][3]int{1: {1, 1, 1}, 2: {1, 1, 2}, 3: {1, 2, 3}, 4: {1, 2, 4}, 5: {1, 3, 5}} {
		got := [3]int{AckOne.Need(n), AckMajority.Need(n), AckAll.Need(n)}
		if got != want {
			t.Errorf("n=%d: one/majority/all need %v, want %v", n, got, want)
		}
	}
	if AckMajority.String() != "majority" || AckPolicy(9).String() != "AckPolicy(9)" {
		t.Error("String")
	}
}

// TestMajorityWithOneOfTwoFollowersDown: with two registered followers and
// one of them down, majority (the leader and one follower of three
// replicas) is still met, so writes keep flowing; all is not.
func TestMajorityWithOneOfTwoFollowersDown(t *testing.T) {
	r := newFanoutRig(t, []string{"a", "b"}, nil, 1, nil)
	r.start("a")
	for i := 0; i < 20; i++ {
		r.log.append(t, 1, 2)
	}
	end := r.log.lastLSN()
	r.waitAcked(end, AckMajority)
	if !blocked(r.fo, end, AckAll) {
		t.Fatal("all of a, b acknowledged with b down")
	}
}

// blocked reports whether WaitAcked is still waiting after a short while
// (a liveness probe, not a timing assertion: it only must not return early).
func blocked(fo *Fanout, lsn uint64, p AckPolicy) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	return errors.Is(fo.WaitAcked(ctx, lsn, p), context.DeadlineExceeded)
}

// TestFanoutWaitAckedPolicies: with follower c stalled (registered, never
// connected), one and majority of {a, b, c} are met and all is not; all is
// met once c catches up, or once c is unregistered; registering a new
// follower while waiting for all makes all wait for it too.
func TestFanoutWaitAckedPolicies(t *testing.T) {
	r := newFanoutRig(t, []string{"a", "b", "c"}, map[string]inprocess.FaultOptions{"a": noDisconnects(inprocess.FaultsLight)}, 1, nil)
	r.start("a")
	r.start("b")
	for i := 0; i < 50; i++ {
		r.log.append(t, 1, 2)
	}
	end := r.log.lastLSN()
	r.waitAcked(end, AckOne)
	r.waitAcked(end, AckMajority)
	if !blocked(r.fo, end, AckAll) {
		t.Fatal("all of a, b, c acknowledged with c stalled")
	}
	if err := r.fo.WaitAcked(context.Background(), 0, AckAll); err != nil {
		t.Fatal(err) // nothing to acknowledge
	}

	// c catches up: all is met.
	allDone := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		allDone <- r.fo.WaitAcked(ctx, end, AckAll)
	}()
	r.start("c")
	if err := <-allDone; err != nil {
		t.Fatalf("all: %v; %+v", err, r.fo.Stats())
	}

	// A follower registered while all is awaited is waited for.
	if err := r.fo.Register("d"); err != nil {
		t.Fatal(err)
	}
	r.log.append(t, 1, 2)
	end = r.log.lastLSN()
	r.waitAcked(end, AckMajority) // 2 of 4 needed, 3 have it
	if !blocked(r.fo, end, AckAll) {
		t.Fatal("all of a, b, c, d acknowledged with d never connected")
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		allDone <- r.fo.WaitAcked(ctx, end, AckAll)
	}()
	time.Sleep(5 * time.Millisecond) // let it wait (harmless if it has not yet)
	// Unregistering d lets the waiter finish on the remaining three.
	if err := r.fo.Unregister("d"); err != nil {
		t.Fatal(err)
	}
	if err := <-allDone; err != nil {
		t.Fatalf("all after Unregister: %v", err)
	}
	r.stop()

	// With two of three stalled, majority is not met; one is.
	r = newFanoutRig(t, []string{"a", "b", "c"}, nil, 1, nil)
	defer r.stop()
	r.start("a")
	r.log.append(t, 1, 1)
	r.waitAcked(1, AckOne)
	if !blocked(r.fo, 1, AckMajority) {
		t.Fatal("majority of a, b, c with b and c stalled")
	}
	for _, id := range []string{"b", "c"} {
		if err := r.fo.Unregister(id); err != nil {
			t.Fatal(err)
		}
	}
	r.waitAcked(1, AckAll)
	if err := r.fo.Unregister("a"); err != nil {
		t.Fatal(err)
	}
	if err := r.fo.WaitAcked(context.Background(), 1, AckOne); !errors.Is(err, ErrNoFollowers) {
		t.Fatalf("WaitAcked with every follower unregistered: %v", err)
	}
}

// TestFanoutFollowerFigures: per-follower acked LSN, lag in events and
// bytes, connected or not, connections, and the OnAcked callback.
func TestFanoutFollowerFigures(t *testing.T) {
	var mu sync.Mutex
	acked := map[string][]uint64{}
	r := newCacheRig(t, []string{"a", "slow", "off"}, 0, func(o *FanoutOptions) {
		o.OnAcked = func(id string, lsn uint64) {
			mu.Lock()
			defer mu.Unlock()
			acked[id] = append(acked[id], lsn)
		}
	})
	defer r.stop()
	var size uint64
	for i := 0; i < 10; i++ {
		h := r.appendFed(2)
		size = uint64(h.Size())
	}
	r.start("a")
	r.waitAcked(20, AckOne)
	// "slow" connects and stops acknowledging after its hello at LSN 6.
	slow, err := r.trs["slow"].Dial(context.Background(), replication.Ack{Shard: 2, FollowerID: "slow", AppliedLSN: 6})
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	for !r.stats("slow").Connected {
		time.Sleep(time.Millisecond)
	}
	st := r.fo.Stats()
	if st.EndLSN != 20 {
		t.Fatalf("EndLSN %d", st.EndLSN)
	}
	want := map[string]FollowerStats{
		"a":    {ID: "a", Connected: true, LagEvents: 0, LagBytes: 0},
		"off":  {ID: "off", Connected: false, LagEvents: 20, LagBytes: 10 * size},
		"slow": {ID: "slow", Connected: true, LagEvents: 14, LagBytes: 7 * size},
	}
	for _, f := range st.Followers {
		w := want[f.ID]
		if f.Connected != w.Connected || f.LagEvents != w.LagEvents || f.LagBytes != w.LagBytes {
			t.Errorf("%s: connected %v lag %d events %d bytes, want %v %d %d", f.ID, f.Connected, f.LagEvents, f.LagBytes,
				w.Connected, w.LagEvents, w.LagBytes)
		}
	}
	if a := r.stats("a"); a.AckedLSN != 20 || a.Connections != 1 {
		t.Errorf("a %+v", a)
	}
	if lsn, err := r.fo.AckedLSN("slow"); err != nil || lsn != 6 {
		t.Errorf("AckedLSN(slow) = %d, %v", lsn, err)
	}
	// slow acknowledges what it got: its lag shrinks.
	if _, err := slow.Recv(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := slow.Send(context.Background(), replication.Ack{Shard: 2, AppliedLSN: 8}); err != nil {
		t.Fatal(err)
	}
	for r.stats("slow").AckedLSN != 8 {
		time.Sleep(time.Millisecond)
	}
	if s := r.stats("slow"); s.LagEvents != 12 || s.LagBytes != 6*size {
		t.Errorf("slow after an ack: %+v", s)
	}
	mu.Lock()
	defer mu.Unlock()
	if got := acked["slow"]; len(got) != 2 || got[0] != 6 || got[1] != 8 {
		t.Errorf("OnAcked(slow) saw %v", got)
	}
	if got := acked["a"]; len(got) == 0 || got[len(got)-1] != 20 {
		t.Errorf("OnAcked(a) saw %v", got)
	}
	if _, ok := acked["off"]; ok {
		t.Errorf("OnAcked for a follower that never connected")
	}
}

// TestFanoutLagBelowTheCache: below the cache, the lag in bytes is an
// estimate from the mean event size; in events it is exact.
func TestFanoutLagBelowTheCache(t *testing.T) {
	m := newMemLog(2)
	_, raw := m.appendBatch(t, 1, 1)
	r := newCacheRig(t, []string{"off"}, 3*int64(len(raw)))
	defer r.stop()
	for i := 0; i < 10; i++ {
		r.appendFed(1)
	}
	f := r.stats("off")
	if f.LagEvents != 10 || f.LagBytes != 10*uint64(len(raw)) || r.fo.Stats().Cache.FirstLSN != 8 {
		t.Fatalf("off %+v; cache %+v", f, r.fo.Stats().Cache)
	}
}
