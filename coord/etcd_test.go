package coord

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/oncewal/oncewal/internal/etcdtest"
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
	c, err := NewEtcd(&EtcdOptions{Endpoints: []string{ep}})
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
		open: func(t *testing.T) (Coordinator, Coordinator) {
			var ep string
			ep, admin = openEtcd(t)
			return newEtcd(t, ep), newEtcd(t, ep)
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
