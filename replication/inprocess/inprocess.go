package inprocess

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/oncewal/oncewal/replication"
)

// ErrClosed: a call on a closed Transport or on a connection closed
// locally. It is replication.ErrClosed, the contract's word for a locally
// closed transport, so either test works.
var ErrClosed = replication.ErrClosed

// ErrBadOptions: a FaultOptions field is out of range (see Validate).
var ErrBadOptions = errors.New("inprocess: bad fault options")

// FaultOptions sets the faults an Transport transport injects. Probabilities
// are per accepted Send, in [0, 1]. The zero value injects nothing.
type FaultOptions struct {
	DropBatch      float64 // batch silently lost
	DuplicateBatch float64 // batch delivered twice (the copy first)
	// ReorderBatch holds a batch back until 1..ReorderWindow later batches
	// were sent on the same connection, then delivers it after them. A held
	// batch whose successors never come is lost when the connection ends.
	ReorderBatch  float64
	ReorderWindow int     // default 4
	DelayBatch    float64 // batch delivered after a random delay in (0, MaxDelay]
	DropAck       float64 // ack silently lost
	DelayAck      float64 // ack delivered after a random delay in (0, MaxDelay]
	// Disconnect breaks the connection at a Send (of either direction): that
	// message is lost, everything still queued or held on the connection is
	// lost, and both ends get ErrDisconnected from then on.
	Disconnect float64
	MaxDelay   time.Duration // default 1ms
	// QueueSize bounds the messages queued per direction and connection
	// before Send blocks. Duplicates and delayed messages may exceed it.
	// Default 64.
	QueueSize int
}

// Fault presets. Treat them as constants: New copies its argument.
var (
	FaultsNone  = FaultOptions{}
	FaultsLight = FaultOptions{
		DropBatch: 0.01, DuplicateBatch: 0.01, ReorderBatch: 0.01, DelayBatch: 0.01,
		DropAck: 0.01, DelayAck: 0.01, Disconnect: 0.002,
		ReorderWindow: 4, MaxDelay: time.Millisecond,
	}
	FaultsHeavy = FaultOptions{
		DropBatch: 0.1, DuplicateBatch: 0.1, ReorderBatch: 0.1, DelayBatch: 0.05,
		DropAck: 0.1, DelayAck: 0.05, Disconnect: 0.02,
		ReorderWindow: 8, MaxDelay: 2 * time.Millisecond,
	}
)

func (c *FaultOptions) probs() []*float64 {
	return []*float64{&c.DropBatch, &c.DuplicateBatch, &c.ReorderBatch, &c.DelayBatch,
		&c.DropAck, &c.DelayAck, &c.Disconnect}
}

// Validate reports every out-of-range field, wrapped in ErrBadOptions.
func (c *FaultOptions) Validate() error {
	var errs []error
	names := []string{"DropBatch", "DuplicateBatch", "ReorderBatch", "DelayBatch", "DropAck", "DelayAck", "Disconnect"}
	for i, p := range c.probs() {
		if !(*p >= 0 && *p <= 1) {
			errs = append(errs, fmt.Errorf("%s = %v not in [0,1]", names[i], *p))
		}
	}
	if c.ReorderWindow < 0 {
		errs = append(errs, fmt.Errorf("ReorderWindow = %d < 0", c.ReorderWindow))
	}
	if c.MaxDelay < 0 {
		errs = append(errs, fmt.Errorf("MaxDelay = %v < 0", c.MaxDelay))
	}
	if c.QueueSize < 0 {
		errs = append(errs, fmt.Errorf("QueueSize = %d < 0", c.QueueSize))
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %w", ErrBadOptions, errors.Join(errs...))
	}
	return nil
}

// EnsureDefaults fills unset fields with their defaults and clamps
// out-of-range values into range (NaN counts as 0), so any FaultOptions is
// usable; call Validate first to reject bad input instead.
func (c *FaultOptions) EnsureDefaults() *FaultOptions {
	for _, p := range c.probs() {
		switch {
		case math.IsNaN(*p) || *p < 0:
			*p = 0
		case *p > 1:
			*p = 1
		}
	}
	if c.ReorderWindow <= 0 {
		c.ReorderWindow = 4
	}
	if c.MaxDelay <= 0 {
		c.MaxDelay = time.Millisecond
	}
	if c.QueueSize <= 0 {
		c.QueueSize = 64
	}
	return c
}

// batchFault is the fault decision for one batch Send. At most one of
// Disconnect, Drop, or delivery applies; a delivered batch may be
// duplicated and either held for reordering or delayed (Hold wins).
type batchFault struct {
	Disconnect bool
	Drop       bool
	Duplicate  bool
	Hold       int // deliver after this many later sends on the connection; 0 = not held
	Delay      time.Duration
}

// ackFault is the fault decision for one ack Send.
type ackFault struct {
	Disconnect bool
	Drop       bool
	Delay      time.Duration
}

// faultPlan is the deterministic source of fault decisions. Batches and acks
// draw from two independent PCG streams seeded from seed, and every decision
// consumes a fixed number of draws, so the n-th batch decision depends only
// on (config, seed, n) — never on acks, timing or which faults fired before.
// Not safe for concurrent use.
type faultPlan struct {
	cfg        FaultOptions
	batch, ack *rand.Rand
}

// newFaultPlan returns the decision sequence for cfg (defaults applied) and seed.
func newFaultPlan(cfg FaultOptions, seed uint64) *faultPlan {
	cfg.EnsureDefaults()
	return &faultPlan{
		cfg:   cfg,
		batch: rand.New(rand.NewPCG(seed, 0x6261746368)), // "batch"
		ack:   rand.New(rand.NewPCG(seed, 0x61636b)),     // "ack"
	}
}

func (p *faultPlan) delay(r *rand.Rand) time.Duration {
	return time.Duration(r.Uint64()%uint64(p.cfg.MaxDelay)) + 1
}

// NextBatch returns the decision for the next batch Send.
func (p *faultPlan) NextBatch() batchFault {
	r, c := p.batch, &p.cfg
	// Draw everything unconditionally: the stream position must not depend
	// on which faults fired.
	disc, drop, dup, reo := r.Float64() < c.Disconnect, r.Float64() < c.DropBatch, r.Float64() < c.DuplicateBatch, r.Float64() < c.ReorderBatch
	hold := 1 + int(r.Uint64()%uint64(c.ReorderWindow))
	del, d := r.Float64() < c.DelayBatch, p.delay(r)
	switch {
	case disc:
		return batchFault{Disconnect: true}
	case drop:
		return batchFault{Drop: true}
	}
	f := batchFault{Duplicate: dup}
	if reo {
		f.Hold = hold
	} else if del {
		f.Delay = d
	}
	return f
}

// NextAck returns the decision for the next ack Send.
func (p *faultPlan) NextAck() ackFault {
	r, c := p.ack, &p.cfg
	disc, drop := r.Float64() < c.Disconnect, r.Float64() < c.DropAck
	del, d := r.Float64() < c.DelayAck, p.delay(r)
	switch {
	case disc:
		return ackFault{Disconnect: true}
	case drop:
		return ackFault{Drop: true}
	case del:
		return ackFault{Delay: d}
	}
	return ackFault{}
}

// Stats counts what an Transport transport did. Sent counts Sends
// that the transport took (each drew one fault decision); Delivered counts
// messages handed out by Recv.
type Stats struct {
	Dials, Accepts    uint64
	BatchesSent       uint64
	BatchesDelivered  uint64
	BatchesDropped    uint64 // by DropBatch (not by disconnects)
	BatchesDuplicated uint64
	BatchesReordered  uint64 // held back by ReorderBatch
	BatchesDelayed    uint64
	AcksSent          uint64
	AcksDelivered     uint64
	AcksDropped       uint64
	AcksDelayed       uint64
	Disconnects       uint64 // injected by faults or by Disconnect()
	Lost              uint64 // messages discarded because their connection ended
}

// Transport is a replication transport over channels and slices in one process: both a
// Listener (leader side) and a Dialer (follower side). It injects faults
// from a faultPlan.
//
// Determinism: the n-th batch accepted by Send on any connection of the
// transport (counted across reconnects, from 1) gets decision n of the plan's
// batch stream; the n-th ack likewise from the ack stream. The same seed
// therefore gives the same fault decisions for the same sequence of Sends.
// Reorder holds count later Sends, so they are deterministic too. What is not
// deterministic is which message is the n-th when several goroutines send
// (e.g. a Shipper's retransmit timer), and when a delayed message lands
// relative to others (timers). A single goroutine driving both ends with no
// delay faults reproduces a run exactly.
//
// Transport starts no goroutines of its own; delayed deliveries run on
// time.AfterFunc timers that are stopped when their connection ends.
type Transport struct {
	mu       sync.Mutex
	cfg      FaultOptions
	plan     *faultPlan
	pipes    map[*pipe]struct{}
	closed   bool
	closedCh chan struct{}
	acceptq  chan *pipe
	stats    Stats
}

var (
	_ replication.Listener     = (*Transport)(nil)
	_ replication.Dialer       = (*Transport)(nil)
	_ replication.RefusingConn = (*leaderEnd)(nil)
)

// New returns a transport that injects faults (defaults applied,
// out-of-range values clamped; see FaultOptions.EnsureDefaults) decided by a
// PCG generator seeded with seed.
func New(faults FaultOptions, seed uint64) *Transport {
	faults.EnsureDefaults()
	return &Transport{
		cfg:      faults,
		plan:     newFaultPlan(faults, seed),
		pipes:    make(map[*pipe]struct{}),
		closedCh: make(chan struct{}),
		acceptq:  make(chan *pipe),
	}
}

// Stats returns a snapshot of the counters.
func (t *Transport) Stats() Stats {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.stats
}

// Disconnect breaks every live connection, as a network blip would: both
// ends get ErrDisconnected. It returns the number of connections broken.
func (t *Transport) Disconnect() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for p := range t.pipes {
		t.breakLocked(p)
		t.stats.Disconnects++
		n++
	}
	return n
}

// Close breaks every connection and makes all pending and future calls on
// the transport and its connections return ErrClosed. Idempotent.
func (t *Transport) Close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil
	}
	t.closed = true
	close(t.closedCh)
	for p := range t.pipes {
		t.breakLocked(p)
	}
	return nil
}

// Accept implements Listener.
func (t *Transport) Accept(ctx context.Context) (replication.LeaderConn, replication.Ack, error) {
	select {
	case p := <-t.acceptq:
		t.mu.Lock()
		t.stats.Accepts++
		t.mu.Unlock()
		return &leaderEnd{p}, p.hello, nil
	case <-ctx.Done():
		return nil, replication.Ack{}, ctx.Err()
	case <-t.closedCh:
		return nil, replication.Ack{}, fmt.Errorf("accept: %w", replication.ErrClosed)
	}
}

// Dial implements Dialer. It blocks until a leader Accepts.
func (t *Transport) Dial(ctx context.Context, hello replication.Ack) (replication.FollowerConn, error) {
	p := &pipe{
		t:      t,
		hello:  hello,
		done:   make(chan struct{}),
		timers: make(map[*time.Timer]struct{}),
	}
	p.toF.init()
	p.toL.init()
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil, fmt.Errorf("dial: %w", replication.ErrClosed)
	}
	// Registered before the handoff so that a Close racing with Accept
	// still breaks the new connection.
	t.pipes[p] = struct{}{}
	t.mu.Unlock()
	select {
	case t.acceptq <- p:
		t.mu.Lock()
		t.stats.Dials++
		t.mu.Unlock()
		return &followerEnd{p}, nil
	case <-ctx.Done():
		t.mu.Lock()
		delete(t.pipes, p)
		t.mu.Unlock()
		return nil, ctx.Err()
	case <-t.closedCh:
		return nil, fmt.Errorf("dial: %w", replication.ErrClosed)
	}
}

// queue is one direction of a connection. Guarded by Transport.mu; wake and
// space (capacity 1) let a single waiter block outside the lock.
type queue[T any] struct {
	items []T
	wake  chan struct{} // an item was added
	space chan struct{} // an item was removed
}

func (q *queue[T]) init() {
	q.wake = make(chan struct{}, 1)
	q.space = make(chan struct{}, 1)
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

func (q *queue[T]) push(v T) {
	q.items = append(q.items, v)
	signal(q.wake)
}

func (q *queue[T]) pop() T {
	var zero T
	v := q.items[0]
	q.items[0] = zero
	q.items = q.items[1:]
	if len(q.items) == 0 {
		q.items = nil
	}
	signal(q.space)
	return v
}

type heldBatch struct {
	buf   []byte
	sends int // later sends still to wait for
}

const (
	leaderSide   = 0
	followerSide = 1
)

// pipe is one connection. All fields but the immutable ones are guarded by
// Transport.mu.
type pipe struct {
	t      *Transport
	hello  replication.Ack
	done   chan struct{} // closed when the connection ends
	broken bool
	closed [2]bool // Close was called on that side
	toF    queue[[]byte]
	toL    queue[replication.Ack]
	held   []heldBatch
	timers map[*time.Timer]struct{}
	// refusal is why the leader refused the connection (Refuse); the
	// follower's calls return it.
	refusal error
}

// errLocked is the error a call on side gets once the pipe is broken.
func (p *pipe) errLocked(side int) error {
	if !p.broken {
		return nil
	}
	if p.closed[side] || p.t.closed {
		return replication.ErrClosed
	}
	if side == followerSide && p.refusal != nil {
		return fmt.Errorf("%w: %w: %w", replication.ErrDisconnected, replication.ErrRefused, p.refusal)
	}
	return replication.ErrDisconnected
}

func (t *Transport) breakLocked(p *pipe) {
	if p.broken {
		return
	}
	p.broken = true
	close(p.done)
	delete(t.pipes, p)
	t.stats.Lost += uint64(len(p.toF.items) + len(p.toL.items) + len(p.held) + len(p.timers))
	p.toF.items, p.toL.items, p.held = nil, nil, nil
	for tm := range p.timers {
		// A timer that already fired finds the pipe broken and does nothing.
		tm.Stop()
	}
	clear(p.timers)
}

// later delivers fn after d unless the connection ends first.
func (t *Transport) laterLocked(p *pipe, d time.Duration, fn func()) {
	var tm *time.Timer
	// The callback needs t.mu, which the caller holds, so tm is assigned
	// before the callback can look at it.
	tm = time.AfterFunc(d, func() {
		t.mu.Lock()
		defer t.mu.Unlock()
		if _, ok := p.timers[tm]; !ok || p.broken {
			return
		}
		delete(p.timers, tm)
		fn()
	})
	p.timers[tm] = struct{}{}
}

func (t *Transport) sendBatchLocked(p *pipe, buf []byte) error {
	t.stats.BatchesSent++
	f := t.plan.NextBatch()
	if f.Disconnect {
		t.stats.Disconnects++
		t.breakLocked(p)
		return fmt.Errorf("send batch: %w (injected)", replication.ErrDisconnected)
	}
	aging := len(p.held)
	switch {
	case f.Drop:
		t.stats.BatchesDropped++
	default:
		if f.Duplicate {
			t.stats.BatchesDuplicated++
			p.toF.push(bytes.Clone(buf))
		}
		switch {
		case f.Hold > 0:
			t.stats.BatchesReordered++
			p.held = append(p.held, heldBatch{buf: buf, sends: f.Hold})
		case f.Delay > 0:
			t.stats.BatchesDelayed++
			t.laterLocked(p, f.Delay, func() { p.toF.push(buf) })
		default:
			p.toF.push(buf)
		}
	}
	// Age the batches held before this send; release those due, after it.
	kept := p.held[:0]
	for i, h := range p.held {
		if i < aging {
			h.sends--
			if h.sends <= 0 {
				p.toF.push(h.buf)
				continue
			}
		}
		kept = append(kept, h)
	}
	clear(p.held[len(kept):])
	p.held = kept
	return nil
}

func (t *Transport) sendAckLocked(p *pipe, a replication.Ack) error {
	t.stats.AcksSent++
	f := t.plan.NextAck()
	switch {
	case f.Disconnect:
		t.stats.Disconnects++
		t.breakLocked(p)
		return fmt.Errorf("send ack: %w (injected)", replication.ErrDisconnected)
	case f.Drop:
		t.stats.AcksDropped++
	case f.Delay > 0:
		t.stats.AcksDelayed++
		t.laterLocked(p, f.Delay, func() { p.toL.push(a) })
	default:
		p.toL.push(a)
	}
	return nil
}

// send waits for room in q, then calls fn under the lock.
func send[T any](ctx context.Context, p *pipe, side int, q *queue[T], fn func() error) error {
	t := p.t
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		t.mu.Lock()
		if err := p.errLocked(side); err != nil {
			t.mu.Unlock()
			return fmt.Errorf("send: %w", err)
		}
		if len(q.items) < t.cfg.QueueSize {
			err := fn()
			t.mu.Unlock()
			return err
		}
		t.mu.Unlock()
		select {
		case <-q.space:
		case <-p.done:
		case <-ctx.Done():
		}
	}
}

// recv waits for an item in q and pops it under the lock.
func recv[T any](ctx context.Context, p *pipe, side int, q *queue[T], delivered *uint64) (T, error) {
	t := p.t
	var zero T
	for {
		if err := ctx.Err(); err != nil {
			return zero, err
		}
		t.mu.Lock()
		if err := p.errLocked(side); err != nil {
			t.mu.Unlock()
			return zero, fmt.Errorf("recv: %w", err)
		}
		if len(q.items) > 0 {
			v := q.pop()
			*delivered++
			t.mu.Unlock()
			return v, nil
		}
		t.mu.Unlock()
		select {
		case <-q.wake:
		case <-p.done:
		case <-ctx.Done():
		}
	}
}

func (p *pipe) close(side int) error {
	p.t.mu.Lock()
	defer p.t.mu.Unlock()
	p.closed[side] = true
	p.t.breakLocked(p)
	return nil
}

type leaderEnd struct{ p *pipe }

func (c *leaderEnd) Send(ctx context.Context, batch []byte) error {
	buf := bytes.Clone(batch)
	return send(ctx, c.p, leaderSide, &c.p.toF, func() error { return c.p.t.sendBatchLocked(c.p, buf) })
}

func (c *leaderEnd) Recv(ctx context.Context) (replication.Ack, error) {
	return recv(ctx, c.p, leaderSide, &c.p.toL, &c.p.t.stats.AcksDelivered)
}

func (c *leaderEnd) Close() error { return c.p.close(leaderSide) }

// Refuse implements RefusingConn: the connection ends as with Close, and
// the follower's calls return reason, wrapped with ErrDisconnected and
// ErrRefused.
func (c *leaderEnd) Refuse(reason error) error {
	c.p.t.mu.Lock()
	if !c.p.broken && reason != nil {
		c.p.refusal = reason
	}
	c.p.t.mu.Unlock()
	return c.p.close(leaderSide)
}

type followerEnd struct{ p *pipe }

func (c *followerEnd) Recv(ctx context.Context) ([]byte, error) {
	return recv(ctx, c.p, followerSide, &c.p.toF, &c.p.t.stats.BatchesDelivered)
}

func (c *followerEnd) Send(ctx context.Context, ack replication.Ack) error {
	return send(ctx, c.p, followerSide, &c.p.toL, func() error { return c.p.t.sendAckLocked(c.p, ack) })
}

func (c *followerEnd) Close() error { return c.p.close(followerSide) }
