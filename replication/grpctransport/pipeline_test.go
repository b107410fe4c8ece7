package grpctransport

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/oncewal/oncewal/internal/drill"
	"github.com/oncewal/oncewal/store"
	"github.com/oncewal/oncewal/testutil"

	"github.com/oncewal/oncewal/leader"

	"github.com/oncewal/oncewal/follower"
	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/sim"
	"github.com/oncewal/oncewal/wal"
)

func long() bool { return os.Getenv("ONCEWAL_LONG") == "1" }

// proxied returns a PipelineConfig.Transport: a mutual-TLS server on
// 127.0.0.1, the fault proxy in front of it, and a Dialer aimed at the proxy.
// recorded is a client workload as a leader logged it (sim.Record), on one
// shard: the log these tests replay through a raw WAL writer.
func recorded(t testing.TB, cfg sim.WorkloadOptions) *sim.Log {
	t.Helper()
	log, err := sim.Record(sim.GenerateWorkload(cfg), 1)
	if err != nil {
		t.Fatal(err)
	}
	return log
}

func proxied(t testing.TB, seed uint64, f testutil.ProxyFaults, px **testutil.FaultProxy) func() (replication.Listener, replication.Dialer, func() error, error) {
	return func() (replication.Listener, replication.Dialer, func() error, error) {
		c := certs(t)
		st, err := serverTLS(c)
		if err != nil {
			return nil, nil, nil, err
		}
		ct, err := clientTLS(c)
		if err != nil {
			return nil, nil, nil, err
		}
		srv, err := Listen("127.0.0.1:0", &ServerOptions{TLS: st, Logger: quietLogger()})
		if err != nil {
			return nil, nil, nil, err
		}
		p := testutil.NewFaultProxy(t, srv.Addr().String(), seed, f)
		if px != nil {
			*px = p
		}
		d, err := NewDialer(p.Addr(), &DialerOptions{TLS: ct, Logger: quietLogger()})
		if err != nil {
			p.Close()
			srv.Close()
			return nil, nil, nil, err
		}
		return srv, d, func() error { d.Close(); p.Close(); return srv.Close() }, nil
	}
}

var proxyPresets = map[string]testutil.ProxyFaults{
	"clean": {},
	"light": {Reset: 0.002, Drop: 0.002, Stall: 0.01, MaxStall: 10 * time.Millisecond, Refuse: 0.05},
	"heavy": {Reset: 0.01, Drop: 0.01, Stall: 0.03, MaxStall: 30 * time.Millisecond, Refuse: 0.2},
}

// TestExactlyOnceOverGRPC is the exactly-once invariant of the replication
// issue over this transport: leader WAL → Shipper → gRPC/mTLS → fault proxy
// (resets, drops, stalls, refused connections) → follower with clean
// restarts and kills, verified against the oracle.
func TestExactlyOnceOverGRPC(t *testing.T) {
	checkGoroutines(t)
	seeds := 6
	events := 2000
	if long() {
		seeds, events = 50, 20_000
	}
	for _, preset := range []string{"clean", "light", "heavy"} {
		for seed := uint64(1); seed <= uint64(seeds); seed++ {
			t.Run(fmt.Sprintf("%s/seed=%d", preset, seed), func(t *testing.T) {
				var px *testutil.FaultProxy
				transport := proxied(t, seed, proxyPresets[preset], &px)
				res, err := sim.Run(context.Background(), sim.Options{
					Dir:  t.TempDir(),
					Seed: seed,
					Workload: sim.WorkloadOptions{
						Sessions: 16, Requests: events, RetryRate: 0.05, CloseRate: 0.01, LateRate: 0.01, BatchSize: 64,
					},
					Restarts:  3,
					Follower:  follower.Options{Store: store.Options{Logger: quietLogger(), NoSync: true}},
					Transport: func(uint32) (replication.Listener, replication.Dialer, func() error, error) { return transport() },
					Timeout:   90 * time.Second,
				})
				if err != nil {
					t.Fatalf("seed %d: %v", seed, err)
				}
				if !res.Verified {
					t.Fatalf("seed %d (replay: preset %s): %v", seed, preset, res.VerifyErr)
				}
				fs := res.Followers[0].Shards[0]
				if fs.Receiver.Applied == 0 {
					t.Fatal("nothing applied")
				}
				st := px.Stats()
				t.Logf("appends %d, shipped %d (resent %d), connections %d; proxy: conns %d, resets %d, drops %d, stalls %d, refused %d; %v",
					res.Appends, fs.Shipper.BatchesSent, fs.Shipper.BatchesResent, fs.Shipper.Connections,
					st.Accepted, st.Resets, st.Drops, st.Stalls, st.Refused, res.Elapsed)
			})
		}
	}
}

// leaderProc is one incarnation of a leader process: a WAL writer, a gRPC
// server on a fixed address and a Shipper.
type leaderProc struct {
	w      *wal.Writer
	srv    *Server
	ship   *leader.Shipper
	cancel context.CancelFunc
	done   chan error
}

func startLeader(t testing.TB, walDir, addr string, notify chan struct{}) *leaderProc {
	t.Helper()
	w, err := wal.OpenWriter(walDir, &wal.WriterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	st, err := serverTLS(certs(t))
	if err != nil {
		t.Fatal(err)
	}
	var srv *Server
	// The old incarnation's port is free once its Close returned; retry
	// briefly in case the kernel is slow to release it.
	for i := 0; ; i++ {
		srv, err = Listen(addr, &ServerOptions{TLS: st, Logger: quietLogger()})
		if err == nil || i == 100 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	ship, err := leader.NewShipper(&leader.ShipperOptions{
		WALDir: walDir, Listener: srv, Notify: notify, DurableLSN: w.DurableLSN,
		Epoch:             func() uint64 { return 1 },
		RetransmitTimeout: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond, PollInterval: time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	l := &leaderProc{w: w, srv: srv, ship: ship, cancel: cancel, done: make(chan error, 1)}
	go func() { l.done <- ship.Run(ctx) }()
	return l
}

func (l *leaderProc) stop(t testing.TB) {
	t.Helper()
	l.cancel()
	if err := <-l.done; err != nil {
		t.Errorf("shipper: %v", err)
	}
	l.srv.Close()
	if err := l.w.Close(); err != nil {
		t.Error(err)
	}
}

// TestLeaderAndFollowerRestarts restarts the leader process (WAL writer,
// server, shipper) on the same WAL directory and address while a follower
// replicates through the fault proxy; the follower is killed and reopened
// too. It reconnects each time and resumes from its durable position.
func TestLeaderAndFollowerRestarts(t *testing.T) {
	checkGoroutines(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	dir := t.TempDir()
	walDir := filepath.Join(dir, "leader")
	wl := recorded(t, sim.WorkloadOptions{
		Seed: 7, Sessions: 16, Requests: 3000, RetryRate: 0.05, CloseRate: 0.01, BatchSize: 64,
	})
	batches := wl.Shards[0]
	// Reserve a loopback port for the leader's fixed address.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()

	notify := make(chan struct{}, 1)
	leader := startLeader(t, walDir, addr, notify)
	px := testutil.NewFaultProxy(t, addr, 7, proxyPresets["light"])
	defer px.Close()
	ct, err := clientTLS(certs(t))
	if err != nil {
		t.Fatal(err)
	}
	d, err := NewDialer(px.Addr(), &DialerOptions{TLS: ct, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()

	var mu sync.Mutex
	var f *follower.Follower
	var total store.ReceiverStats
	var serveWG sync.WaitGroup
	fdir := filepath.Join(dir, "follower")
	startFollower := func() {
		nf, err := follower.Open(fdir, &follower.Options{Store: store.Options{Logger: quietLogger()}})
		if err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		f = nf
		mu.Unlock()
		serveWG.Add(1)
		go func() {
			defer serveWG.Done()
			// ErrClosed: stopFollower closed the follower before this
			// goroutine entered Serve (the follower's durable position
			// can satisfy the next wait at once, so the stop may come
			// that soon): a Serve after Close refuses to start.
			if err := nf.Serve(ctx, d); err != nil && !errors.Is(err, follower.ErrClosed) {
				t.Errorf("serve: %v", err)
			}
		}()
	}
	stopFollower := func(kill bool) {
		mu.Lock()
		cur := f
		mu.Unlock()
		var err error
		if kill {
			err = drill.Kill(cur)
		} else {
			err = cur.Close()
		}
		if err != nil {
			t.Fatal(err)
		}
		serveWG.Wait()
		// Counted once Serve stopped, so no batch lands after the snapshot.
		total = total.Add(cur.Stats().Receiver)
	}
	position := func() uint64 {
		mu.Lock()
		defer mu.Unlock()
		p, _ := f.Position()
		return p
	}
	appendBatches := func(w *wal.Writer, batches [][]wal.Event) uint64 {
		var last uint64
		for _, evs := range batches {
			h, err := w.Append(1, evs)
			if err != nil {
				t.Fatal(err)
			}
			last = h.LastLSN()
			select {
			case notify <- struct{}{}:
			default:
			}
		}
		return last
	}

	startFollower()
	half := len(batches) / 2
	mid := appendBatches(leader.w, batches[:half])
	waitFor(t, ctx, "follower to get a third of the first half", func() bool { return position() >= mid/3 })

	// Leader restart #1, mid-stream, with the follower connected.
	leader.stop(t)
	leader = startLeader(t, walDir, addr, notify)
	waitFor(t, ctx, "follower to catch up after leader restart", func() bool { return position() >= mid })

	// Follower killed while the leader is down; both come back.
	leader.stop(t)
	stopFollower(true)
	leader = startLeader(t, walDir, addr, notify)
	startFollower()
	last := appendBatches(leader.w, batches[half:])
	waitFor(t, ctx, "follower to pass 3/4", func() bool { return position() >= mid+(last-mid)/2 })

	// Leader restart #3 while the follower restarts cleanly.
	leader.stop(t)
	stopFollower(false)
	startFollower()
	leader = startLeader(t, walDir, addr, notify)
	waitFor(t, ctx, "follower to apply everything", func() bool { return position() >= last })

	stats := f.Stats().Receiver
	if err := wl.Oracle.Verify(f.State()); err != nil {
		t.Fatalf("state differs from the oracle: %v", err)
	}
	stopFollower(false)
	leader.stop(t)
	if total.Events != total.Accounted() {
		t.Fatalf("counters: %d delivered, %d accounted", total.Events, total.Accounted())
	}
	st := px.Stats()
	t.Logf("applied %d of %d delivered events; proxy conns %d, resets %d, drops %d, stalls %d; last follower incarnation: %+v",
		total.Applied, total.Events, st.Accepted, st.Resets, st.Drops, st.Stalls, stats)
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Fatal("timed out")
	}
}
