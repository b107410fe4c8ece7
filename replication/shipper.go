package replication

// Shipper (notes for doc.go)
//
// The Shipper is the leader side of one shard's replication to one follower.
// It is at-least-once by design; exactly-once is the Receiver's job.
//
//   - Position: the follower's hello says where it stands (AppliedLSN); the
//     Shipper seeks its WAL reader to AppliedLSN+1 and streams batches from
//     there, keeping at most MaxInFlight unacknowledged.
//   - Acks are cumulative. An ack above the known position acknowledges every
//     batch up to it. An ack below it on the same connection is stale
//     (reordered or delayed in transit) and ignored: a live follower's
//     position never moves back. A follower that restarted with less than it
//     had acknowledged (NoSync, lost disk) says so in the hello of its new
//     connection, and the Shipper starts over from there.
//   - Go-back-N: the Shipper never keeps copies of sent batches; it rewinds
//     the reader (Seek) to AppliedLSN+1 and resends from there when the
//     follower refuses a batch, when nothing was acknowledged for a
//     retransmit timeout, or when a new connection starts behind the send
//     position. A refusal at the position it already rewound to is not
//     acted on again (the other batches of the old window are refused the
//     same way); the retransmit timer covers a lost resend. The timeout
//     doubles after every expiry without progress, up to MaxBackoff, and
//     resets on progress.
//   - Live tail: io.EOF from the reader means "caught up"; the Shipper waits
//     for PollInterval or a Notify signal and reads on.
//   - Connections: one follower at a time. A newly accepted connection
//     replaces the current one (a restarted follower may reconnect before the
//     old link is known to be dead).
//   - Fencing: a hello or ack whose Epoch is above the leader's own epoch
//     (ShipperOptions.Epoch) means a newer leader exists; Run returns
//     ErrFenced.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/oncewal/oncewal/wal"
)

// Shipper errors.
var (
	// ErrBadShipperOptions: NewShipper was given unusable options.
	ErrBadShipperOptions = errors.New("replication: bad shipper options")
	// ErrShipperRunning: Run was called while another Run is in progress.
	ErrShipperRunning = errors.New("replication: shipper already running")
)

// LogReader is what the Shipper needs from a WAL reader; *wal.Reader
// implements it. Next's slice is only read until the following call.
type LogReader interface {
	Seek(lsn uint64) error
	Next() (wal.Header, []byte, error)
	Close() error
}

// ShipperOptions configures a Shipper. Zero durations and counts take the
// defaults documented per field.
type ShipperOptions struct {
	// WALDir is the leader's WAL directory, read with wal.OpenReader.
	// Required unless OpenReader is set.
	WALDir string
	// Shard is the shard shipped; a hello for another shard is refused.
	Shard uint32
	// Listener accepts the follower's connections. Required.
	Listener Listener
	// Epoch reports the leader's current epoch, for fencing (see package
	// notes). nil disables the check.
	Epoch func() uint64
	// MaxInFlight bounds the batches sent and not yet acknowledged.
	// Default 32.
	MaxInFlight int
	// RetransmitTimeout: with batches in flight and no ack progress for this
	// long, resend from the follower's position. Default 500ms.
	RetransmitTimeout time.Duration
	// MaxBackoff caps the retransmit timeout's doubling and the retry delay
	// after reader or accept errors. Default 10s.
	MaxBackoff time.Duration
	// PollInterval: how long to wait at the end of the WAL before reading
	// again. Default 10ms.
	PollInterval time.Duration
	// Notify, if set, wakes a Shipper waiting at the end of the WAL early
	// (signal it after every append; a buffered channel of 1 with a
	// non-blocking send is enough).
	Notify <-chan struct{}
	// EpochStartLSN, if set, is the first LSN of the leader's current epoch
	// (LedgerLog.EpochStartLSN after a promotion). A follower whose hello
	// shows an older epoch and an applied LSN at or beyond it applied a
	// deposed leader's entries that this log does not have; it is refused
	// (logged, counted in BadHellos) instead of being shipped on top of them.
	EpochStartLSN uint64
	// DurableLSN, if set, bounds what is shipped to the leader's synced log
	// (e.g. (*wal.Writer).DurableLSN): a batch the leader has written but
	// not synced is held back, so a leader crash cannot leave a follower
	// holding events the leader lost. nil ships whatever the reader sees.
	DurableLSN func() uint64
	// OpenReader opens the WAL reader. Default: wal.OpenReader(WALDir, Shard).
	OpenReader func() (LogReader, error)
	// Logf receives rare diagnostic lines. Default: discard.
	Logf func(format string, args ...any)
}

// EnsureDefaults fills unset fields with their defaults and returns o.
func (o *ShipperOptions) EnsureDefaults() *ShipperOptions {
	if o.MaxInFlight <= 0 {
		o.MaxInFlight = 32
	}
	if o.RetransmitTimeout <= 0 {
		o.RetransmitTimeout = 500 * time.Millisecond
	}
	if o.MaxBackoff <= 0 {
		o.MaxBackoff = 10 * time.Second
	}
	if o.MaxBackoff < o.RetransmitTimeout {
		o.MaxBackoff = o.RetransmitTimeout
	}
	if o.PollInterval <= 0 {
		o.PollInterval = 10 * time.Millisecond
	}
	if o.OpenReader == nil && o.WALDir != "" {
		dir, shard := o.WALDir, o.Shard
		o.OpenReader = func() (LogReader, error) { return wal.OpenReader(dir, shard) }
	}
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
	return o
}

// ShipperStats is a snapshot of a Shipper's counters.
type ShipperStats struct {
	Connections   uint64 // follower connections taken into service
	BadHellos     uint64 // connections refused: hello for another shard
	BatchesSent   uint64 // every Send, resends included
	BatchesResent uint64 // sends of batches at or below SentLSN
	BytesSent     uint64
	Acks          uint64 // acks received (hellos not included)
	Refusals      uint64 // acks with Refused set
	Rewinds       uint64 // times the send position moved back (refusal, timeout, reconnect)
	Timeouts      uint64 // retransmit timer expiries
	ReaderErrors  uint64 // WAL reader failures (retried)
	AckedLSN      uint64 // the current follower's acknowledged position
	SentLSN       uint64 // highest LSN ever sent
}

type shipperCounters struct {
	connections, badHellos, sent, resent, bytes, acks, refusals, rewinds, timeouts, readerErrors atomic.Uint64
	sentLSN                                                                                      atomic.Uint64
}

// Shipper streams one shard's WAL to a follower. Create it with NewShipper
// and start it with Run.
type Shipper struct {
	opts    ShipperOptions
	running atomic.Bool
	stats   shipperCounters

	mu       sync.Mutex
	acked    uint64
	ackedCh  chan struct{} // closed when acked changes; nil until someone waits
	curAbort context.CancelFunc
}

// NewShipper validates opts (every problem in one ErrBadShipperOptions
// error) and returns a Shipper.
func NewShipper(opts ShipperOptions) (*Shipper, error) {
	var errs []error
	if opts.Listener == nil {
		errs = append(errs, errors.New("Listener is required"))
	}
	if opts.WALDir == "" && opts.OpenReader == nil {
		errs = append(errs, errors.New("WALDir (or OpenReader) is required"))
	}
	if opts.MaxInFlight < 0 {
		errs = append(errs, fmt.Errorf("MaxInFlight = %d < 0", opts.MaxInFlight))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"RetransmitTimeout", opts.RetransmitTimeout}, {"MaxBackoff", opts.MaxBackoff}, {"PollInterval", opts.PollInterval}} {
		if d.v < 0 {
			errs = append(errs, fmt.Errorf("%s = %v < 0", d.name, d.v))
		}
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("%w: %w", ErrBadShipperOptions, errors.Join(errs...))
	}
	opts.EnsureDefaults()
	return &Shipper{opts: opts}, nil
}

// Stats returns a snapshot of the counters.
func (s *Shipper) Stats() ShipperStats {
	c := &s.stats
	return ShipperStats{
		Connections: c.connections.Load(), BadHellos: c.badHellos.Load(),
		BatchesSent: c.sent.Load(), BatchesResent: c.resent.Load(), BytesSent: c.bytes.Load(),
		Acks: c.acks.Load(), Refusals: c.refusals.Load(), Rewinds: c.rewinds.Load(),
		Timeouts: c.timeouts.Load(), ReaderErrors: c.readerErrors.Load(),
		AckedLSN: s.AckedLSN(), SentLSN: c.sentLSN.Load(),
	}
}

// AckedLSN returns the position the current follower has acknowledged (its
// hello, then its acks). It can move back when a follower reconnects with
// less than it had (see package notes).
func (s *Shipper) AckedLSN() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.acked
}

// WaitAcked blocks until the follower has acknowledged every LSN up to and
// including lsn, or ctx ends (ctx.Err()). It works whether or not Run is
// running.
func (s *Shipper) WaitAcked(ctx context.Context, lsn uint64) error {
	for {
		s.mu.Lock()
		if s.acked >= lsn {
			s.mu.Unlock()
			return nil
		}
		if s.ackedCh == nil {
			s.ackedCh = make(chan struct{})
		}
		ch := s.ackedCh
		s.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (s *Shipper) setAcked(lsn uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.acked = lsn
	if s.ackedCh != nil {
		close(s.ackedCh)
		s.ackedCh = nil
	}
}

type accepted struct {
	conn  LeaderConn
	hello Ack
}

// Run accepts follower connections and ships batches until ctx ends, then
// returns nil after every goroutine it started has stopped. It returns early
// with ErrFenced (see package notes) or with the Listener's error once the
// Listener is closed (errors.Is(err, ErrClosed)). Run may be called again
// after it returned, not concurrently (ErrShipperRunning).
func (s *Shipper) Run(ctx context.Context) error {
	if !s.running.CompareAndSwap(false, true) {
		return ErrShipperRunning
	}
	defer s.running.Store(false)
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	conns := make(chan accepted)
	acceptErr := make(chan error, 1)
	wg.Go(func() { s.acceptLoop(ctx, conns, acceptErr) })
	l := &shipLoop{s: s, o: &s.opts, wg: &wg, rto: s.opts.RetransmitTimeout}
	err := l.run(ctx, conns, acceptErr)
	cancel()
	l.dropConn()
	wg.Wait()
	l.closeReader()
	return err
}

func (s *Shipper) acceptLoop(ctx context.Context, conns chan<- accepted, acceptErr chan<- error) {
	backoff := s.opts.PollInterval
	for {
		c, hello, err := s.opts.Listener.Accept(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if errors.Is(err, ErrClosed) {
				acceptErr <- err
				return
			}
			s.opts.Logf("replication: shipper: accept: %v (retrying in %v)", err, backoff)
			if !sleepCtx(ctx, backoff) {
				return
			}
			backoff = min(2*backoff, s.opts.MaxBackoff)
			continue
		}
		backoff = s.opts.PollInterval
		// A Send blocked on the old connection must not keep the new one
		// waiting: abort it.
		s.mu.Lock()
		if s.curAbort != nil {
			s.curAbort()
		}
		s.mu.Unlock()
		select {
		case conns <- accepted{c, hello}:
		case <-ctx.Done():
			c.Close()
			return
		}
	}
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// ackPump reads acks off one connection so that the main loop can block in
// Send without the follower blocking on its ack Send (which would deadlock a
// transport with bounded buffers). The queue is bounded in practice by the
// batches in flight plus transport duplicates.
type ackPump struct {
	mu   sync.Mutex
	acks []Ack
	err  error
	wake chan struct{}
}

func (p *ackPump) run(ctx context.Context, c LeaderConn) {
	for {
		a, err := c.Recv(ctx)
		p.mu.Lock()
		if err != nil {
			p.err = err
		} else {
			p.acks = append(p.acks, a)
		}
		p.mu.Unlock()
		signal(p.wake)
		if err != nil {
			return
		}
	}
}

func (p *ackPump) take(dst []Ack) ([]Ack, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	dst = append(dst, p.acks...)
	clear(p.acks)
	p.acks = p.acks[:0]
	return dst, p.err
}

type span struct{ first, last uint64 }

// shipLoop is the state of one Run; only its goroutine touches it.
type shipLoop struct {
	s  *Shipper
	o  *ShipperOptions
	wg *sync.WaitGroup

	// Current connection; conn == nil between connections.
	conn   LeaderConn
	cctx   context.Context
	cabort context.CancelFunc
	pump   *ackPump
	ackBuf []Ack

	reader    LogReader
	needSeek  bool // reader must be (re)opened and positioned at next
	seekRetry time.Time
	seekWait  time.Duration
	atEOF     bool

	acked      uint64 // follower's acknowledged position
	next       uint64 // first LSN of the next batch to send
	inflight   []span // sent, not acknowledged, in send order
	progressAt time.Time
	rto        time.Duration
	rewoundTo  uint64 // position of the last go-back-N on this connection
	maxSent    uint64
}

func (l *shipLoop) run(ctx context.Context, conns <-chan accepted, acceptErr <-chan error) error {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		if l.conn == nil {
			select {
			case a := <-conns:
				if err := l.startConn(ctx, a); err != nil {
					return err
				}
			case err := <-acceptErr:
				return fmt.Errorf("replication: shipper: listener: %w", err)
			case <-ctx.Done():
				return nil
			}
			continue
		}
		if err := l.handleAcks(); err != nil {
			return err
		}
		if l.conn == nil {
			continue
		}
		if l.needSeek && !time.Now().Before(l.seekRetry) {
			l.position()
		}
		if err := l.fill(ctx); err != nil {
			return err
		}
		if l.conn == nil {
			continue
		}

		// Sleep until something can make progress.
		var wake time.Time
		earliest := func(t time.Time) {
			if wake.IsZero() || t.Before(wake) {
				wake = t
			}
		}
		if len(l.inflight) > 0 {
			earliest(l.progressAt.Add(l.rto))
		}
		if l.needSeek {
			earliest(l.seekRetry)
		} else if l.atEOF && len(l.inflight) < l.o.MaxInFlight {
			earliest(time.Now().Add(l.o.PollInterval))
		}
		var timerC <-chan time.Time
		if !wake.IsZero() {
			timer.Reset(time.Until(wake))
			timerC = timer.C
		}
		select {
		case <-l.pump.wake:
		case a := <-conns:
			l.dropConn()
			if err := l.startConn(ctx, a); err != nil {
				return err
			}
		case err := <-acceptErr:
			return fmt.Errorf("replication: shipper: listener: %w", err)
		case <-timerC:
			l.atEOF = false
			if len(l.inflight) > 0 && !time.Now().Before(l.progressAt.Add(l.rto)) {
				l.s.stats.timeouts.Add(1)
				l.rto = min(2*l.rto, l.o.MaxBackoff)
				l.rewind()
			}
		case <-l.o.Notify:
			l.atEOF = false
		case <-l.cctx.Done():
			// Preempted by a new connection, which arrives on conns.
			l.dropConn()
		case <-ctx.Done():
			return nil
		}
		timer.Stop() // Go ≥1.23 timers: no stale fire survives Stop/Reset
	}
}

func (l *shipLoop) fenced(epoch uint64) bool {
	return l.o.Epoch != nil && epoch > l.o.Epoch()
}

func (l *shipLoop) startConn(ctx context.Context, a accepted) error {
	if a.hello.Shard != l.o.Shard {
		l.s.stats.badHellos.Add(1)
		l.o.Logf("replication: shipper: %v: hello for shard %d, serving %d", ErrBadHello, a.hello.Shard, l.o.Shard)
		a.conn.Close()
		return nil
	}
	if l.o.EpochStartLSN > 0 && l.o.Epoch != nil && a.hello.Epoch < l.o.Epoch() && a.hello.AppliedLSN >= l.o.EpochStartLSN {
		l.s.stats.badHellos.Add(1)
		l.o.Logf("replication: shipper: %v: follower applied LSN %d under epoch %d, but epoch %d starts at LSN %d",
			ErrDiverged, a.hello.AppliedLSN, a.hello.Epoch, l.o.Epoch(), l.o.EpochStartLSN)
		a.conn.Close()
		return nil
	}
	if l.fenced(a.hello.Epoch) {
		a.conn.Close()
		return fmt.Errorf("%w: follower at epoch %d, leader at %d", ErrFenced, a.hello.Epoch, l.o.Epoch())
	}
	l.s.stats.connections.Add(1)
	l.conn = a.conn
	l.cctx, l.cabort = context.WithCancel(ctx)
	l.s.mu.Lock()
	l.s.curAbort = l.cabort
	l.s.mu.Unlock()
	l.pump = &ackPump{wake: make(chan struct{}, 1)}
	pump, conn, cctx := l.pump, l.conn, l.cctx
	l.wg.Go(func() { pump.run(cctx, conn) })

	l.acked = a.hello.AppliedLSN
	l.s.setAcked(l.acked)
	l.rto = l.o.RetransmitTimeout
	l.rewoundTo = 0
	l.seekTo(l.acked + 1)
	return nil
}

func (l *shipLoop) dropConn() {
	if l.conn == nil {
		return
	}
	l.cabort()
	l.conn.Close()
	l.conn, l.pump = nil, nil
	l.inflight = l.inflight[:0]
}

// seekTo makes lsn the next position to send from.
func (l *shipLoop) seekTo(lsn uint64) {
	if lsn < l.next {
		l.s.stats.rewinds.Add(1)
	}
	l.next = lsn
	l.inflight = l.inflight[:0]
	l.progressAt = time.Now()
	l.needSeek = true
	l.seekRetry = time.Time{}
	l.position()
}

// rewind goes back to the follower's position (go-back-N).
func (l *shipLoop) rewind() {
	l.rewoundTo = l.acked + 1
	l.seekTo(l.acked + 1)
}

// position (re)opens the reader if needed and seeks it to next. On failure
// it schedules a retry with backoff.
func (l *shipLoop) position() {
	l.atEOF = false
	err := func() error {
		if l.reader == nil {
			r, err := l.o.OpenReader()
			if err != nil {
				return fmt.Errorf("open: %w", err)
			}
			l.reader = r
		}
		if err := l.reader.Seek(l.next); err != nil {
			l.closeReader()
			return fmt.Errorf("seek %d: %w", l.next, err)
		}
		return nil
	}()
	if err == nil {
		l.needSeek = false
		l.seekWait = 0
		return
	}
	l.s.stats.readerErrors.Add(1)
	l.seekWait = min(max(2*l.seekWait, l.o.PollInterval), l.o.MaxBackoff)
	l.seekRetry = time.Now().Add(l.seekWait)
	l.o.Logf("replication: shipper: WAL reader: %v (retrying in %v)", err, l.seekWait)
}

func (l *shipLoop) closeReader() {
	if l.reader != nil {
		l.reader.Close()
		l.reader = nil
	}
}

// handleAcks applies every ack received so far; a dead connection is dropped.
func (l *shipLoop) handleAcks() error {
	var err error
	l.ackBuf, err = l.pump.take(l.ackBuf[:0])
	for _, a := range l.ackBuf {
		if ferr := l.onAck(a); ferr != nil {
			return ferr
		}
	}
	if err != nil {
		l.o.Logf("replication: shipper: connection lost: %v", err)
		l.dropConn()
	}
	return nil
}

func (l *shipLoop) onAck(a Ack) error {
	l.s.stats.acks.Add(1)
	if a.Shard != l.o.Shard {
		return nil // not ours; never happens on a connection whose hello matched
	}
	if l.fenced(a.Epoch) {
		return fmt.Errorf("%w: follower at epoch %d, leader at %d", ErrFenced, a.Epoch, l.o.Epoch())
	}
	if a.AppliedLSN > l.acked {
		l.acked = a.AppliedLSN
		l.s.setAcked(l.acked)
		l.progressAt = time.Now()
		l.rto = l.o.RetransmitTimeout
		i := 0
		for i < len(l.inflight) && l.inflight[i].last <= l.acked {
			i++
		}
		l.inflight = append(l.inflight[:0], l.inflight[i:]...)
		if l.acked >= l.next {
			// The follower is past everything sent (it had applied them
			// before a rewind): move forward, not back.
			l.seekTo(l.acked + 1)
		}
	}
	if a.Refused {
		l.s.stats.refusals.Add(1)
		// A refusal below the known position is stale; one at the position
		// already rewound to belongs to the window sent before the rewind.
		if a.AppliedLSN == l.acked && l.next > l.acked+1 && l.rewoundTo != l.acked+1 {
			l.rewind()
		}
	}
	return nil
}

// fill sends batches while the window has room and the WAL has data.
func (l *shipLoop) fill(ctx context.Context) error {
	for l.conn != nil && !l.needSeek && !l.atEOF && len(l.inflight) < l.o.MaxInFlight {
		h, buf, err := l.reader.Next()
		if err == io.EOF {
			l.atEOF = true
			return nil
		}
		if err != nil {
			l.s.stats.readerErrors.Add(1)
			l.o.Logf("replication: shipper: WAL read at %d: %v", l.next, err)
			l.closeReader()
			l.needSeek = true
			l.seekWait = min(max(2*l.seekWait, l.o.PollInterval), l.o.MaxBackoff)
			l.seekRetry = time.Now().Add(l.seekWait)
			return nil
		}
		if h.Count == 0 || h.LastLSN() < l.next {
			continue // before the position (Seek may land on an earlier batch)
		}
		if h.FirstLSN > l.next {
			l.o.Logf("replication: shipper: WAL has no LSN %d (next batch starts at %d)", l.next, h.FirstLSN)
		}
		if l.o.DurableLSN != nil && h.LastLSN() > l.o.DurableLSN() {
			// Written but not yet synced by the leader: a leader crash could
			// still lose it, so a follower must not apply it yet. Re-read it
			// once the writer has synced (Notify or the next poll).
			l.needSeek = true
			l.position()
			l.atEOF = true
			return nil
		}
		if err := l.conn.Send(l.cctx, buf); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			l.o.Logf("replication: shipper: send: %v", err)
			l.dropConn()
			return nil
		}
		c := &l.s.stats
		c.sent.Add(1)
		c.bytes.Add(uint64(len(buf)))
		if h.LastLSN() <= l.maxSent {
			c.resent.Add(1)
		} else {
			l.maxSent = h.LastLSN()
			c.sentLSN.Store(l.maxSent)
		}
		if len(l.inflight) == 0 {
			l.progressAt = time.Now()
		}
		l.inflight = append(l.inflight, span{h.FirstLSN, h.LastLSN()})
		l.next = h.LastLSN() + 1
		// Acks that arrived meanwhile may shrink the window or rewind.
		if err := l.handleAcks(); err != nil {
			return err
		}
	}
	return nil
}
