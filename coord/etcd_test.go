package coord

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/oncewal/oncewal/internal/etcdtest"
	"github.com/oncewal/oncewal/testutil"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// openEtcd starts a real single-member etcd and returns its endpoint and an
// admin client for a test's own reads and revocations.
func openEtcd(t *testing.T) (string, *clientv3.Client) {
	ep := etcdtest.Start(t)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{ep}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return ep, cli
}

func newEtcd(t *testing.T, ep string) *Etcd {
	return newEtcdTTL(t, ep, 0)
}

func newEtcdTTL(t *testing.T, ep string, ttl time.Duration) *Etcd {
	c, err := NewEtcd(&EtcdOptions{Endpoints: []string{ep}, LeaseTTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestEtcd: the etcd coordinator keeps the contract, against a real etcd.
func TestEtcd(t *testing.T) {
	var admin *clientv3.Client
	runSuite(t, engine{
		name: "etcd",
		open: func(t *testing.T, ttl time.Duration) (Coordinator, Coordinator) {
			var ep string
			ep, admin = openEtcd(t)
			return newEtcdTTL(t, ep, ttl), newEtcdTTL(t, ep, ttl)
		},
		kill: func(t *testing.T, l Leadership) {
			if _, err := admin.Revoke(context.Background(), l.(*etcdLeadership).s.Lease()); err != nil {
				t.Fatalf("revoke the leader's lease: %v", err)
			}
		},
	})
}

// TestEtcdCampaignAfterItsLeaseEndedFails: the pitfall of invariant 3. b
// waits behind a; b's lease is revoked while it waits (its key goes with
// it); then a resigns. etcd's Election.Campaign would now return nil for b
// — no older key is left — though b holds no key; Campaign must refuse.
func TestEtcdCampaignAfterItsLeaseEndedFails(t *testing.T) {
	ep, admin := openEtcd(t)
	a, b := newEtcd(t, ep), newEtcd(t, ep)
	ctx := ctxT(t)
	la, err := a.Campaign(ctx, "c1", nodeA)
	if err != nil {
		t.Fatal(err)
	}
	// Watch for b's key to appear, to learn its lease.
	pfx := a.electionPrefix("c1") + "/"
	wch := admin.Watch(ctx, pfx, clientv3.WithPrefix())
	bres := campaignAsync(ctx, b, nodeB)
	var lease clientv3.LeaseID
	for lease == 0 {
		wr, ok := <-wch
		if !ok {
			t.Fatal("watch ended")
		}
		for _, ev := range wr.Events {
			var who Candidate
			if ev.Type == clientv3.EventTypePut && json.Unmarshal(ev.Kv.Value, &who) == nil && who == nodeB {
				lease = clientv3.LeaseID(ev.Kv.Lease)
			}
		}
	}
	if _, err := admin.Revoke(ctx, lease); err != nil {
		t.Fatal(err)
	}
	if err := la.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-bres
	if !errors.Is(r.err, ErrLostLeadership) {
		t.Fatalf("campaign whose lease ended while waiting: leadership %v, err %v; want ErrLostLeadership", r.l, r.err)
	}
}

// TestEtcdUnreachable: a coordinator whose etcd does not answer fails
// with ErrUnavailable once the caller's deadline passes, never hangs, and
// elects nobody.
func TestEtcdUnreachable(t *testing.T) {
	c := newEtcd(t, "http://127.0.0.1:1")
	ctx, cancel := context.WithTimeout(context.Background(), 0)
	defer cancel()
	_, err := c.Campaign(ctx, "c1", nodeA)
	if err == nil || !(errors.Is(err, ErrUnavailable) || errors.Is(err, context.DeadlineExceeded)) {
		t.Fatalf("campaign without etcd: %v, want ErrUnavailable or the deadline", err)
	}
}

// TestEtcdCutFromEtcdDeadlinePassesBeforeAnotherWins: a leader whose
// client loses etcd (a proxy between them closes) renews nothing more: its
// Deadline stays where a renewal sent before the cut put it, Done closes
// by then, and the candidate that wins after its lease expired in etcd
// wins after that Deadline (invariant 7).
func TestEtcdCutFromEtcdDeadlinePassesBeforeAnotherWins(t *testing.T) {
	ep, _ := openEtcd(t)
	proxy := testutil.NewFaultProxy(t, strings.TrimPrefix(ep, "http://"), 1, testutil.ProxyFaults{})
	t.Cleanup(proxy.Close)
	a, b := newEtcdTTL(t, "http://"+proxy.Addr(), shortTTL), newEtcdTTL(t, ep, shortTTL)
	ctx := ctxT(t)
	la, err := a.Campaign(ctx, "c1", nodeA)
	if err != nil {
		t.Fatal(err)
	}
	bres := campaignAsync(ctx, b, nodeB)
	// Cut after a renewal (not the grant) set the deadline.
	d0 := la.Deadline()
	waitFor(t, func() bool { return la.Deadline().After(d0) })
	proxy.Close()
	cut := time.Now()
	// The bound of a renewal sent at the cut: no later renewal can count,
	// nor one timed from its answer (which etcd gave after renewing).
	latest := leaseDeadline(cut, int64(shortTTL/time.Second))
	if d := la.Deadline(); d.After(latest) {
		t.Fatalf("deadline %v after the cut; a renewal sent before it bounds it by %v", d.Sub(cut), latest.Sub(cut))
	}
	select {
	case <-la.Done():
	case <-time.After(time.Until(cut.Add(shortTTL + time.Second))):
		t.Fatalf("Done open %v after the leader lost etcd, lease TTL %v", time.Since(cut), shortTTL)
	}
	if d := la.Deadline(); d.After(latest) || d.After(time.Now()) {
		t.Fatalf("deadline %v after the cut, past Done; want no later than a renewal sent at the cut could make it (%v)",
			d.Sub(cut), latest.Sub(cut))
	}
	wait(t, bres)
	won := time.Now()
	if d := la.Deadline(); !d.Before(won) {
		t.Fatalf("b won %v before the cut leader's deadline", d.Sub(won))
	}
}

// waitFor polls cond until it holds, failing the test after bound.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	timeout := time.After(bound)
	for !cond() {
		select {
		case <-tick.C:
		case <-timeout:
			t.Fatalf("condition not met within %v", bound)
		}
	}
}

// TestEtcdWatchRereadsAfterCompaction: a watch that etcd cancels because
// the revision it would resume from was compacted while the client was
// away does not stop in silence (invariant 8): the keys are read again
// and the latest state reported.
func TestEtcdWatchRereadsAfterCompaction(t *testing.T) {
	ep, admin := openEtcd(t)
	proxy := testutil.NewFaultProxy(t, strings.TrimPrefix(ep, "http://"), 1, testutil.ProxyFaults{})
	t.Cleanup(proxy.Close)
	c := newEtcd(t, "http://"+proxy.Addr())
	ctx := ctxT(t)
	w, err := c.Watch(ctx, "c1", "")
	if err != nil {
		t.Fatal(err)
	}
	watchUntil(t, w, is(map[string]string{}))
	proxy.Close()
	var rev int64
	for i := range 3 {
		r, err := admin.Put(ctx, c.dataKey("c1", "k"), strconv.Itoa(i))
		if err != nil {
			t.Fatal(err)
		}
		rev = r.Header.Revision
	}
	if _, err := admin.Compact(ctx, rev); err != nil {
		t.Fatal(err)
	}
	c.cli.SetEndpoints(ep)
	watchUntil(t, w, is(map[string]string{"k": "2"}))
}
