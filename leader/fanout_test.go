package leader

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncewal/oncewal/replication/inprocess"

	"github.com/oncewal/oncewal/replication"

	"github.com/oncewal/oncewal/testutil"
	"github.com/oncewal/oncewal/wal"
)

// mergeListener accepts from several InProcess transports, so that every
// follower of one Fanout can have a link with its own faults.
type mergeListener struct {
	ch     chan accepted
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func newMergeListener(ls ...replication.Listener) *mergeListener {
	ctx, cancel := context.WithCancel(context.Background())
	m := &mergeListener{ch: make(chan accepted), cancel: cancel}
	for _, l := range ls {
		m.wg.Go(func() {
			for {
				c, h, err := l.Accept(ctx)
				if err != nil {
					return
				}
				select {
				case m.ch <- accepted{c, h}:
				case <-ctx.Done():
					c.Close()
					return
				}
			}
		})
	}
	return m
}

func (m *mergeListener) Accept(ctx context.Context) (replication.LeaderConn, replication.Ack, error) {
	select {
	case a := <-m.ch:
		return a.conn, a.hello, nil
	case <-ctx.Done():
		return nil, replication.Ack{}, ctx.Err()
	}
}

func (m *mergeListener) Close() {
	m.cancel()
	m.wg.Wait()
}

// logLines collects log lines (a slog text handler writes one per Write)
// for assertions.
type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, string(p))
	return len(p), nil
}

func (l *logLines) logger() *slog.Logger { return slog.New(slog.NewTextHandler(l, nil)) }

// String renders the lines (for failure messages; Write may run
// concurrently).
func (l *logLines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return fmt.Sprintf("%q", l.lines)
}

func (l *logLines) find(parts ...string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, line := range l.lines {
		ok := true
		for _, p := range parts {
			ok = ok && strings.Contains(line, p)
		}
		if ok {
			return true
		}
	}
	return false
}

// fanoutRig is one shard's Fanout shipping a memLog to fake followers, each
// over its own InProcess transport.
type fanoutRig struct {
	t      *testing.T
	log    *memLog
	trs    map[string]*inprocess.Transport
	fs     map[string]*fakeFollower
	merge  *mergeListener
	fo     *Fanout
	logs   *logLines
	ctx    context.Context
	cancel context.CancelFunc
	runErr chan error
	serve  sync.WaitGroup
}

// newFanoutRig registers ids and gives follower id the faults faults[id].
func newFanoutRig(t *testing.T, ids []string, faults map[string]inprocess.FaultOptions, seed uint64, opts func(*FanoutOptions)) *fanoutRig {
	t.Helper()
	r := &fanoutRig{t: t, log: newMemLog(2), trs: map[string]*inprocess.Transport{}, fs: map[string]*fakeFollower{}, logs: &logLines{}}
	var ls []replication.Listener
	for i, id := range ids {
		tr := inprocess.New(faults[id], seed*31+uint64(i))
		r.trs[id] = tr
		ls = append(ls, tr)
		r.fs[id] = &fakeFollower{shard: 2, epoch: 1, id: id, backoff: time.Millisecond}
	}
	r.merge = newMergeListener(ls...)
	o := FanoutOptions{ShipperOptions: testShipperOptions(r.merge, r.log), Followers: ids}
	o.Logger = r.logs.logger()
	if opts != nil {
		opts(&o)
	}
	var err error
	if r.fo, err = NewFanout(&o); err != nil {
		t.Fatal(err)
	}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	r.runErr = make(chan error, 1)
	go func() { r.runErr <- r.fo.Run(r.ctx) }()
	return r
}

// start runs follower id's serve loop.
func (r *fanoutRig) start(id string) {
	f, tr := r.fs[id], r.trs[id]
	r.serve.Go(func() {
		if err := f.serve(r.ctx, tr); err != nil {
			r.t.Errorf("follower %s: %v", id, err)
		}
	})
}

func (r *fanoutRig) waitAcked(lsn uint64, policy AckPolicy) {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(r.ctx, 30*time.Second)
	defer cancel()
	if err := r.fo.WaitAcked(ctx, lsn, policy); err != nil {
		r.t.Fatalf("WaitAcked(%d, %v): %v; %+v", lsn, policy, err, r.fo.Stats())
	}
}

func (r *fanoutRig) stats(id string) FollowerStats {
	r.t.Helper()
	for _, st := range r.fo.Stats().Followers {
		if st.ID == id {
			return st
		}
	}
	r.t.Fatalf("no stats for %q", id)
	return FollowerStats{}
}

func (r *fanoutRig) stop() {
	r.t.Helper()
	r.cancel()
	if err := <-r.runErr; err != nil {
		r.t.Fatalf("Run: %v", err)
	}
	r.serve.Wait()
	r.merge.Close()
	for _, tr := range r.trs {
		tr.Close()
	}
}

// noDisconnects is FaultsHeavy without broken connections: batches and acks
// are still dropped, duplicated, reordered and delayed.
func noDisconnects(c inprocess.FaultOptions) inprocess.FaultOptions {
	c.Disconnect = 0
	return c
}

// TestFanoutEveryFollowerGetsEveryBatch: three followers of one shard, two
// on links that break often and one on a lossy link that never breaks. Each
// applies every batch exactly once, and the one whose link never broke was
// served on exactly one connection: nobody took its stream. ONCEWAL_LONG=1
// runs 50 seeds.
func TestFanoutEveryFollowerGetsEveryBatch(t *testing.T) {
	base := runtime.NumGoroutine()
	seeds := uint64(3)
	if os.Getenv("ONCEWAL_LONG") != "" {
		seeds = 50
	}
	ids := []string{"a", "b", "c"}
	faults := map[string]inprocess.FaultOptions{"a": inprocess.FaultsHeavy, "b": noDisconnects(inprocess.FaultsHeavy), "c": inprocess.FaultsHeavy}
	for seed := uint64(1); seed <= seeds; seed++ {
		t.Run(fmt.Sprintf("seed%d", seed), func(t *testing.T) {
			r := newFanoutRig(t, ids, faults, seed, nil)
			for _, id := range ids {
				r.start(id)
			}
			for i := 0; i < 150; i++ {
				r.log.append(t, 1, 1+i%4)
			}
			r.waitAcked(r.log.lastLSN()/2, AckOne)
			for i := 0; i < 150; i++ { // appended while shipping
				r.log.append(t, 1, 2)
			}
			r.waitAcked(r.log.lastLSN(), AckAll)
			r.stop()
			for _, id := range ids {
				r.fs[id].checkExactlyOnce(t, r.log)
			}
			b := r.stats("b")
			if b.Connections != 1 || r.fs["b"].dialCount() != 1 || b.Refused.Total() != 0 {
				t.Fatalf("follower b never lost its link but was served on %d connections (%d dials): %+v",
					b.Connections, r.fs["b"].dialCount(), b)
			}
			if b.Rewinds == 0 && b.Timeouts == 0 {
				t.Fatalf("b's lossy link caused no resend: %+v", b)
			}
			for _, id := range []string{"a", "c"} {
				st := r.stats(id)
				if st.Connections < 2 || uint64(r.fs[id].dialCount()) != st.Connections {
					t.Fatalf("follower %s: %d connections, %d dials: %+v", id, st.Connections, r.fs[id].dialCount(), st)
				}
				if st.AckedLSN != r.log.lastLSN() {
					t.Fatalf("follower %s acked %d, log ends at %d", id, st.AckedLSN, r.log.lastLSN())
				}
			}
			if st := r.fo.Stats(); st.Refused.Total() != 0 || len(st.Followers) != 3 {
				t.Fatalf("stats %+v", st)
			}
		})
	}
	testutil.WaitGoroutines(t, base)
}

// TestFanoutReconnectReplacesOnlyItsStream: follower a's link breaks again
// and again while b streams; b keeps its one connection and every batch
// arrives once at both.
func TestFanoutReconnectReplacesOnlyItsStream(t *testing.T) {
	base := runtime.NumGoroutine()
	r := newFanoutRig(t, []string{"a", "b"}, nil, 1, func(o *FanoutOptions) { o.RetransmitTimeout = time.Hour })
	r.start("a")
	r.start("b")
	for round := 1; round <= 5; round++ {
		for i := 0; i < 20; i++ {
			r.log.append(t, 1, 3)
		}
		r.waitAcked(r.log.lastLSN(), AckAll)
		if n := r.trs["a"].Disconnect(); n != 1 {
			t.Fatalf("round %d: broke %d connections of a", round, n)
		}
		for r.stats("a").Connections < uint64(round+1) {
			time.Sleep(time.Millisecond)
		}
	}
	for i := 0; i < 20; i++ {
		r.log.append(t, 1, 3)
	}
	r.waitAcked(r.log.lastLSN(), AckAll)
	r.stop()
	r.fs["a"].checkExactlyOnce(t, r.log)
	r.fs["b"].checkExactlyOnce(t, r.log)
	a, b := r.stats("a"), r.stats("b")
	if a.Connections != 6 || b.Connections != 1 || b.BatchesResent != 0 || b.Rewinds != 0 {
		t.Fatalf("a %+v\nb %+v", a, b)
	}
	testutil.WaitGoroutines(t, base)
}

// TestFanoutSameIDReplacesStream: a second connection under a registered ID
// (the follower restarted before its old link was known dead) takes over
// that follower's stream; the old connection is closed.
func TestFanoutSameIDReplacesStream(t *testing.T) {
	ctx := context.Background()
	r := newFanoutRig(t, []string{"a", "b"}, nil, 1, nil)
	defer r.stop()
	r.log.append(t, 1, 1)
	old, err := r.trs["a"].Dial(ctx, replication.Ack{Shard: 2, FollowerID: "a"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := old.Recv(ctx); err != nil {
		t.Fatal(err)
	}
	b, err := r.trs["b"].Dial(ctx, replication.Ack{Shard: 2, FollowerID: "b"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Recv(ctx); err != nil {
		t.Fatal(err)
	}
	renewed, err := r.trs["a"].Dial(ctx, replication.Ack{Shard: 2, FollowerID: "a"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := renewed.Recv(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := old.Recv(ctx); !errors.Is(err, replication.ErrDisconnected) {
		t.Fatalf("a's old connection: %v", err)
	}
	// b's stream is untouched: the next batch reaches it on its connection.
	r.log.append(t, 1, 1)
	signal(r.log.notify)
	if _, err := b.Recv(ctx); err != nil {
		t.Fatal(err)
	}
	if a, bs := r.stats("a"), r.stats("b"); a.Connections != 2 || bs.Connections != 1 || !a.Connected || !bs.Connected {
		t.Fatalf("a %+v\nb %+v", a, bs)
	}
}

// TestFanoutRefusesUnknownFollowers: a hello with an unregistered or empty
// ID is refused (replication.ErrUnknownFollower: counted, logged, connection closed);
// Register serves the ID from its next connection on, Unregister ends its
// stream and refuses it again; AutoRegister registers a named follower on
// its first hello but still refuses an anonymous one.
func TestFanoutRefusesUnknownFollowers(t *testing.T) {
	ctx := context.Background()
	r := newFanoutRig(t, []string{"a"}, nil, 1, nil)
	r.log.append(t, 1, 1)
	tr := r.trs["a"]
	expectRefused := func(hello replication.Ack) {
		t.Helper()
		c, err := tr.Dial(ctx, hello)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Recv(ctx); !errors.Is(err, replication.ErrDisconnected) {
			t.Fatalf("hello %+v: %v, want the connection closed", hello, err)
		}
	}
	expectServed := func(hello replication.Ack) replication.FollowerConn {
		t.Helper()
		c, err := tr.Dial(ctx, hello)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Recv(ctx); err != nil {
			t.Fatalf("hello %+v: %v", hello, err)
		}
		return c
	}
	expectRefused(replication.Ack{Shard: 2, FollowerID: "x"})
	expectRefused(replication.Ack{Shard: 2})
	expectRefused(replication.Ack{Shard: 2, FollowerID: "bad id"}) // InProcess does not check IDs; the Fanout does
	if st := r.fo.Stats(); st.Refused.UnknownFollower != 2 || st.Refused.BadHello != 1 || len(st.Followers) != 1 {
		t.Fatalf("stats %+v", st)
	}
	if !r.logs.find("follower=x", "unknown follower") {
		t.Fatalf("no log line for the refusal: %s", r.logs)
	}

	if err := r.fo.Register("x"); err != nil {
		t.Fatal(err)
	}
	if err := r.fo.Register("x"); err != nil { // idempotent
		t.Fatal(err)
	}
	for _, bad := range []string{"", "a b", strings.Repeat("z", replication.MaxFollowerIDLen+1)} {
		if err := r.fo.Register(bad); !errors.Is(err, replication.ErrBadFollowerID) {
			t.Fatalf("Register(%q) = %v", bad, err)
		}
	}
	if got := r.fo.Followers(); !slices.Equal(got, []string{"a", "x"}) {
		t.Fatalf("Followers = %v", got)
	}
	x := expectServed(replication.Ack{Shard: 2, FollowerID: "x"})
	if err := r.fo.Unregister("x"); err != nil {
		t.Fatal(err)
	}
	if _, err := x.Recv(ctx); !errors.Is(err, replication.ErrDisconnected) {
		t.Fatalf("unregistered follower's connection: %v", err)
	}
	expectRefused(replication.Ack{Shard: 2, FollowerID: "x"})
	if err := r.fo.Unregister("x"); !errors.Is(err, replication.ErrUnknownFollower) {
		t.Fatalf("second Unregister: %v", err)
	}
	if _, err := r.fo.AckedLSN("x"); !errors.Is(err, replication.ErrUnknownFollower) {
		t.Fatalf("AckedLSN of an unregistered follower: %v", err)
	}
	if st := r.fo.Stats(); st.Refused.UnknownFollower != 3 {
		t.Fatalf("stats %+v", st)
	}
	r.stop()

	auto := newFanoutRig(t, []string{"a"}, nil, 1, func(o *FanoutOptions) { o.AutoRegister = true })
	defer auto.stop()
	auto.log.append(t, 1, 1)
	tr = auto.trs["a"]
	expectServed(replication.Ack{Shard: 2, FollowerID: "newcomer"})
	expectRefused(replication.Ack{Shard: 2})
	if got := auto.fo.Followers(); !slices.Equal(got, []string{"a", "newcomer"}) {
		t.Fatalf("Followers = %v", got)
	}
	if st := auto.fo.Stats(); st.Refused.UnknownFollower != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// TestFanoutVerifyHello: VerifyHello's verdict decides; refusals are counted
// per reason, for the follower and in total, and logged; a refused follower
// that comes back with an acceptable hello is served.
func TestFanoutVerifyHello(t *testing.T) {
	ctx := context.Background()
	errDisk := errors.New("disk on fire")
	verdicts := map[uint64]error{
		1: fmt.Errorf("%w: test", replication.ErrDiverged),
		2: fmt.Errorf("%w: test", replication.ErrBehindRetention),
		3: fmt.Errorf("%w: test", replication.ErrBadHello),
		4: fmt.Errorf("%w: test", replication.ErrUnknownFollower),
		5: errDisk,
	}
	var calls []replication.Ack
	var mu sync.Mutex
	r := newFanoutRig(t, []string{"a", "b"}, nil, 1, func(o *FanoutOptions) {
		o.VerifyHello = func(h replication.Ack) error {
			mu.Lock()
			defer mu.Unlock()
			calls = append(calls, h)
			return verdicts[h.AppliedLSN]
		}
	})
	defer r.stop()
	for i := 0; i < 8; i++ {
		r.log.append(t, 1, 1)
	}
	for lsn := uint64(1); lsn <= 5; lsn++ {
		c, err := r.trs["a"].Dial(ctx, replication.Ack{Shard: 2, FollowerID: "a", AppliedLSN: lsn, LastBatch: wal.BatchRef{Epoch: 1, CRC: 1}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Recv(ctx); !errors.Is(err, replication.ErrDisconnected) {
			t.Fatalf("verdict %v: %v", verdicts[lsn], err)
		}
	}
	// Another follower with a hello that passes is served from its position.
	c, err := r.trs["b"].Dial(ctx, replication.Ack{Shard: 2, FollowerID: "b", AppliedLSN: 6})
	if err != nil {
		t.Fatal(err)
	}
	if b, err := c.Recv(ctx); err != nil || b == nil {
		t.Fatal(err)
	}
	want := HelloRefusals{Diverged: 1, BehindRetention: 1, BadHello: 1, UnknownFollower: 1, Other: 1}
	st := r.fo.Stats()
	if st.Refused != want || r.stats("a").Refused != want || r.stats("a").BadHellos != 5 ||
		r.stats("a").Connections != 0 || r.stats("b").Connections != 1 || r.stats("b").Refused.Total() != 0 {
		t.Fatalf("stats %+v", st)
	}
	for _, reason := range []string{"diverged", "behind retention", "bad hello", "unknown follower", "disk on fire"} {
		if !r.logs.find("follower=a", reason) {
			t.Errorf("no log line for %s: %s", reason, r.logs)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(calls) != 6 || calls[0].LastBatch != (wal.BatchRef{Epoch: 1, CRC: 1}) || calls[5].FollowerID != "b" {
		t.Fatalf("VerifyHello saw %+v", calls)
	}
}

// TestFanoutHelloChecks: a wrong shard is refused as a bad hello and
// attributed to the follower; a hello of a newer epoch fences the leader
// (Run returns ErrFenced) before VerifyHello is asked.
func TestFanoutHelloChecks(t *testing.T) {
	ctx := context.Background()
	verified := 0
	r := newFanoutRig(t, []string{"a"}, nil, 1, func(o *FanoutOptions) {
		o.Epoch = func() uint64 { return 3 }
		o.VerifyHello = func(replication.Ack) error { verified++; return replication.ErrDiverged }
	})
	c, err := r.trs["a"].Dial(ctx, replication.Ack{Shard: 9, FollowerID: "a", Epoch: 3})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Recv(ctx); !errors.Is(err, replication.ErrDisconnected) {
		t.Fatalf("wrong shard: %v", err)
	}
	if a := r.stats("a"); a.Refused != (HelloRefusals{BadHello: 1}) || verified != 0 {
		t.Fatalf("stats %+v, verified %d", a, verified)
	}
	if _, err := r.trs["a"].Dial(ctx, replication.Ack{Shard: 2, FollowerID: "a", Epoch: 4}); err != nil {
		t.Fatal(err)
	}
	if err := <-r.runErr; !errors.Is(err, replication.ErrFenced) {
		t.Fatalf("Run = %v, want ErrFenced", err)
	}
	r.runErr <- nil
	r.stop()
	if verified != 0 {
		t.Fatalf("VerifyHello called %d times", verified)
	}
}

func TestNewFanoutValidates(t *testing.T) {
	m := newMemLog(0)
	_, err := NewFanout(&FanoutOptions{ShipperOptions: ShipperOptions{OpenReader: m.open, MaxInFlight: -1},
		Followers: []string{"a", "", "a", "b c"}})
	if !errors.Is(err, ErrBadOptions) {
		t.Fatalf("NewFanout = %v", err)
	}
	for _, want := range []string{"Listener", "MaxInFlight", "empty", `"a" listed twice`, `"b c"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not name %s: %v", want, err)
		}
	}
	fo, err := NewFanout(&FanoutOptions{ShipperOptions: ShipperOptions{OpenReader: m.open, Listener: inprocess.New(inprocess.FaultsNone, 1)}})
	if err != nil {
		t.Fatal(err)
	}
	if err := fo.WaitAcked(context.Background(), 0, AckOne); !errors.Is(err, ErrNoFollowers) {
		t.Fatalf("WaitAcked with no followers: %v", err)
	}
	if err := fo.WaitAcked(context.Background(), 0, 0); !errors.Is(err, ErrBadAckPolicy) {
		t.Fatalf("WaitAcked with policy 0: %v", err)
	}
}

// liveListener wraps every accepted connection in a liveConn: the leader's
// view of a transport with heartbeats, whose follower's liveness the test
// sets.
type liveListener struct {
	replication.Listener
	every time.Duration
	mu    sync.Mutex
	conns []*liveConn
}

func (l *liveListener) Accept(ctx context.Context) (replication.LeaderConn, replication.Ack, error) {
	c, h, err := l.Listener.Accept(ctx)
	if err != nil {
		return c, h, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	lc := &liveConn{LeaderConn: c, addr: fmt.Sprintf("10.0.0.%d:4000", len(l.conns)+1), every: l.every}
	lc.heard.Store(time.Now().UnixNano())
	l.conns = append(l.conns, lc)
	return lc, h, nil
}

func (l *liveListener) conn(i int) *liveConn {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.conns[i]
}

type liveConn struct {
	replication.LeaderConn
	addr       string
	every      time.Duration
	heard      atomic.Int64
	heartbeats atomic.Int64
}

func (c *liveConn) RemoteAddr() string                           { return c.addr }
func (c *liveConn) LastHeard() time.Time                         { return time.Unix(0, c.heard.Load()) }
func (c *liveConn) HeartbeatInterval() time.Duration             { return c.every }
func (c *liveConn) SendHeartbeat(hb replication.Heartbeat) error { c.heartbeats.Add(1); return nil }
func (c *liveConn) Refuse(reason error) error {
	return c.LeaderConn.(replication.RefusingConn).Refuse(reason)
}
func (c *liveConn) silent() { c.heard.Store(time.Now().Add(-time.Hour).UnixNano()) }

// TestFanoutDuplicateFollowerID: a second connection claiming the ID of a
// follower whose connection is alive (it answered within 3 heartbeat
// intervals) is refused with ErrDuplicateFollower, told why (the address
// already connected and the remedy), and the live connection keeps its
// stream: two processes with one ID no longer take it from each other in
// turn. A connection that has gone silent — a follower killed on a host
// the leader has not heard from since — is replaced at once by the next
// one (a restart is not refused), with a WARN naming both addresses, and
// is itself refused with the reason. Heartbeats go out on the connection in
// service. (Every same-ID connection used to replace the previous one,
// silently: 84 connections in 8 s.)
func TestFanoutDuplicateFollowerID(t *testing.T) {
	ctx := context.Background()
	var lis *liveListener
	r := newFanoutRig(t, []string{"a"}, nil, 1, func(o *FanoutOptions) {
		lis = &liveListener{Listener: o.Listener, every: 10 * time.Millisecond}
		o.Listener = lis
	})
	defer r.stop()
	r.log.append(t, 1, 1)
	first, err := r.trs["a"].Dial(ctx, replication.Ack{Shard: 2, FollowerID: "a"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := first.Recv(ctx); err != nil {
		t.Fatal(err)
	}

	// A second live process with the same ID: refused, told why.
	second, err := r.trs["a"].Dial(ctx, replication.Ack{Shard: 2, FollowerID: "a"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = second.Recv(ctx)
	if !errors.Is(err, replication.ErrRefused) || !errors.Is(err, replication.ErrDuplicateFollower) ||
		!strings.Contains(err.Error(), `"a" is already connected from 10.0.0.1:4000`) || !strings.Contains(err.Error(), "give each follower its own ID") {
		t.Fatalf("second connection: %v", err)
	}
	// The first keeps its stream.
	r.log.append(t, 1, 1)
	signal(r.log.notify)
	if _, err := first.Recv(ctx); err != nil {
		t.Fatalf("first connection after the duplicate: %v", err)
	}
	if st := r.stats("a"); st.Connections != 1 || st.Refused.DuplicateFollower != 1 || !st.Connected {
		t.Fatalf("%+v", st)
	}
	for lis.conn(0).heartbeats.Load() == 0 {
		time.Sleep(time.Millisecond) // the first is due at once, then every 10ms
	}

	// The first goes silent (its host died): a restart takes the stream.
	lis.conn(0).silent()
	restarted, err := r.trs["a"].Dial(ctx, replication.Ack{Shard: 2, FollowerID: "a"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := restarted.Recv(ctx); err != nil {
		t.Fatalf("restarted follower: %v", err)
	}
	if _, err := first.Recv(ctx); !errors.Is(err, replication.ErrDuplicateFollower) || !strings.Contains(err.Error(), "replaced by a newer one from 10.0.0.3:4000") {
		t.Fatalf("the replaced connection: %v", err)
	}
	if !r.logs.find("level=WARN", "replaces its previous one", "follower=a", "old_addr=10.0.0.1:4000", "new_addr=10.0.0.3:4000") {
		t.Fatalf("no WARN naming both addresses: %s", r.logs)
	}
	if st := r.stats("a"); st.Connections != 2 || !st.Connected {
		t.Fatalf("%+v", st)
	}
}
