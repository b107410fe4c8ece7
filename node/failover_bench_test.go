package node

import (
	"context"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oncewal/oncewal/client"
	"github.com/oncewal/oncewal/coord"
	"github.com/oncewal/oncewal/follower"
	"github.com/oncewal/oncewal/idempotency"
	"github.com/oncewal/oncewal/internal/etcdtest"
	"github.com/oncewal/oncewal/leader"
	"github.com/oncewal/oncewal/store"
	"github.com/oncewal/oncewal/testutil"
	"google.golang.org/grpc/backoff"
)

// BenchmarkFailover measures the failover time of three members on a real
// etcd (internal/etcdtest) serving clients over gRPC on loopback: from the
// moment the leader is killed to the first write its successor
// acknowledges to a client — a probe that sends fresh requests from the
// kill on (see probe), while failoverWriters clients write on. A kill cuts the member off etcd (its etcd
// client goes through a proxy that closes) and then stops its Run: it
// resigns nothing, so its lease expires a TTL after its last renewal, and
// its endpoint closes, as a killed process's would. The member then comes
// back on its directory, and everything is on every replica again before
// the next kill. Each b.N is one kill; the distribution is reported as
// min/median/p90/max-ns/failover (ns/op is the whole round: kill, failover,
// restart, catch-up); max-request-ns is the writers' longest answered
// request. A kill slower than TTL + 2 s (issue 27's aim) is logged. The
// members run with node's defaults; the clients with 1 s attempts and a
// backoff of at most 200 ms, so that the figure is the cluster's, not the
// clients' pacing.
//
// Two lease TTLs, as sub-benchmarks: ttl=10s (coord.DefaultLeaseTTL) and
// ttl=2s (the shortest etcd lease coord takes; the short variant). The
// README's figure is
//
//	go test ./node -run xxx -bench Failover -benchtime 20x
//
// (20 kills per TTL; -bench 'Failover/ttl=2s' for the short one alone).
// TestFailoverTime runs the short variant's 20 kills with ONCEWAL_LONG=1.
func BenchmarkFailover(b *testing.B) {
	for _, ttl := range []time.Duration{coord.DefaultLeaseTTL, 2 * time.Second} {
		b.Run(fmt.Sprintf("ttl=%v", ttl), func(b *testing.B) {
			if b.N < 20 {
				b.Logf("%d kills: give -benchtime 20x for a distribution over 20", b.N)
			}
			fc := newFailoverCluster(b, ttl)
			b.ResetTimer()
			times := fc.killRounds(b.N)
			b.StopTimer()
			reportFailovers(b, times)
			fc.mu.Lock()
			b.ReportMetric(float64(fc.maxRequest.Nanoseconds()), "max-request-ns")
			fc.mu.Unlock()
		})
	}
}

// TestFailoverTime: the benchmark's short variant (lease TTL 2 s, 20
// kills) as a test, with ONCEWAL_LONG=1 (it takes about a minute): every
// kill is followed by another member's election and an acknowledged
// write, and the distribution is logged. It asserts no time: the machine
// shared with other tests sets it.
func TestFailoverTime(t *testing.T) {
	if os.Getenv("ONCEWAL_LONG") != "1" {
		t.Skip("20 leader kills at TTL 2s (about a minute): set ONCEWAL_LONG=1")
	}
	fc := newFailoverCluster(t, 2*time.Second)
	times := fc.killRounds(20)
	slices.Sort(times)
	fc.mu.Lock()
	defer fc.mu.Unlock()
	t.Logf("failover time over %d kills at lease TTL 2s: min %v, median %v, p90 %v, max %v; longest request %v",
		len(times), times[0], times[len(times)/2], times[len(times)*9/10], times[len(times)-1], fc.maxRequest)
}

// reportFailovers reports the distribution of times as b's metrics.
func reportFailovers(b *testing.B, times []time.Duration) {
	slices.Sort(times)
	q := func(p float64) float64 {
		return float64(times[min(len(times)-1, int(p*float64(len(times))))].Nanoseconds())
	}
	b.ReportMetric(float64(times[0].Nanoseconds()), "min-ns/failover")
	b.ReportMetric(q(0.5), "median-ns/failover")
	b.ReportMetric(q(0.9), "p90-ns/failover")
	b.ReportMetric(float64(times[len(times)-1].Nanoseconds()), "max-ns/failover")
}

// failoverCluster is three members on a real etcd, each member's etcd
// client through its own proxy, and a client writing continuously.
type failoverCluster struct {
	tb      testing.TB
	ttl     time.Duration
	etcd    string // host:port
	ids     []string
	dirs    map[string]string
	addrs   map[string]string
	mu      sync.Mutex
	members map[string]*failoverMember
	bg      sync.WaitGroup // closing killed members' etcd clients

	maxRequest time.Duration // the longest Submit of the writers that was answered
	prober     *client.Client
	probes     int
}

// failoverWriters is how many clients write at once, beside the probe.
const failoverWriters = 2

type failoverMember struct {
	n     *Node
	g     *GRPC
	c     *coord.Etcd
	proxy *testutil.FaultProxy
	stop  context.CancelFunc
	done  chan error
}

// failoverWait bounds every wait: far above a failover at the TTL.
func (fc *failoverCluster) wait() time.Duration { return 6*fc.ttl + 30*time.Second }

func newFailoverCluster(tb testing.TB, ttl time.Duration) *failoverCluster {
	tb.Helper()
	ep := etcdtest.Start(tb)
	fc := &failoverCluster{tb: tb, ttl: ttl, etcd: strings.TrimPrefix(ep, "http://"), ids: []string{"a", "b", "c"},
		dirs: map[string]string{}, addrs: map[string]string{}, members: map[string]*failoverMember{}}
	admin, err := coord.NewEtcd(&coord.EtcdOptions{Endpoints: []string{ep}, LeaseTTL: ttl, Logger: quiet})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = admin.Close() })
	var all []string
	for _, id := range fc.ids {
		if _, err := AddMember(context.Background(), admin, testCluster, id); err != nil {
			tb.Fatal(err)
		}
		fc.dirs[id] = tb.TempDir()
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			tb.Fatal(err)
		}
		fc.addrs[id] = l.Addr().String()
		_ = l.Close()
		all = append(all, fc.addrs[id])
	}
	tb.Cleanup(func() {
		for _, id := range fc.ids {
			fc.stop(id)
		}
		fc.bg.Wait()
	})
	for _, id := range fc.ids {
		fc.start(id)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var clients []*client.Client
	tb.Cleanup(func() { // before the members stop (cleanups run last first)
		cancel()
		wg.Wait()
		for _, c := range clients {
			_ = c.Close()
		}
	})
	for i := range failoverWriters + 1 { // the writers, then the probe
		c, err := client.New(&client.Options{Addrs: all, Insecure: true, Principal: fmt.Sprintf("bench-%d", i), Logger: quiet,
			Attempts: 1 << 20, RetryTimeout: fc.wait() + idempotency.DefaultLease, AttemptTimeout: time.Second,
			Backoff: backoff.Config{BaseDelay: 10 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 200 * time.Millisecond}})
		if err != nil {
			tb.Fatal(err)
		}
		clients = append(clients, c)
		if i == failoverWriters {
			fc.prober = c
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			fc.write(ctx, c)
		}()
	}
	return fc
}

// write submits requests one after another until ctx ends, noting the
// longest.
func (fc *failoverCluster) write(ctx context.Context, c *client.Client) {
	for i := 0; ctx.Err() == nil; i++ {
		start := time.Now()
		_, err := c.Submit(ctx, fmt.Sprintf("req-%07d", i), client.Ops(client.Add([]byte("ctr"), 1)))
		if err != nil {
			continue
		}
		now := time.Now()
		fc.mu.Lock()
		fc.maxRequest = max(fc.maxRequest, now.Sub(start))
		fc.mu.Unlock()
		select {
		case <-ctx.Done():
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// start runs member id on its directory, its etcd client through a new
// proxy.
func (fc *failoverCluster) start(id string) {
	fc.tb.Helper()
	p := testutil.NewFaultProxy(fc.tb, fc.etcd, 1, testutil.ProxyFaults{})
	c, err := coord.NewEtcd(&coord.EtcdOptions{Endpoints: []string{"http://" + p.Addr()}, LeaseTTL: fc.ttl, Logger: quiet})
	if err != nil {
		fc.tb.Fatal(err)
	}
	g, err := NewGRPC(&GRPCOptions{Listen: fc.addrs[id], Insecure: true, Logger: quiet})
	if err != nil {
		fc.tb.Fatal(err)
	}
	st := store.Options{Logger: quiet}
	n, err := Open(&Options{Coordinator: c, Cluster: testCluster, ID: id, Dir: fc.dirs[id], Addr: fc.addrs[id], Transport: g, Logger: quiet,
		Leader: leader.Options{Store: st}, Follower: follower.NodeOptions{Follower: follower.Options{Store: st}}})
	if err != nil {
		fc.tb.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	m := &failoverMember{n: n, g: g, c: c, proxy: p, stop: stop, done: make(chan error, 1)}
	go func() { m.done <- n.Run(ctx) }()
	fc.mu.Lock()
	fc.members[id] = m
	fc.mu.Unlock()
}

// kill cuts member id off etcd, then stops it (in the background: its
// last resignation waits out its timeout): nothing it does from then on
// reaches etcd (no renewal, no resignation). The channel closes once it
// has stopped.
func (fc *failoverCluster) kill(id string) <-chan struct{} {
	fc.mu.Lock()
	m := fc.members[id]
	fc.mu.Unlock()
	m.proxy.Close()
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		fc.stop(id)
	}()
	return stopped
}

// stop ends member id's Run and releases its directory and port; its etcd
// client closes in the background (a cut one's revoke waits out its
// timeout).
func (fc *failoverCluster) stop(id string) {
	fc.tb.Helper()
	fc.mu.Lock()
	m := fc.members[id]
	delete(fc.members, id)
	fc.mu.Unlock()
	if m == nil {
		return
	}
	m.stop()
	select {
	case err := <-m.done:
		if err != nil {
			fc.tb.Errorf("member %s: Run: %v", id, err)
		}
	case <-time.After(fc.wait()):
		fc.tb.Errorf("member %s: Run did not return within %v of its stop", id, fc.wait())
		return
	}
	if err := m.n.Close(); err != nil {
		fc.tb.Errorf("member %s: Close: %v", id, err)
	}
	_ = m.g.Close()
	fc.bg.Add(1)
	go func() {
		defer fc.bg.Done()
		_ = m.c.Close()
		m.proxy.Close()
	}()
}

// leader waits for a member to lead at an epoch above after.
func (fc *failoverCluster) leader(after uint64) (string, uint64, *leader.Leader) {
	fc.tb.Helper()
	deadline := time.Now().Add(fc.wait())
	for time.Now().Before(deadline) {
		fc.mu.Lock()
		for id, m := range fc.members {
			st := m.n.Status()
			if l, err := m.n.Leader(); err == nil && st.Epoch > after {
				fc.mu.Unlock()
				return id, st.Epoch, l
			}
		}
		fc.mu.Unlock()
		time.Sleep(2 * time.Millisecond)
	}
	fc.tb.Fatalf("no member led above epoch %d within %v", after, fc.wait())
	return "", 0, nil
}

// probe sends fresh requests, each under a new ID and for at most 2 s,
// until one is answered at an epoch above e, and returns when. A fresh ID
// per try, so that the figure is the first write the successor takes;
// max-request-ns reports the writers' requests, retried with their IDs
// across the kill (a claim in flight at the kill is freed by the
// successor: node's "Requests in flight at a failover").
func (fc *failoverCluster) probe(e uint64) time.Time {
	fc.tb.Helper()
	deadline := time.Now().Add(fc.wait())
	for time.Now().Before(deadline) {
		fc.probes++
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		r, err := fc.prober.Submit(ctx, fmt.Sprintf("probe-%07d", fc.probes), client.Ops(client.Add([]byte("probe"), 1)))
		cancel()
		if err == nil && r.Epoch > e {
			return time.Now()
		}
	}
	fc.tb.Fatalf("no write acknowledged above epoch %d within %v", e, fc.wait())
	return time.Time{}
}

// killRounds kills the leader n times and returns each failover time: the
// kill → the client's first answer from the successor. Between kills the
// killed member comes back and catches up.
func (fc *failoverCluster) killRounds(n int) []time.Duration {
	fc.tb.Helper()
	id, epoch, _ := fc.leader(0)
	fc.probe(epoch - 1)
	var times []time.Duration
	for range n {
		t0 := time.Now()
		stopped := fc.kill(id)
		next, nepoch, nl := fc.leader(epoch)
		elected := time.Since(t0)
		ft := fc.probe(epoch).Sub(t0)
		times = append(times, ft)
		if ft > fc.ttl+2*time.Second { // over issue 27's aim: say what took long
			fc.tb.Logf("kill %d: %s (epoch %d) → %s (epoch %d) leads after %v; first write acknowledged after %v",
				len(times), id, epoch, next, nepoch, elected.Round(time.Millisecond), ft.Round(time.Millisecond))
		}
		<-stopped
		fc.start(id)
		ctx, cancel := context.WithTimeout(context.Background(), fc.wait())
		err := nl.WaitAcked(ctx, leader.AckAll)
		cancel()
		if err != nil {
			fc.tb.Fatalf("%s did not catch up with %s: %v", id, next, err)
		}
		id, epoch = next, nepoch
	}
	return times
}
