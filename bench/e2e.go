package bench

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/oncewal/oncewal/internal/keyspace"
	"github.com/oncewal/oncewal/internal/leaderhook"
	"github.com/oncewal/oncewal/replication/inprocess"

	"github.com/oncewal/oncewal/store"

	"github.com/oncewal/oncewal/leader"

	"github.com/cockroachdb/pebble/v2"

	"github.com/oncewal/oncewal/follower"
	"github.com/oncewal/oncewal/idempotency"
	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/wal"
)

// The pipeline benchmarks (issue 13): a leader's WAL, a Shipper reading it,
// the in-process transport and one follower on disk, all in this process.
// The workload is a stream of client requests: 16-byte request IDs, 64-byte
// payloads, each request a put of its payload under its request ID in one
// of 10,000 sessions, carrying idempotency.ClientKey(request ID); a retry
// resends one of the last 50,000 request IDs (its original's session, key
// and payload) under a fresh SeqNo, so only the window recognises it. The
// client composes 1000-request batches and appends them to the WAL (synced
// per batch, or not) as fast as it can; the clock stops when the follower
// has acknowledged the last one. Composing a batch (ClientKey of each new
// request included) is the client's work and is timed, the same in every
// design.
//
// Designs: Pipeline runs the exactly-once follower (follower.Open, Sync per
// batch unless noSync); PipelineRaw the at-least-once reference, a
// follower that writes every event's row (and its position) into Pebble
// with Sync per batch, no dedup at all.

const (
	e2eSessions    = 10_000
	e2eRetryWindow = 50_000 // retries pick among the last this many request IDs
	e2ePayload     = 64
	e2eRequestID   = 16
)

// clientRequests generates the client-request workload.
type clientRequests struct {
	retryPercent int
	// stamped: the events go to a stamping leader (leader.Shard.Append),
	// which sets SeqNo and Time itself.
	stamped bool
	rng     *rand.Rand
	ids     []session.ID
	seq     []session.SeqNo
	next    uint64 // next new request number
	// recent[n%len(recent)] is request n's session and key, for retries:
	// e2eRetryWindow of them, shared out among concurrent clients so that
	// all their retries stay within the window's capacity.
	recent   []recentRequest
	payload  []byte
	events   []wal.Event
	keys     []byte // request IDs of the batch's events
	acc      int
	retries  int // retries composed, for the report
	composed int
	// client sets the top byte of request numbers: concurrent clients'
	// requests are distinct.
	client uint64
	clock  int64
}

type recentRequest struct {
	sess int
	key  idempotency.Key
}

// newClientRequests returns the workload of client (0 to clients-1) of
// clients concurrent ones: every client has the same sessions and
// payloads, and its own request numbers and draws of sessions and retries.
func newClientRequests(retryPercent, client, clients int) *clientRequests {
	c := &clientRequests{retryPercent: retryPercent, client: uint64(client), rng: rand.New(rand.NewPCG(3, 5)),
		seq:    make([]session.SeqNo, e2eSessions),
		recent: make([]recentRequest, e2eRetryWindow/clients),
		events: make([]wal.Event, BatchEvents), keys: make([]byte, BatchEvents*e2eRequestID),
		clock: 1_700_000_000_000_000_000}
	c.ids = randomIDs(c.rng, e2eSessions)
	c.payload = randomBytes(c.rng, 4096)
	if client > 0 {
		// Client 0 goes on drawing from the stream the sessions came from,
		// as the single-client rows always have.
		c.rng = rand.New(rand.NewPCG(3, 5+uint64(client)))
	}
	return c
}

// requestID writes request n's 16-byte ID into dst.
func requestID(dst []byte, n uint64) {
	binary.BigEndian.PutUint64(dst, n)
	binary.BigEndian.PutUint64(dst[8:], n*0x9e3779b97f4a7c15)
}

// warming says whether c is still composing its warm-up: a workload of
// only retries first sends one retry window of new requests (untimed: see
// drive), so that its retries have something to retry.
func (c *clientRequests) warming() bool {
	return c.retryPercent >= 100 && c.next < uint64(len(c.recent))
}

// batch composes the next 1000 requests, retryPercent of them retries (once
// there is anything to retry). The events alias c's buffers until the next
// call.
func (c *clientRequests) batch() []wal.Event {
	warming := c.warming()
	for i := range c.events {
		c.clock += 1000
		id := c.keys[i*e2eRequestID : (i+1)*e2eRequestID]
		var n uint64
		var s int
		var key idempotency.Key
		if c.acc += c.retryPercent; c.acc >= 100 && c.next > 0 && !warming {
			c.acc -= 100
			back := uint64(1 + c.rng.IntN(int(min(c.next, uint64(len(c.recent))))))
			n = c.next - back
			r := c.recent[n%uint64(len(c.recent))]
			s, key = r.sess, r.key
			requestID(id, c.client<<56|n)
			c.retries++
		} else {
			n = c.next
			c.next++
			s = c.rng.IntN(len(c.ids))
			requestID(id, c.client<<56|n)
			key = idempotency.ClientKey(id)
			c.recent[n%uint64(len(c.recent))] = recentRequest{s, key}
		}
		off := int(n*0x9e3779b97f4a7c15>>40) % (len(c.payload) - e2ePayload)
		c.events[i] = wal.Event{Op: wal.OpPut, Session: c.ids[s],
			HasIdemKey: true, IdemKey: key, Key: id, Value: c.payload[off : off+e2ePayload]}
		if !c.stamped {
			c.seq[s]++
			c.events[i].Seq, c.events[i].Time = c.seq[s], c.clock
		}
	}
	c.composed += len(c.events)
	return c.events
}

// pipelineRig is a WAL, its Shipper, the in-process transport and a
// follower (started by the design).
type pipelineRig struct {
	dir     string
	w       *wal.Writer
	tr      *inprocess.Transport
	shipper *leader.Shipper
	notify  chan struct{}
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	closers []func() error
}

func openPipelineRig(noSync bool) (*pipelineRig, error) {
	dir, err := os.MkdirTemp("", "oncewal-bench-e2e-")
	if err != nil {
		return nil, err
	}
	r := &pipelineRig{dir: dir, tr: inprocess.New(inprocess.FaultsNone, 1), notify: make(chan struct{}, 1)}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	policy := wal.SyncEveryBatch
	if noSync {
		policy = wal.SyncManual
	}
	walDir := filepath.Join(dir, "wal")
	if err := os.MkdirAll(walDir, 0o755); err != nil {
		r.close()
		return nil, err
	}
	if r.w, err = wal.OpenWriter(walDir, &wal.WriterOptions{Sync: policy}); err != nil {
		r.close()
		return nil, err
	}
	so := leader.ShipperOptions{WALDir: walDir, Listener: r.tr, Notify: r.notify, Logger: quietSlog(),
		OpenReader: func() (leader.LogReader, error) { return r.w.OpenReader() }}
	if !noSync {
		so.DurableLSN = r.w.DurableLSN // ship only what the leader synced, as a leader does
	}
	if r.shipper, err = leader.NewShipper(&so); err != nil {
		r.close()
		return nil, err
	}
	r.wg.Go(func() { _ = r.shipper.Run(r.ctx) })
	return r, nil
}

func (r *pipelineRig) close() {
	r.cancel()
	if r.tr != nil {
		_ = r.tr.Close()
	}
	r.wg.Wait()
	for _, c := range r.closers {
		_ = c()
	}
	if r.w != nil {
		_ = r.w.Close()
	}
	_ = os.RemoveAll(r.dir)
}

// drive appends b.N batches of c's requests and waits until the follower
// acknowledged the last; it reports events/s and cpu-ns/event.
func (r *pipelineRig) drive(b *testing.B, c *clientRequests) {
	var last uint64
	var raw []byte
	appendBatch := func() {
		evs := c.batch()
		h, err := r.w.Append(1, evs)
		if err != nil {
			b.Fatal(err)
		}
		last = h.LastLSN()
		// As a leader does (LedgerLog's OnAppend): the shipper's streams
		// read the batch from its cache instead of the WAL file.
		if raw, err = wal.AppendBatch(raw[:0], 0, 1, h.FirstLSN, evs); err != nil {
			b.Fatal(err)
		}
		r.shipper.Appended(h, raw)
		select {
		case r.notify <- struct{}{}:
		default:
		}
	}
	if c.warming() {
		for c.warming() {
			appendBatch()
		}
		if err := leaderhook.WaitAcked(r.shipper, r.ctx, last); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	cpu0 := cpuNanos()
	b.ResetTimer()
	for range b.N {
		appendBatch()
	}
	if err := leaderhook.WaitAcked(r.shipper, r.ctx, last); err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	events := float64(b.N) * BatchEvents
	b.ReportMetric(events/b.Elapsed().Seconds(), "events/s")
	b.ReportMetric(float64(cpuNanos()-cpu0)/events, "cpu-ns/event")
	// Batches sent again (retransmit timeouts, refusals, reconnects): work
	// the pipeline did twice.
	st := r.shipper.Stats()
	b.ReportMetric(float64(st.BatchesResent)/float64(b.N), "resent/batch")
}

// Pipeline measures the exactly-once pipeline on the client-request
// workload with retryPercent retries; noSync turns off fsync on both sides
// (the leader's WAL and the follower's commits).
func Pipeline(retryPercent int, noSync bool) func(*testing.B) {
	return func(b *testing.B) {
		Release()
		r, err := openPipelineRig(noSync)
		if err != nil {
			b.Fatal(err)
		}
		defer r.close()
		f, err := follower.Open(filepath.Join(r.dir, "follower"), &follower.Options{Store: store.Options{NoSync: noSync, Logger: quietSlog()}})
		if err != nil {
			b.Fatal(err)
		}
		r.closers = append(r.closers, f.Close)
		r.wg.Go(func() { _ = f.Serve(r.ctx, r.tr) })
		c := newClientRequests(retryPercent, 0, 1)
		r.drive(b, c)
		// Exactly once: every distinct request applied, no retry.
		if got, want := f.Stats().Receiver.Applied, uint64(c.composed-c.retries); got != want {
			b.Fatalf("follower applied %d events, want %d distinct requests (%d retries)", got, want, c.retries)
		}
	}
}

// LeaderWAL is the ceiling of Pipeline with sync: the client composing
// the same requests and appending them to the leader's WAL, synced per
// batch, with nothing shipped. One client appends one batch at a time and
// Append returns only after the sync that covers its batch, so appends and
// syncs form one serial chain that no follower-side pipelining can shorten
// (group commit needs concurrent appenders: LeaderConcurrent).
func LeaderWAL() func(*testing.B) {
	return func(b *testing.B) {
		Release()
		w := openBenchWAL(b)
		c := newClientRequests(0, 0, 1)
		b.ReportAllocs()
		cpu0 := cpuNanos()
		b.ResetTimer()
		for range b.N {
			if _, err := w.Append(1, c.batch()); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		events := float64(b.N) * BatchEvents
		b.ReportMetric(events/b.Elapsed().Seconds(), "events/s")
		b.ReportMetric(float64(cpuNanos()-cpu0)/events, "cpu-ns/event")
	}
}

// openBenchWAL opens a WAL writer in a new temporary directory, both
// closed and removed when b ends.
func openBenchWAL(b *testing.B) *wal.Writer {
	dir, err := os.MkdirTemp("", "oncewal-bench-wal-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = os.RemoveAll(dir) })
	w, err := wal.OpenWriter(dir, &wal.WriterOptions{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = w.Close() })
	return w
}

// PipelineRaw measures the at-least-once reference: the same pipeline and
// workload, the follower writing every event's row with no dedup.
func PipelineRaw(retryPercent int) func(*testing.B) {
	return func(b *testing.B) {
		Release()
		r, err := openPipelineRig(false)
		if err != nil {
			b.Fatal(err)
		}
		defer r.close()
		db, err := openPebble(filepath.Join(r.dir, "follower"))
		if err != nil {
			b.Fatal(err)
		}
		r.closers = append(r.closers, db.Close)
		r.wg.Go(func() { rawFollower(r.ctx, r.tr, db) })
		r.drive(b, newClientRequests(retryPercent, 0, 1))
	}
}

// rawFollower applies every batch it receives by writing each event's row
// (session.State's layout) and the position, committed with Sync, then
// acknowledges it. It reconnects until ctx ends.
func rawFollower(ctx context.Context, d replication.Dialer, db *pebble.DB) {
	var applied uint64
	var events []wal.Event
	var kbuf, vbuf []byte
	ackLoop(ctx, d, func() replication.Ack { return replication.Ack{Epoch: 1, AppliedLSN: applied} },
		func(raw []byte) (replication.Ack, error) {
			h, evs, err := wal.DecodeBatch(raw, events[:0])
			events = evs[:0]
			if err != nil {
				return replication.Ack{}, err
			}
			if h.LastLSN() > applied {
				if err := rawApply(db, h, evs, &kbuf, &vbuf); err != nil {
					return replication.Ack{}, err
				}
				applied = h.LastLSN()
			}
			return replication.Ack{Epoch: h.Epoch, AppliedLSN: applied}, nil
		})
}

// ackLoop is a stand-in follower's connection loop: it dials with hello(),
// answers every batch with handle's ack, and redials after any error until
// ctx ends.
func ackLoop(ctx context.Context, d replication.Dialer, hello func() replication.Ack, handle func(raw []byte) (replication.Ack, error)) {
	for ctx.Err() == nil {
		c, err := d.Dial(ctx, hello())
		if err != nil {
			continue
		}
		for {
			raw, err := c.Recv(ctx)
			if err != nil {
				break
			}
			a, err := handle(raw)
			if err != nil {
				break
			}
			if err := c.Send(ctx, a); err != nil {
				break
			}
		}
		_ = c.Close()
	}
}

func rawApply(db *pebble.DB, h wal.Header, evs []wal.Event, kbuf, vbuf *[]byte) error {
	batch := db.NewBatch()
	defer batch.Close()
	for i := range evs {
		e := &evs[i]
		*kbuf = append(append(append((*kbuf)[:0], session.StatePrefix...), e.Session[:]...), e.Key...)
		*vbuf = append(append((*vbuf)[:0], 1), e.Value...)
		if err := batch.Set(*kbuf, *vbuf, nil); err != nil {
			return err
		}
	}
	var pos [9]byte
	pos[0] = 1
	binary.LittleEndian.PutUint64(pos[1:], h.LastLSN())
	if err := batch.Set([]byte(keyspace.MetaPosition), pos[:], nil); err != nil {
		return err
	}
	return batch.Commit(pebble.Sync)
}

// shardPipeline is how many batches a Shards goroutine keeps between
// Node.Start and Pending.Wait, as follower.Serve does (its pipelineDepth).
const shardPipeline = 4

// Shards measures a node of n shards (follower.OpenNode, on disk) applying
// n streams of fresh events at once, one goroutine per shard pipelining
// its batches as Node.Serve runs them (Node.Start, then Wait in order), each batch committed with Sync unless noSync: events/s in
// total. Each shard's workload is Fresh over 25,000 sessions of its own.
// One op is one batch per shard; batches are composed chunk by chunk with
// the timer stopped.
func Shards(n int, noSync bool) func(*testing.B) {
	return func(b *testing.B) {
		Release()
		dir, err := os.MkdirTemp("", "oncewal-bench-shards-")
		if err != nil {
			b.Fatal(err)
		}
		defer os.RemoveAll(dir)
		shards := make([]uint32, n)
		for i := range shards {
			shards[i] = uint32(i)
		}
		node, err := follower.OpenNode(dir, shards, &follower.NodeOptions{
			Follower: follower.Options{Store: store.Options{NoSync: noSync, Logger: quietSlog()}}})
		if err != nil {
			b.Fatal(err)
		}
		defer node.Close()
		gens := make([]*generator, n)
		raws := make([][][]byte, n)
		for i := range gens {
			gens[i] = newGenerator(Workload{Sessions: 25_000})
			gens[i].shard = uint32(i)
			raws[i] = make([][]byte, chunk)
		}
		var applyErr atomic.Pointer[error]
		fail := func(err error) { applyErr.CompareAndSwap(nil, &err) }
		b.ReportAllocs()
		b.ResetTimer()
		cpu0, stopped := cpuNanos(), int64(0)
		for i := 0; i < b.N; i += chunk {
			m := min(chunk, b.N-i)
			b.StopTimer()
			c0 := cpuNanos()
			for s, g := range gens {
				for j := range m {
					g.fill(0)
					raws[s][j] = g.encode(raws[s][j])
				}
			}
			stopped += cpuNanos() - c0
			b.StartTimer()
			var wg sync.WaitGroup
			for s := range gens {
				wg.Go(func() {
					// As Node.Serve runs a shard: up to shardPipeline
					// batches between Start and the wait for their sync.
					var queue []*store.Pending
					wait := func() bool {
						res, err := queue[0].Wait()
						queue = queue[1:]
						if err == nil && res.Applied != BatchEvents {
							err = fmt.Errorf("shard %d applied %d events of %d", s, res.Applied, BatchEvents)
						}
						if err != nil {
							fail(err)
							return false
						}
						return true
					}
					ok := true
					for j := 0; j < m && ok; j++ {
						queue = append(queue, node.Start(raws[s][j]))
						if len(queue) == shardPipeline {
							ok = wait()
						}
					}
					for len(queue) > 0 {
						wait()
					}
				})
			}
			wg.Wait()
			if p := applyErr.Load(); p != nil {
				b.Fatal(*p)
			}
		}
		b.StopTimer()
		events := float64(b.N) * float64(n) * BatchEvents
		b.ReportMetric(events/b.Elapsed().Seconds(), "events/s")
		b.ReportMetric(float64(cpuNanos()-cpu0-stopped)/events, "cpu-ns/event")
	}
}
