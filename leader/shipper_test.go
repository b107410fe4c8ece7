package leader

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncewal/oncewal/replication/inprocess"

	"github.com/oncewal/oncewal/replication"

	"github.com/oncewal/oncewal/internal/ctxtime"
	"github.com/oncewal/oncewal/testutil"

	"github.com/oncewal/oncewal/wal"
)

// memLog is an in-memory WAL of encoded batches that grows while a Shipper
// tails it; memReader follows the wal.Reader contract (Seek to the batch
// containing lsn or the first after it; io.EOF at the end, then more later).
type memLog struct {
	opens     atomic.Int64  // readers opened
	compacted atomic.Uint64 // Seek below this LSN fails as retention would
	mu        sync.Mutex
	shard     uint32
	batches   [][]byte
	heads     []wal.Header
	next      uint64
	notify    chan struct{}
}

func newMemLog(shard uint32) *memLog {
	return &memLog{shard: shard, next: 1, notify: make(chan struct{}, 1)}
}

// append adds a batch of n events and returns its last LSN.
func (m *memLog) append(t testing.TB, epoch uint64, n int) uint64 {
	h, _ := m.appendBatch(t, epoch, n)
	return h.LastLSN()
}

// appendBatch adds a batch of n events and returns it.
func (m *memLog) appendBatch(t testing.TB, epoch uint64, n int) (wal.Header, []byte) {
	evs := make([]wal.Event, n)
	for i := range evs {
		evs[i] = wal.Event{Op: wal.OpPut, Seq: 1, Key: []byte("k"), Value: []byte(fmt.Sprint(i))}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	b, err := wal.AppendBatch(nil, m.shard, epoch, m.next, evs)
	if err != nil {
		t.Fatal(err)
	}
	h, err := wal.DecodeHeader(b)
	if err != nil {
		t.Fatal(err)
	}
	m.batches = append(m.batches, b)
	m.heads = append(m.heads, h)
	m.next = h.LastLSN() + 1
	signal(m.notify)
	return h, b
}

func (m *memLog) lastLSN() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.next - 1
}

type memReader struct {
	m   *memLog
	idx int
}

func (m *memLog) open() (LogReader, error) {
	m.opens.Add(1)
	return &memReader{m: m}, nil
}

func (r *memReader) Seek(lsn uint64) error {
	if c := r.m.compacted.Load(); lsn < c {
		return fmt.Errorf("%w: LSN %d deleted (log starts at %d)", replication.ErrBehindRetention, lsn, c)
	}
	r.m.mu.Lock()
	defer r.m.mu.Unlock()
	r.idx = sort.Search(len(r.m.heads), func(i int) bool { return r.m.heads[i].LastLSN() >= lsn })
	return nil
}

func (r *memReader) Next() (wal.Header, []byte, error) {
	r.m.mu.Lock()
	defer r.m.mu.Unlock()
	if r.idx >= len(r.m.batches) {
		return wal.Header{}, nil, io.EOF
	}
	r.idx++
	return r.m.heads[r.idx-1], r.m.batches[r.idx-1], nil
}

func (r *memReader) Close() error { return nil }

// fakeFollower applies a batch only if it starts right after its position,
// acks duplicates, refuses the rest: the position gate of the Receiver.
type fakeFollower struct {
	shard   uint32
	epoch   uint64
	id      string
	backoff time.Duration // pause before redialling after a disconnect

	mu      sync.Mutex
	applied uint64
	history []uint64 // FirstLSN of every batch applied, in order
	dials   int
}

func (f *fakeFollower) position() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.applied
}

// crash forgets the batches applied after lsn (which must be a batch
// boundary), as a follower that lost unsynced data would.
func (f *fakeFollower) crash(lsn uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for len(f.history) > 0 && f.history[len(f.history)-1] > lsn {
		f.history = f.history[:len(f.history)-1]
	}
	f.applied = lsn
}

// serve dials and serves until ctx ends or the transport closes.
func (f *fakeFollower) serve(ctx context.Context, d replication.Dialer) error {
	for {
		f.mu.Lock()
		hello := replication.Ack{Shard: f.shard, Epoch: f.epoch, AppliedLSN: f.applied, FollowerID: f.id}
		f.dials++
		f.mu.Unlock()
		c, err := d.Dial(ctx, hello)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, replication.ErrClosed) {
				return nil
			}
			return err
		}
		err = f.session(ctx, c)
		c.Close()
		if ctx.Err() != nil || errors.Is(err, replication.ErrClosed) {
			return nil
		}
		if !errors.Is(err, replication.ErrDisconnected) {
			return err
		}
		if f.backoff > 0 && ctxtime.Sleep(ctx, f.backoff) != nil {
			return nil
		}
	}
}

func (f *fakeFollower) dialCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.dials
}

func (f *fakeFollower) session(ctx context.Context, c replication.FollowerConn) error {
	for {
		b, err := c.Recv(ctx)
		if err != nil {
			return err
		}
		h, err := wal.DecodeHeader(b)
		if err != nil {
			return err
		}
		f.mu.Lock()
		switch {
		case h.FirstLSN == f.applied+1:
			f.applied = h.LastLSN()
			f.history = append(f.history, h.FirstLSN)
		case h.LastLSN() <= f.applied:
		default:
			f.mu.Unlock()
			if err := c.Send(ctx, replication.Ack{Shard: f.shard, Epoch: f.epoch, AppliedLSN: f.position(), Refused: true}); err != nil {
				return err
			}
			continue
		}
		ack := replication.Ack{Shard: f.shard, Epoch: f.epoch, AppliedLSN: f.applied}
		f.mu.Unlock()
		if err := c.Send(ctx, ack); err != nil {
			return err
		}
	}
}

// checkExactlyOnce: the follower applied every batch of the log once, in order.
func (f *fakeFollower) checkExactlyOnce(t *testing.T, m *memLog) {
	t.Helper()
	m.mu.Lock()
	heads := slices.Clone(m.heads)
	m.mu.Unlock()
	f.checkHistory(t, heads)
}

func (f *fakeFollower) checkHistory(t *testing.T, heads []wal.Header) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.history) != len(heads) {
		t.Fatalf("follower applied %d batches, log has %d", len(f.history), len(heads))
	}
	for i, h := range heads {
		if f.history[i] != h.FirstLSN {
			t.Fatalf("batch %d: applied FirstLSN %d, want %d", i, f.history[i], h.FirstLSN)
		}
	}
}

func testShipperOptions(tr replication.Listener, m *memLog) ShipperOptions {
	return ShipperOptions{
		Shard:             m.shard,
		Listener:          tr,
		OpenReader:        m.open,
		MaxInFlight:       8,
		RetransmitTimeout: 5 * time.Millisecond,
		MaxBackoff:        40 * time.Millisecond,
		PollInterval:      time.Millisecond,
		Notify:            m.notify,
	}
}

type harness struct {
	t        *testing.T
	tr       *inprocess.Transport
	log      *memLog
	f        *fakeFollower
	s        *Shipper
	cancel   context.CancelFunc
	runErr   chan error
	serveErr chan error
}

func startHarness(t *testing.T, faults inprocess.FaultOptions, seed uint64, opts func(*ShipperOptions)) *harness {
	t.Helper()
	h := &harness{t: t, tr: inprocess.New(faults, seed), log: newMemLog(2)}
	h.f = &fakeFollower{shard: 2, epoch: 1}
	o := testShipperOptions(h.tr, h.log)
	if opts != nil {
		opts(&o)
	}
	var err error
	if h.s, err = NewShipper(&o); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	h.runErr, h.serveErr = make(chan error, 1), make(chan error, 1)
	go func() { h.runErr <- h.s.Run(ctx) }()
	go func() { h.serveErr <- h.f.serve(ctx, h.tr) }()
	return h
}

func (h *harness) waitAcked(lsn uint64) {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := h.s.WaitAcked(ctx, lsn); err != nil {
		h.t.Fatalf("WaitAcked(%d): %v; shipper %+v; transport %+v; follower at %d",
			lsn, err, h.s.Stats(), h.tr.Stats(), h.f.position())
	}
}

func (h *harness) stop() {
	h.t.Helper()
	h.cancel()
	if err := <-h.runErr; err != nil {
		h.t.Fatalf("Run: %v", err)
	}
	if err := <-h.serveErr; err != nil {
		h.t.Fatalf("follower: %v", err)
	}
	h.tr.Close()
}

// noTimeouts: without faults nothing is lost, so a retransmit could only be a
// scheduling hiccup; exact counters need it off.
func noTimeouts(o *ShipperOptions) { o.RetransmitTimeout = time.Hour }

func TestShipperNoFaultsSendsEachBatchOnce(t *testing.T) {
	base := runtime.NumGoroutine()
	h := startHarness(t, inprocess.FaultsNone, 1, noTimeouts)
	for i := 0; i < 200; i++ {
		h.log.append(t, 1, 1+i%5)
	}
	h.waitAcked(h.log.lastLSN())
	// The live tail: batches appended after the shipper caught up.
	for i := 0; i < 50; i++ {
		h.log.append(t, 1, 3)
	}
	h.waitAcked(h.log.lastLSN())
	h.stop()
	h.f.checkExactlyOnce(t, h.log)
	st := h.s.Stats()
	if st.BatchesSent != 250 || st.BatchesResent != 0 || st.Rewinds != 0 || st.Refusals != 0 ||
		st.Acks != 250 || st.Connections != 1 || st.AckedLSN != h.log.lastLSN() || st.SentLSN != h.log.lastLSN() {
		t.Fatalf("stats %+v", st)
	}
	testutil.WaitGoroutines(t, base)
}

// TestShipperConverges ships a log that grows while it ships, through a
// faulty transport, to a follower that gates on position; the follower must
// end with every batch exactly once. ONCEWAL_LONG=1 runs 200 seeds per preset.
func TestShipperConverges(t *testing.T) {
	base := runtime.NumGoroutine()
	seeds := map[string]uint64{"light": 4, "heavy": 8}
	if os.Getenv("ONCEWAL_LONG") != "" {
		seeds = map[string]uint64{"light": 200, "heavy": 200}
	}
	for _, preset := range []struct {
		name   string
		faults inprocess.FaultOptions
	}{{"light", inprocess.FaultsLight}, {"heavy", inprocess.FaultsHeavy}} {
		var total ShipperStats
		var ts inprocess.Stats
		for seed := uint64(1); seed <= seeds[preset.name]; seed++ {
			t.Run(fmt.Sprintf("%s/seed%d", preset.name, seed), func(t *testing.T) {
				h := startHarness(t, preset.faults, seed, nil)
				for i := 0; i < 150; i++ {
					h.log.append(t, 1, 1+i%4)
				}
				h.waitAcked(h.log.lastLSN() / 2)
				for i := 0; i < 150; i++ { // appended while shipping
					h.log.append(t, 1, 2)
				}
				h.waitAcked(h.log.lastLSN())
				h.stop()
				h.f.checkExactlyOnce(t, h.log)
				st, trs := h.s.Stats(), h.tr.Stats()
				total.BatchesSent += st.BatchesSent
				total.BatchesResent += st.BatchesResent
				total.Rewinds += st.Rewinds
				total.Timeouts += st.Timeouts
				total.Connections += st.Connections
				total.Refusals += st.Refusals
				ts.Disconnects += trs.Disconnects
				ts.BatchesDropped += trs.BatchesDropped
				ts.BatchesDuplicated += trs.BatchesDuplicated
				ts.BatchesReordered += trs.BatchesReordered
				ts.BatchesDelayed += trs.BatchesDelayed
				ts.AcksDropped += trs.AcksDropped
			})
		}
		t.Logf("%s: shipper %+v; transport %+v", preset.name, total, ts)
		if preset.name == "heavy" && (total.BatchesResent == 0 || total.Rewinds == 0 || total.Timeouts == 0 ||
			total.Refusals == 0 || total.Connections <= seeds["heavy"] || ts.Disconnects == 0 ||
			ts.BatchesDropped == 0 || ts.BatchesDuplicated == 0 || ts.BatchesReordered == 0 ||
			ts.BatchesDelayed == 0 || ts.AcksDropped == 0) {
			t.Fatal("heavy faults did not exercise every recovery path")
		}
	}
	testutil.WaitGoroutines(t, base)
}

func TestShipperFollowerLosesData(t *testing.T) {
	base := runtime.NumGoroutine()
	h := startHarness(t, inprocess.FaultsNone, 1, noTimeouts)
	var mid uint64
	for i := 0; i < 100; i++ {
		l := h.log.append(t, 1, 2)
		if i == 49 {
			mid = l
		}
	}
	h.waitAcked(h.log.lastLSN())
	// The follower "restarts" with only half of what it acknowledged: its
	// new hello is below the shipper's position, which must go back.
	h.f.crash(mid)
	h.tr.Disconnect()
	for h.s.Stats().Connections < 2 { // until the shipper has the new hello
		time.Sleep(time.Millisecond)
	}
	h.waitAcked(h.log.lastLSN())
	h.stop()
	h.f.checkExactlyOnce(t, h.log)
	if st := h.s.Stats(); st.Connections != 2 || st.BatchesResent != 50 || st.Rewinds != 1 {
		t.Fatalf("stats %+v", st)
	}
	testutil.WaitGoroutines(t, base)
}

func TestShipperStopsCleanly(t *testing.T) {
	base := runtime.NumGoroutine()
	ctx := context.Background()
	m := newMemLog(0)
	for i := 0; i < 100; i++ {
		m.append(t, 1, 1)
	}

	// No follower ever connects.
	tr := inprocess.New(inprocess.FaultsNone, 1)
	s, err := NewShipper(new(testShipperOptions(tr, m)))
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error)
	go func() { done <- s.Run(cctx) }()
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run after cancel: %v", err)
	}

	// A follower that connects and never reads: the shipper blocks in Send
	// (queue of 1), and must still stop.
	tr2 := inprocess.New(inprocess.FaultOptions{QueueSize: 1}, 1)
	s2, err := NewShipper(new(testShipperOptions(tr2, m)))
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel = context.WithCancel(ctx)
	go func() { done <- s2.Run(cctx) }()
	fc, err := tr2.Dial(ctx, replication.Ack{})
	if err != nil {
		t.Fatal(err)
	}
	for {
		if tr2.Stats().BatchesSent >= 1 { // the queue of 1 is full
			break
		}
		runtime.Gosched()
	}
	if err := s2.Run(ctx); !errors.Is(err, ErrShipperRunning) {
		t.Fatalf("second Run: %v", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run after cancel: %v", err)
	}
	if _, err := fc.Recv(ctx); !errors.Is(err, replication.ErrDisconnected) {
		t.Fatalf("follower after shipper stopped: %v", err)
	}

	// Closing the listener ends Run with replication.ErrClosed.
	go func() { done <- s.Run(ctx) }()
	tr.Close()
	if err := <-done; !errors.Is(err, replication.ErrClosed) {
		t.Fatalf("Run after listener closed: %v", err)
	}
	tr2.Close()
	testutil.WaitGoroutines(t, base)
}

func TestShipperFencing(t *testing.T) {
	ctx := context.Background()
	m := newMemLog(0)
	m.append(t, 3, 1)
	m.append(t, 3, 1)
	leaderEpoch := func() uint64 { return 3 }

	// A hello from a follower that has seen epoch 4.
	tr := inprocess.New(inprocess.FaultsNone, 1)
	defer tr.Close()
	o := testShipperOptions(tr, m)
	o.Epoch = leaderEpoch
	s, _ := NewShipper(&o)
	done := make(chan error)
	go func() { done <- s.Run(ctx) }()
	if _, err := tr.Dial(ctx, replication.Ack{Epoch: 4}); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, replication.ErrFenced) {
		t.Fatalf("Run = %v, want ErrFenced", err)
	}

	// An ack (a refusal) carrying a higher epoch.
	go func() { done <- s.Run(ctx) }()
	fc, err := tr.Dial(ctx, replication.Ack{Epoch: 3})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fc.Recv(ctx); err != nil {
		t.Fatal(err)
	}
	if err := fc.Send(ctx, replication.Ack{Epoch: 4, Refused: true}); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, replication.ErrFenced) {
		t.Fatalf("Run = %v, want ErrFenced", err)
	}
}

func TestShipperRefusesWrongShard(t *testing.T) {
	ctx := context.Background()
	m := newMemLog(2)
	m.append(t, 1, 1)
	tr := inprocess.New(inprocess.FaultsNone, 1)
	defer tr.Close()
	s, _ := NewShipper(new(testShipperOptions(tr, m)))
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error)
	go func() { done <- s.Run(cctx) }()
	fc, err := tr.Dial(ctx, replication.Ack{Shard: 9})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fc.Recv(ctx); !errors.Is(err, replication.ErrDisconnected) {
		t.Fatalf("wrong-shard follower: %v", err)
	}
	// The shipper keeps serving: the right follower gets the batch.
	fc, err = tr.Dial(ctx, replication.Ack{Shard: 2})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fc.Recv(ctx); err != nil {
		t.Fatal(err)
	}
	cancel()
	<-done
	if st := s.Stats(); st.BadHellos != 1 || st.Connections != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestShipperRetriesReaderErrors(t *testing.T) {
	base := runtime.NumGoroutine()
	fails := 3
	var mu sync.Mutex
	h := startHarness(t, inprocess.FaultsNone, 1, func(o *ShipperOptions) {
		open := o.OpenReader
		o.OpenReader = func() (LogReader, error) {
			mu.Lock()
			defer mu.Unlock()
			if fails > 0 {
				fails--
				return nil, errors.New("disk on fire")
			}
			return open()
		}
	})
	for i := 0; i < 10; i++ {
		h.log.append(t, 1, 1)
	}
	h.waitAcked(h.log.lastLSN())
	h.stop()
	h.f.checkExactlyOnce(t, h.log)
	if st := h.s.Stats(); st.ReaderErrors != 3 {
		t.Fatalf("stats %+v", st)
	}
	testutil.WaitGoroutines(t, base)
}

func TestShipperWaitAckedHonoursContext(t *testing.T) {
	s, err := NewShipper(&ShipperOptions{Listener: inprocess.New(inprocess.FaultsNone, 1), WALDir: "unused"})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.WaitAcked(context.Background(), 0); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.WaitAcked(ctx, 1); !errors.Is(err, context.Canceled) {
		t.Fatalf("WaitAcked = %v", err)
	}
}

func TestNewShipperValidates(t *testing.T) {
	_, err := NewShipper(&ShipperOptions{MaxInFlight: -1, RetransmitTimeout: -1, PollInterval: -1})
	if !errors.Is(err, ErrBadOptions) {
		t.Fatalf("NewShipper = %v", err)
	}
	for _, want := range []string{"Listener", "WALDir", "MaxInFlight", "RetransmitTimeout", "PollInterval"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not name %s: %v", want, err)
		}
	}
	o := (&ShipperOptions{}).EnsureDefaults()
	if o.MaxInFlight != 32 || o.RetransmitTimeout != 500*time.Millisecond || o.MaxBackoff != 10*time.Second ||
		o.PollInterval != 10*time.Millisecond || o.Logger == nil {
		t.Fatalf("defaults %+v", o)
	}
}

// BenchmarkShipperInProcess measures shipping through the in-process
// transport to the position-gating fake follower: batches of 100 small
// events, no faults; reports batches/s.
func BenchmarkShipperInProcess(b *testing.B) {
	m := newMemLog(0)
	for i := 0; i < b.N; i++ {
		m.append(b, 1, 100)
	}
	tr := inprocess.New(inprocess.FaultsNone, 1)
	defer tr.Close()
	o := testShipperOptions(tr, m)
	o.MaxInFlight = 32
	o.RetransmitTimeout = time.Hour
	s, err := NewShipper(&o)
	if err != nil {
		b.Fatal(err)
	}
	f := &fakeFollower{}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b.ResetTimer()
	go s.Run(ctx)
	go f.serve(ctx, tr)
	if err := s.WaitAcked(ctx, m.lastLSN()); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "batches/s")
}

// TestShipperRealWAL ships a live wal.Writer log, rolling over small
// segments, through heavy faults, using the default wal.OpenReader.
func TestShipperRealWAL(t *testing.T) {
	base := runtime.NumGoroutine()
	for seed := uint64(1); seed <= 3; seed++ {
		dir := t.TempDir()
		w, err := wal.OpenWriter(dir, &wal.WriterOptions{Shard: 4, SegmentSize: 4 << 10, Sync: wal.SyncManual})
		if err != nil {
			t.Fatal(err)
		}
		tr := inprocess.New(inprocess.FaultsHeavy, seed)
		notify := make(chan struct{}, 1)
		s, err := NewShipper(&ShipperOptions{
			WALDir: dir, Shard: 4, Listener: tr, Epoch: func() uint64 { return 1 }, Notify: notify,
			RetransmitTimeout: 5 * time.Millisecond, MaxBackoff: 40 * time.Millisecond, PollInterval: time.Millisecond,
		})
		if err != nil {
			t.Fatal(err)
		}
		f := &fakeFollower{shard: 4, epoch: 1}
		ctx, cancel := context.WithCancel(context.Background())
		runErr, serveErr := make(chan error, 1), make(chan error, 1)
		go func() { runErr <- s.Run(ctx) }()
		go func() { serveErr <- f.serve(ctx, tr) }()
		var heads []wal.Header
		for i := 0; i < 300; i++ {
			evs := make([]wal.Event, 1+i%5)
			for j := range evs {
				evs[j] = wal.Event{Op: wal.OpAdd, Seq: 1, Key: []byte("counter"), Delta: int64(j)}
			}
			h, err := w.Append(1, evs)
			if err != nil {
				t.Fatal(err)
			}
			heads = append(heads, h)
			signal(notify)
		}
		wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
		if err := s.WaitAcked(wctx, heads[len(heads)-1].LastLSN()); err != nil {
			t.Fatalf("seed %d: %v; %+v", seed, err, s.Stats())
		}
		wcancel()
		cancel()
		if err := <-runErr; err != nil {
			t.Fatal(err)
		}
		if err := <-serveErr; err != nil {
			t.Fatal(err)
		}
		tr.Close()
		w.Close()
		f.checkHistory(t, heads)
		segs, _ := filepath.Glob(filepath.Join(dir, "*"))
		if len(segs) < 3 {
			t.Fatalf("only %d segments: the test should cross segment boundaries", len(segs))
		}
		if st := s.Stats(); st.Rewinds == 0 || st.ReaderErrors != 0 {
			t.Fatalf("seed %d: stats %+v", seed, st)
		}
	}
	testutil.WaitGoroutines(t, base)
}

// TestShipperRefusalStorm scripts the follower: the first batch of a full
// window is lost, so it refuses every batch of the window. The shipper must
// go back once, not once per refusal, and ignore a stale ack afterwards.
func TestShipperRefusalStorm(t *testing.T) {
	ctx := context.Background()
	m := newMemLog(0)
	for i := 0; i < 8; i++ {
		m.append(t, 1, 1)
	}
	tr := inprocess.New(inprocess.FaultsNone, 1)
	defer tr.Close()
	o := testShipperOptions(tr, m)
	o.RetransmitTimeout = time.Hour
	s, _ := NewShipper(&o)
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error)
	go func() { done <- s.Run(cctx) }()
	fc, err := tr.Dial(ctx, replication.Ack{})
	if err != nil {
		t.Fatal(err)
	}
	recvLSNs := func(n int) []uint64 {
		var out []uint64
		for i := 0; i < n; i++ {
			b, err := fc.Recv(ctx)
			if err != nil {
				t.Fatal(err)
			}
			h, _ := wal.DecodeHeader(b)
			out = append(out, h.FirstLSN)
		}
		return out
	}
	want := []uint64{1, 2, 3, 4, 5, 6, 7, 8}
	if got := recvLSNs(8); !slices.Equal(got, want) {
		t.Fatalf("first window %v", got)
	}
	for i := 0; i < 8; i++ {
		if err := fc.Send(ctx, replication.Ack{AppliedLSN: 0, Refused: true}); err != nil {
			t.Fatal(err)
		}
	}
	if got := recvLSNs(8); !slices.Equal(got, want) {
		t.Fatalf("resent window %v", got)
	}
	if err := fc.Send(ctx, replication.Ack{AppliedLSN: 8}); err != nil {
		t.Fatal(err)
	}
	if err := s.WaitAcked(ctx, 8); err != nil {
		t.Fatal(err)
	}
	if err := fc.Send(ctx, replication.Ack{AppliedLSN: 3}); err != nil { // stale, e.g. delayed in transit
		t.Fatal(err)
	}
	if err := fc.Send(ctx, replication.Ack{AppliedLSN: 8, Refused: true}); err != nil { // nothing beyond 8: no rewind
		t.Fatal(err)
	}
	for s.Stats().Acks < 11 {
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	st := s.Stats()
	if st.Rewinds != 1 || st.Refusals != 9 || st.BatchesSent != 16 || st.BatchesResent != 8 || st.AckedLSN != 8 {
		t.Fatalf("stats %+v", st)
	}
}

// TestShipperRefusesDivergedFollower: after a promotion at epoch 6 whose
// history starts at LSN 3, a follower that applied LSN 3 under epoch 5 (from
// the deposed leader) is refused; one that stopped at LSN 2 is served.
func TestShipperRefusesDivergedFollower(t *testing.T) {
	ctx := context.Background()
	m := newMemLog(2)
	m.append(t, 6, 1)
	tr := inprocess.New(inprocess.FaultsNone, 1)
	defer tr.Close()
	o := testShipperOptions(tr, m)
	o.Epoch = func() uint64 { return 6 }
	o.EpochStartLSN = 1
	s, _ := NewShipper(&o)
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error)
	go func() { done <- s.Run(cctx) }()
	fc, err := tr.Dial(ctx, replication.Ack{Shard: 2, Epoch: 5, AppliedLSN: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fc.Recv(ctx); !errors.Is(err, replication.ErrDisconnected) {
		t.Fatalf("diverged follower: %v", err)
	}
	fc, err = tr.Dial(ctx, replication.Ack{Shard: 2, Epoch: 5, AppliedLSN: 0})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fc.Recv(ctx); err != nil {
		t.Fatal(err)
	}
	cancel()
	<-done
	if st := s.Stats(); st.BadHellos != 1 || st.Connections != 1 {
		t.Fatalf("stats %+v", st)
	}
}
