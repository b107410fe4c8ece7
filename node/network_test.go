package node

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/oncewal/oncewal/client"
	"github.com/oncewal/oncewal/coord"
	"github.com/oncewal/oncewal/internal/etcdtest"
	"github.com/oncewal/oncewal/internal/keyspace"
	"go.etcd.io/etcd/pkg/v3/proxy"
	"go.uber.org/zap"
)

// freeAddr returns a loopback address nothing listens on now.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	return addr
}

// netCluster is members on a real etcd and gRPC over loopback.
func netCluster(t *testing.T, shards int, ids ...string) (*cluster, []string) {
	return netClusterVia(t, shards, func(ep, _ string) string { return ep }, ids...)
}

// netClusterVia is netCluster with each member reaching etcd (at ep) at
// via(ep, id): a proxy a test can cut, say.
func netClusterVia(t *testing.T, shards int, via func(ep, id string) string, ids ...string) (*cluster, []string) {
	t.Helper()
	ep := etcdtest.Start(t)
	coords := map[string]coord.Coordinator{}
	for _, id := range ids {
		c, err := coord.NewEtcd(&coord.EtcdOptions{Endpoints: []string{via(ep, id)}, LeaseTTL: 2 * time.Second, DialTimeout: time.Second, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		coords[id] = c
	}
	cl := newCluster(t, coords[ids[0]], shards, ids...)
	cl.coordFor = func(id string) coord.Coordinator { return coords[id] }
	addrs := map[string]string{}
	var all []string
	for _, id := range ids {
		addrs[id] = freeAddr(t)
		all = append(all, addrs[id])
	}
	cl.transportFor = func(id string) (string, Transport) {
		g, err := NewGRPC(&GRPCOptions{Listen: addrs[id], Insecure: true, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = g.Close() })
		return addrs[id], g
	}
	return cl, all
}

// TestFailoverOverTheNetwork: three members on a real etcd serve a client
// over gRPC; the leader stops twice, and each time another is elected
// and the client, retrying with its request IDs, carries on. Every request
// the client saw answered is applied exactly once on every replica, and
// asking again replays it.
func TestFailoverOverTheNetwork(t *testing.T) {
	cl, addrs := netCluster(t, 2, "a", "b", "c")
	for _, id := range []string{"a", "b", "c"} {
		cl.start(id)
	}
	c, err := client.New(&client.Options{Addrs: addrs, Insecure: true, Principal: "tester", Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	submit := func(i int) client.Result {
		t.Helper()
		r, err := c.Submit(ctx, fmt.Sprintf("req-%03d", i), client.Ops(client.Add([]byte(fmt.Sprintf("ctr-%03d", i)), 1)))
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		return r
	}
	const per = 15
	var epochs []uint64
	for round := range 3 {
		for i := round * per; i < (round+1)*per; i++ {
			submit(i)
		}
		id, _ := cl.waitLeader("")
		epochs = append(epochs, cl.nodes[id].n.Status().Epoch)
		if round < 2 {
			cl.stop(id)
			cl.start(id) // back as a follower: rebuilt from the new leader
		}
	}
	for i := range 3 * per {
		if r := submit(i); !r.Replayed {
			t.Errorf("request %d ran again after the failovers (epoch %d)", i, r.Epoch)
		}
	}
	if !(epochs[0] < epochs[1] && epochs[1] < epochs[2]) {
		t.Errorf("leader epochs across the failovers: %v, want them growing", epochs)
	}
	lid, l := cl.waitLeader("")
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := l.WaitAcked(wctx, 3); err != nil { // leader.AckAll
		t.Fatalf("leader %s: not every member caught up: %v", lid, err)
	}
	cl.stopAll()
	for id, dir := range cl.dirs {
		counters := 0
		for k, v := range replicaState(t, dir, 2) {
			if !strings.Contains(k, "ctr-") || !strings.Contains(k, keyspace.State) {
				continue
			}
			counters++
			if len(v) != 9 || binary.LittleEndian.Uint64([]byte(v)[1:]) != 1 {
				t.Errorf("member %s: %s = %x, want the counter at 1 (applied once)", id, k, v)
			}
		}
		if counters != 3*per {
			t.Errorf("member %s holds %d counters, want %d", id, counters, 3*per)
		}
	}
}

// etcdCut is a proxy between one member and etcd that a test can cut and
// heal (etcd's pkg/v3/proxy). A cut pauses both directions: the
// connections stay up and carry nothing until the heal, and then carry
// what was sent meanwhile, as TCP does across a partition. (Its blackhole
// instead drops bytes from the middle of a stream, which no TCP connection
// does: a request lost that way left a member's lease grant waiting
// forever on a connection whose pings got through again.)
type etcdCut struct{ s proxy.Server }

func newEtcdCut(t *testing.T, etcd string) (*etcdCut, string) {
	t.Helper()
	to, err := url.Parse(etcd)
	if err != nil {
		t.Fatal(err)
	}
	from := url.URL{Scheme: "tcp", Host: freeAddr(t)}
	s := proxy.NewServer(proxy.ServerConfig{Logger: zap.NewNop(), From: from, To: url.URL{Scheme: "tcp", Host: to.Host}})
	select {
	case <-s.Ready():
	case err := <-s.Error():
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return &etcdCut{s}, "http://" + from.Host
}

func (c *etcdCut) cut()  { c.s.PauseTx(); c.s.PauseRx() }
func (c *etcdCut) heal() { c.s.UnpauseTx(); c.s.UnpauseRx() }

// TestEtcdOutage: a leader cut from etcd stops acknowledging once its lease
// may have ended and another member, still reaching etcd, takes over; with
// etcd lost to every member nobody leads and writes are refused, never
// acknowledged by two leaders; once etcd answers again a leader is elected
// and every acknowledged request is there exactly once.
func TestEtcdOutage(t *testing.T) {
	ids := []string{"a", "b", "c"}
	cuts := map[string]*etcdCut{}
	cl, all := netClusterVia(t, 1, func(ep, id string) string {
		cut, via := newEtcdCut(t, ep)
		cuts[id] = cut
		return via
	}, ids...)
	for _, id := range ids {
		cl.start(id)
	}
	// While no member leads, the client's attempts do not count (every
	// node answers NotLeader naming nobody): RetryTimeout bounds the wait.
	c, err := client.New(&client.Options{Addrs: all, Insecure: true, Principal: "tester", Logger: quiet, RetryTimeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	var acked []string
	submit := func(id string) error {
		_, err := c.Submit(ctx, id, client.Ops(client.Add([]byte("ctr-"+id), 1)))
		if err == nil {
			acked = append(acked, id)
		}
		return err
	}
	for i := range 10 {
		if err := submit(fmt.Sprintf("before-%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	first, _ := cl.waitLeader("")
	cuts[first].cut()
	// The cut leader steps down on its own; another takes over.
	second, _ := cl.waitLeader(first)
	waitFor(t, first+" to step down", func() bool { _, err := cl.nodes[first].n.Leader(); return err != nil })
	for i := range 10 {
		if err := submit(fmt.Sprintf("cut-%d", i)); err != nil {
			t.Fatalf("a write with %s cut from etcd and %s leading: %v", first, second, err)
		}
	}
	cuts[first].heal()

	// etcd lost to everyone: within a lease nobody leads, and writes fail.
	for _, id := range ids {
		cuts[id].cut()
	}
	waitFor(t, "every member to stop leading", func() bool {
		for _, id := range ids {
			if _, err := cl.nodes[id].n.Leader(); err == nil {
				return false
			}
		}
		return true
	})
	short, cancel := context.WithTimeout(ctx, 3*time.Second)
	_, err = c.Submit(short, "during-outage", client.Ops(client.Add([]byte("ctr-during-outage"), 1)))
	cancel()
	if err == nil {
		t.Fatalf("a write was acknowledged while no member could reach etcd")
	}
	for _, id := range ids {
		cuts[id].heal()
	}
	cl.waitLeader("")
	for i := range 10 {
		if err := submit(fmt.Sprintf("after-%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range acked {
		r, err := c.Submit(ctx, id, client.Ops(client.Add([]byte("ctr-"+id), 1)))
		if err != nil || !r.Replayed {
			t.Errorf("request %s after the outages: %+v, %v; want its replay", id, r, err)
		}
	}
}
