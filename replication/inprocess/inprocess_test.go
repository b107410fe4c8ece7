package inprocess

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oncewal/oncewal/replication"

	"github.com/oncewal/oncewal/testutil"
	"github.com/oncewal/oncewal/wal"
)

func connect(t *testing.T, tr *Transport, hello replication.Ack) (replication.LeaderConn, replication.FollowerConn) {
	t.Helper()
	ctx := context.Background()
	type res struct {
		c   replication.FollowerConn
		err error
	}
	ch := make(chan res, 1)
	go func() {
		c, err := tr.Dial(ctx, hello)
		ch <- res{c, err}
	}()
	lc, got, err := tr.Accept(ctx)
	if err != nil {
		t.Fatalf("Accept: %v", err)
	}
	if got != hello {
		t.Fatalf("hello = %+v, want %+v", got, hello)
	}
	r := <-ch
	if r.err != nil {
		t.Fatalf("Dial: %v", r.err)
	}
	return lc, r.c
}

func msg(i uint64) []byte { return binary.LittleEndian.AppendUint64(nil, i) }

func TestInProcessDeliversEverythingWithoutFaults(t *testing.T) {
	base := runtime.NumGoroutine()
	tr := New(FaultsNone, 1)
	lc, fc := connect(t, tr, replication.Ack{Shard: 3, Epoch: 2, AppliedLSN: 7, FollowerID: "f1", LastBatch: wal.BatchRef{Epoch: 2, CRC: 9}})
	ctx := context.Background()
	const n = 2000

	var wg sync.WaitGroup
	var got []uint64
	var ferr error
	wg.Add(1)
	go func() { // follower: receive, ack each
		defer wg.Done()
		for len(got) < n {
			b, err := fc.Recv(ctx)
			if err != nil {
				ferr = err
				return
			}
			v := binary.LittleEndian.Uint64(b)
			got = append(got, v)
			if err := fc.Send(ctx, replication.Ack{Shard: 3, AppliedLSN: v}); err != nil {
				ferr = err
				return
			}
		}
	}()
	var acks []uint64
	var lerr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		for len(acks) < n {
			a, err := lc.Recv(ctx)
			if err != nil {
				lerr = err
				return
			}
			acks = append(acks, a.AppliedLSN)
		}
	}()
	buf := make([]byte, 8)
	for i := uint64(1); i <= n; i++ {
		binary.LittleEndian.PutUint64(buf, i)
		if err := lc.Send(ctx, buf); err != nil {
			t.Fatal(err)
		}
		// Send must not retain buf: scribbling on it cannot change what arrives.
		binary.LittleEndian.PutUint64(buf, math.MaxUint64)
	}
	wg.Wait()
	if ferr != nil || lerr != nil {
		t.Fatal(ferr, lerr)
	}
	for i, v := range got {
		if v != uint64(i+1) || acks[i] != uint64(i+1) {
			t.Fatalf("position %d: batch %d ack %d", i, v, acks[i])
		}
	}
	st := tr.Stats()
	want := Stats{Dials: 1, Accepts: 1, BatchesSent: n, BatchesDelivered: n, AcksSent: n, AcksDelivered: n}
	if st != want {
		t.Fatalf("stats = %+v, want %+v", st, want)
	}
	tr.Close()
	testutil.WaitGoroutines(t, base)
}

func TestFaultPlanDeterministic(t *testing.T) {
	plan := func(seed uint64, interleaveAcks bool) []string {
		p := newFaultPlan(FaultsHeavy, seed)
		var out []string
		for i := 0; i < 5000; i++ {
			out = append(out, fmt.Sprintf("%+v", p.NextBatch()))
			if interleaveAcks && i%3 == 0 {
				p.NextAck()
			}
		}
		return out
	}
	a, b := plan(42, false), plan(42, true)
	if !slices.Equal(a, b) {
		t.Fatal("same seed gave different batch decisions (ack draws must not shift the batch stream)")
	}
	if slices.Equal(a, plan(43, false)) {
		t.Fatal("different seeds gave identical decisions")
	}

	// Frequencies follow the configured probabilities.
	p := newFaultPlan(FaultsHeavy, 7)
	const n = 100_000
	var disc, drop, dup, hold, delay int
	for i := 0; i < n; i++ {
		f := p.NextBatch()
		if f.Disconnect {
			disc++
		}
		if f.Drop {
			drop++
		}
		if f.Duplicate {
			dup++
		}
		if f.Hold > 0 {
			hold++
			if f.Hold > FaultsHeavy.ReorderWindow {
				t.Fatalf("hold %d beyond window", f.Hold)
			}
		}
		if f.Delay > 0 {
			delay++
			if f.Delay > FaultsHeavy.MaxDelay {
				t.Fatalf("delay %v beyond MaxDelay", f.Delay)
			}
		}
	}
	near := func(name string, got int, want float64) {
		if g := float64(got) / n; math.Abs(g-want) > 0.01 {
			t.Errorf("%s frequency %.4f, want ≈ %.4f", name, g, want)
		}
	}
	h := FaultsHeavy
	live := (1 - h.Disconnect) * (1 - h.DropBatch)
	near("disconnect", disc, h.Disconnect)
	near("drop", drop, (1-h.Disconnect)*h.DropBatch)
	near("duplicate", dup, live*h.DuplicateBatch)
	near("hold", hold, live*h.ReorderBatch)
	near("delay", delay, live*(1-h.ReorderBatch)*h.DelayBatch)

	none := newFaultPlan(FaultsNone, 7)
	for i := 0; i < 1000; i++ {
		if f, a := none.NextBatch(), none.NextAck(); f != (batchFault{}) || a != (ackFault{}) {
			t.Fatalf("FaultsNone decided %+v %+v", f, a)
		}
	}
}

// pendingBatches and pendingAcks peek at a connection's queue, so a single
// goroutine can drive both ends without blocking.
func pendingBatches(t *Transport, c replication.FollowerConn) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(c.(*followerEnd).p.toF.items)
}

func pendingAcks(t *Transport, c replication.LeaderConn) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(c.(*leaderEnd).p.toL.items)
}

// syncRun drives leader and follower from one goroutine: send a batch,
// deliver whatever is queued, ack it, read the acks, reconnect on a
// disconnect. With no delay faults the whole run is a function of the seed.
func syncRun(t *testing.T, faults FaultOptions, seed uint64, n uint64) ([]string, Stats) {
	t.Helper()
	tr := New(faults, seed)
	defer tr.Close()
	ctx := context.Background()
	var trace []string
	applied := uint64(0)
	lc, fc := connect(t, tr, replication.Ack{AppliedLSN: applied})
	reconnect := func(why string) {
		trace = append(trace, "disconnect:"+why)
		for _, err := range []error{lc.Send(ctx, msg(0)), fc.Send(ctx, replication.Ack{})} {
			if !errors.Is(err, replication.ErrDisconnected) {
				t.Fatalf("after disconnect: %v, want ErrDisconnected", err)
			}
		}
		lc.Close()
		fc.Close()
		lc, fc = connect(t, tr, replication.Ack{AppliedLSN: applied})
	}
	for i := uint64(1); i <= n; i++ {
		if err := lc.Send(ctx, msg(i)); err != nil {
			if !errors.Is(err, replication.ErrDisconnected) {
				t.Fatal(err)
			}
			reconnect(fmt.Sprint("batch ", i))
			continue
		}
		for pendingBatches(tr, fc) > 0 {
			b, err := fc.Recv(ctx)
			if err != nil {
				t.Fatal(err)
			}
			v := binary.LittleEndian.Uint64(b)
			trace = append(trace, fmt.Sprint("deliver ", v))
			if v == applied+1 {
				applied = v
			}
			if err := fc.Send(ctx, replication.Ack{AppliedLSN: applied}); err != nil {
				if !errors.Is(err, replication.ErrDisconnected) {
					t.Fatal(err)
				}
				reconnect(fmt.Sprint("ack ", applied))
				break
			}
		}
		for pendingAcks(tr, lc) > 0 {
			a, err := lc.Recv(ctx)
			if err != nil {
				t.Fatal(err)
			}
			trace = append(trace, fmt.Sprint("ack ", a.AppliedLSN))
		}
	}
	return trace, tr.Stats()
}

func TestInProcessSameSeedSameRun(t *testing.T) {
	faults := FaultsHeavy
	faults.DelayBatch, faults.DelayAck = 0, 0 // timers would make arrival order timing-dependent
	t1, s1 := syncRun(t, faults, 99, 3000)
	t2, s2 := syncRun(t, faults, 99, 3000)
	if !slices.Equal(t1, t2) || s1 != s2 {
		t.Fatalf("same seed, different runs:\n%+v\n%+v", s1, s2)
	}
	t3, _ := syncRun(t, faults, 100, 3000)
	if slices.Equal(t1, t3) {
		t.Fatal("different seeds, same run")
	}
	// Every kind of fault happened and the counters add up.
	if s1.BatchesDropped == 0 || s1.BatchesDuplicated == 0 || s1.BatchesReordered == 0 ||
		s1.AcksDropped == 0 || s1.Disconnects == 0 {
		t.Fatalf("missing fault kinds: %+v", s1)
	}
	if s1.Dials != s1.Disconnects+1 || s1.Accepts != s1.Dials {
		t.Fatalf("dials %d, accepts %d, disconnects %d", s1.Dials, s1.Accepts, s1.Disconnects)
	}
	if s1.BatchesDelivered > s1.BatchesSent+s1.BatchesDuplicated || s1.BatchesDelivered < s1.BatchesSent-s1.BatchesDropped-s1.Lost-s1.Disconnects {
		t.Fatalf("delivery accounting off: %+v", s1)
	}
	reordered := false
	last := uint64(0)
	for _, e := range t1 {
		var v uint64
		if _, err := fmt.Sscanf(e, "deliver %d", &v); err == nil {
			if v < last {
				reordered = true
			}
			last = v
		}
	}
	if !reordered {
		t.Fatal("heavy faults never reordered a delivery")
	}
}

func TestInProcessDisconnectReconnect(t *testing.T) {
	base := runtime.NumGoroutine()
	tr := New(FaultsNone, 1)
	defer tr.Close()
	ctx := context.Background()
	lc, fc := connect(t, tr, replication.Ack{AppliedLSN: 0})

	// A blocked Recv on either end wakes up with ErrDisconnected.
	errs := make(chan error, 2)
	go func() { _, err := fc.Recv(ctx); errs <- err }()
	go func() { _, err := lc.Recv(ctx); errs <- err }()
	if err := lc.Send(ctx, msg(1)); err != nil {
		t.Fatal(err)
	}
	if err := <-errs; err != nil {
		t.Fatalf("follower recv: %v", err) // batch 1 arrives first
	}
	go func() { _, err := fc.Recv(ctx); errs <- err }()
	for tr.Disconnect() != 1 {
		t.Fatal("Disconnect broke no connection")
	}
	for i := 0; i < 2; i++ {
		if err := <-errs; !errors.Is(err, replication.ErrDisconnected) {
			t.Fatalf("blocked recv: %v, want ErrDisconnected", err)
		}
	}
	if err := lc.Send(ctx, msg(2)); !errors.Is(err, replication.ErrDisconnected) {
		t.Fatalf("leader send: %v", err)
	}
	if err := fc.Send(ctx, replication.Ack{}); !errors.Is(err, replication.ErrDisconnected) {
		t.Fatalf("follower send: %v", err)
	}
	// Close after a disconnect reports ErrClosed to the closing side only.
	fc.Close()
	if _, err := fc.Recv(ctx); !errors.Is(err, replication.ErrClosed) {
		t.Fatalf("recv after own close: %v", err)
	}
	if _, err := lc.Recv(ctx); !errors.Is(err, replication.ErrDisconnected) {
		t.Fatalf("peer after close: %v", err)
	}
	lc.Close()

	// Reconnect with a new hello; the new connection works.
	lc, fc = connect(t, tr, replication.Ack{AppliedLSN: 1, Epoch: 5})
	if err := lc.Send(ctx, msg(2)); err != nil {
		t.Fatal(err)
	}
	if b, err := fc.Recv(ctx); err != nil || binary.LittleEndian.Uint64(b) != 2 {
		t.Fatalf("after reconnect: %v %v", b, err)
	}
	// Closing one end: the peer sees ErrDisconnected, this end ErrClosed.
	lc.Close()
	if _, err := fc.Recv(ctx); !errors.Is(err, replication.ErrDisconnected) {
		t.Fatalf("follower after leader close: %v", err)
	}
	if err := lc.Send(ctx, msg(3)); !errors.Is(err, replication.ErrClosed) {
		t.Fatalf("leader after own close: %v", err)
	}
	if st := tr.Stats(); st.Dials != 2 || st.Accepts != 2 || st.Disconnects != 1 {
		t.Fatalf("stats %+v", st)
	}
	tr.Close()
	testutil.WaitGoroutines(t, base)
}

func TestInProcessInjectedDisconnect(t *testing.T) {
	tr := New(FaultOptions{Disconnect: 1}, 1)
	defer tr.Close()
	ctx := context.Background()
	lc, fc := connect(t, tr, replication.Ack{})
	if err := lc.Send(ctx, msg(1)); !errors.Is(err, replication.ErrDisconnected) {
		t.Fatalf("send: %v", err)
	}
	if _, err := fc.Recv(ctx); !errors.Is(err, replication.ErrDisconnected) {
		t.Fatalf("recv: %v", err)
	}
	if st := tr.Stats(); st.Disconnects != 1 || st.BatchesSent != 1 || st.BatchesDelivered != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestInProcessCloseAndCancelNeverHang(t *testing.T) {
	base := runtime.NumGoroutine()
	tr := New(FaultOptions{QueueSize: 1, DelayBatch: 1, MaxDelay: time.Hour}, 1)
	ctx := context.Background()

	// Cancelling ctx unblocks each call and leaves the connection usable.
	lc, fc := connect(t, tr, replication.Ack{})
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 4)
	go func() { _, _, err := tr.Accept(cctx); done <- err }()
	go func() { _, err := fc.Recv(cctx); done <- err }()
	go func() { _, err := lc.Recv(cctx); done <- err }()
	cancel()
	for i := 0; i < 3; i++ {
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("after cancel: %v", err)
		}
	}
	if _, err := tr.Dial(cctx, replication.Ack{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("dial with cancelled ctx: %v", err)
	}
	if err := fc.Send(ctx, replication.Ack{AppliedLSN: 9}); err != nil { // fills the ack queue (size 1)
		t.Fatal(err)
	}
	if a, err := lc.Recv(ctx); err != nil || a.AppliedLSN != 9 {
		t.Fatalf("connection unusable after cancel: %v %v", a, err)
	}

	// Every batch is delayed by up to an hour: they wait as timers.
	for i := 0; i < 5; i++ {
		if err := lc.Send(ctx, msg(uint64(i))); err != nil {
			t.Fatal(err)
		}
	}
	// Calls blocked in every way, then Close: all return ErrClosed (also
	// those that only start after Close).
	if err := fc.Send(ctx, replication.Ack{}); err != nil {
		t.Fatal(err)
	}
	go func() { done <- fc.Send(ctx, replication.Ack{}) }()  // ack queue full
	go func() { _, err := fc.Recv(ctx); done <- err }()      // batches all delayed
	go func() { _, _, err := tr.Accept(ctx); done <- err }() // nobody dials
	tr2 := New(FaultsNone, 1)                                // nobody accepts
	go func() { _, err := tr2.Dial(ctx, replication.Ack{}); done <- err }()
	tr.Close()
	tr2.Close()
	for i := 0; i < 4; i++ {
		if err := <-done; !errors.Is(err, replication.ErrClosed) {
			t.Fatalf("after Close: %v", err)
		}
	}
	if _, err := tr.Dial(ctx, replication.Ack{}); !errors.Is(err, replication.ErrClosed) {
		t.Fatalf("dial after close: %v", err)
	}
	if _, _, err := tr.Accept(ctx); !errors.Is(err, replication.ErrClosed) {
		t.Fatalf("accept after close: %v", err)
	}
	if err := lc.Send(ctx, msg(1)); !errors.Is(err, replication.ErrClosed) {
		t.Fatalf("send after close: %v", err)
	}
	if st := tr.Stats(); st.Lost != 6 { // 5 delayed batches + 1 queued ack
		t.Fatalf("lost = %d, want 6: %+v", st.Lost, st)
	}
	tr.Close() // idempotent
	testutil.WaitGoroutines(t, base)
}

func TestInProcessDelayAndReorderDeliverEverything(t *testing.T) {
	base := runtime.NumGoroutine()
	tr := New(FaultOptions{DelayBatch: 0.3, ReorderBatch: 0.3, DuplicateBatch: 0.1, MaxDelay: time.Millisecond}, 5)
	lc, fc := connect(t, tr, replication.Ack{})
	ctx := context.Background()
	const n = 500
	var order []uint64
	seen := map[uint64]int{}
	all := make(chan error, 1)
	go func() {
		for len(seen) < n {
			b, err := fc.Recv(ctx)
			if err != nil {
				all <- err
				return
			}
			if v := binary.LittleEndian.Uint64(b); v != 0 {
				seen[v]++
				order = append(order, v)
			}
		}
		all <- nil
	}()
	for i := uint64(1); i <= n; i++ {
		if err := lc.Send(ctx, msg(i)); err != nil {
			t.Fatal(err)
		}
	}
	// A held batch is released after at most ReorderWindow (4) later sends.
	for i := 0; i < 4; i++ {
		if err := lc.Send(ctx, msg(0)); err != nil {
			t.Fatal(err)
		}
	}
	if err := <-all; err != nil {
		t.Fatal(err)
	}
	dups := 0
	for _, c := range seen {
		dups += c - 1
	}
	st := tr.Stats()
	if st.BatchesDelayed == 0 || st.BatchesReordered == 0 || dups == 0 || slices.IsSorted(order) {
		t.Fatalf("faults did not show: %+v, dups %d", st, dups)
	}
	tr.Close()
	testutil.WaitGoroutines(t, base)
}

func TestFaultConfigValidate(t *testing.T) {
	if err := FaultsHeavy.Validate(); err != nil {
		t.Fatal(err)
	}
	bad := FaultOptions{DropBatch: -0.1, DuplicateBatch: math.NaN(), Disconnect: 2, QueueSize: -1, MaxDelay: -1, ReorderWindow: -3}
	err := bad.Validate()
	if !errors.Is(err, ErrBadOptions) {
		t.Fatalf("Validate = %v", err)
	}
	for _, f := range []string{"DropBatch", "DuplicateBatch", "Disconnect", "QueueSize", "MaxDelay", "ReorderWindow"} {
		if !strings.Contains(err.Error(), f) {
			t.Errorf("error does not name %s: %v", f, err)
		}
	}
	bad.EnsureDefaults()
	if err := bad.Validate(); err != nil {
		t.Fatalf("after EnsureDefaults: %v", err)
	}
	if bad.DropBatch != 0 || bad.DuplicateBatch != 0 || bad.Disconnect != 1 || bad.QueueSize != 64 {
		t.Fatalf("clamped %+v", bad)
	}
}
