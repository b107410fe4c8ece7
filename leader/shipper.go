package leader

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/oncewal/oncewal/replication"

	"github.com/oncewal/oncewal/wal"
)

// Shipper errors.
var (
	// ErrShipperRunning: Run was called while another Run is in progress.
	ErrShipperRunning = errors.New("leader: shipper already running")
)

// LogReader is what a stream needs from a WAL reader; *wal.Reader
// implements it. Next's slice is only read until the following call.
type LogReader interface {
	Seek(lsn uint64) error
	Next() (wal.Header, []byte, error)
	Close() error
}

// ShipperOptions configures a Shipper, and every follower's stream of a
// Fanout (FanoutOptions embeds it). Zero durations and counts take the
// defaults documented per field.
type ShipperOptions struct {
	// WALDir is the leader's WAL directory, read with wal.OpenReader.
	// Required unless OpenReader is set.
	WALDir string
	// Shard is the shard shipped; a hello for another shard is refused.
	Shard uint32
	// Listener accepts the followers' connections. Required.
	Listener replication.Listener
	// Epoch reports the leader's current epoch, for fencing (see package
	// notes). nil disables the check.
	Epoch func() uint64
	// MaxInFlight bounds the batches sent to a follower and not yet
	// acknowledged. Default 32.
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
	// Notify, if set, wakes streams waiting at the end of the WAL early
	// (signal it after every append; a buffered channel of 1 with a
	// non-blocking send is enough).
	Notify <-chan struct{}
	// EpochStartLSN, if set, is the first LSN of the leader's current epoch
	// (LedgerLog.EpochStartLSN after a promotion). A follower whose hello
	// shows an older epoch and an applied LSN at or beyond it applied a
	// deposed leader's entries that this log does not have; it is refused
	// (ErrDiverged) instead of being shipped on top of them. CheckHello, as
	// VerifyHello, applies this rule and more.
	EpochStartLSN uint64
	// VerifyHello, if set, is called with each connection's hello before
	// anything is shipped on it (after the shard, follower and fencing
	// checks). A non-nil error refuses the connection: it is closed, logged
	// and counted by reason (HelloRefusals: errors.Is on ErrDiverged,
	// replication.ErrBehindRetention, replication.ErrUnknownFollower, ErrBadHello, else Other).
	// CheckHello is the standard verifier. It runs on the follower's own
	// stream goroutine, so a slow check delays only that follower.
	VerifyHello func(replication.Ack) error
	// DurableLSN, if set, bounds what is shipped to the leader's synced log
	// (e.g. (*wal.Writer).DurableLSN): a batch the leader has written but
	// not synced is held back, so a leader crash cannot leave a follower
	// holding events the leader lost. nil ships whatever the reader sees.
	DurableLSN func() uint64
	// OpenReader opens a WAL reader. Default: wal.OpenReader(WALDir, Shard),
	// bounded by DurableLSN when that is set (wal.Reader.Bound).
	OpenReader func() (LogReader, error)
	// CacheBytes bounds the memory of the cache of recent batches that
	// Appended feeds and every stream reads before it reads the WAL (see
	// the package documentation). Default DefaultCacheBytes (64 MiB); negative
	// disables the cache.
	CacheBytes int64
	// Logger receives the shipper's diagnostic lines (refused hellos, lost
	// connections, WAL read retries). Default slog.Default().
	Logger *slog.Logger
	// WALTime, if set, reports the leader's WAL clock (unix ns of the
	// newest event logged) for the heartbeats (Heartbeat.WALTime). nil:
	// heartbeats carry 0.
	WALTime func() int64
}

// Defaults of ShipperOptions.
const (
	DefaultMaxInFlight       = 32
	DefaultRetransmitTimeout = 500 * time.Millisecond
	DefaultMaxBackoff        = 10 * time.Second
	DefaultPollInterval      = 10 * time.Millisecond
)

// EnsureDefaults fills zero fields with their defaults and returns o
// (negative values are left for Validate to refuse).
func (o *ShipperOptions) EnsureDefaults() *ShipperOptions {
	if o.MaxInFlight == 0 {
		o.MaxInFlight = DefaultMaxInFlight
	}
	if o.RetransmitTimeout == 0 {
		o.RetransmitTimeout = DefaultRetransmitTimeout
	}
	if o.MaxBackoff == 0 {
		o.MaxBackoff = DefaultMaxBackoff
	}
	if o.MaxBackoff < o.RetransmitTimeout {
		o.MaxBackoff = o.RetransmitTimeout
	}
	if o.PollInterval == 0 {
		o.PollInterval = DefaultPollInterval
	}
	if o.CacheBytes == 0 {
		o.CacheBytes = DefaultCacheBytes
	}
	if o.OpenReader == nil && o.WALDir != "" {
		dir, shard := o.WALDir, o.Shard
		durable := o.DurableLSN
		o.OpenReader = func() (LogReader, error) {
			r, err := wal.OpenReader(dir, shard)
			if err != nil {
				return nil, err
			}
			if durable != nil {
				// Never read a batch still being written (zeros written
				// ahead show one in part): only what is durable ships.
				r.Bound(func() uint64 { return durable() + 1 })
			}
			return r, nil
		}
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// Validate reports every problem of o in one error wrapping
// ErrBadOptions (zero fields are valid: they mean the default).
func (o *ShipperOptions) Validate() error {
	return badShipperOptions(o.problems())
}

func badShipperOptions(errs []error) error {
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrBadOptions, errors.Join(errs...))
}

func (o *ShipperOptions) problems() []error {
	var errs []error
	if o.Listener == nil {
		errs = append(errs, errors.New("Listener is required"))
	}
	if o.WALDir == "" && o.OpenReader == nil {
		errs = append(errs, errors.New("WALDir (or OpenReader) is required"))
	}
	if o.MaxInFlight < 0 {
		errs = append(errs, fmt.Errorf("MaxInFlight = %d < 0", o.MaxInFlight))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"RetransmitTimeout", o.RetransmitTimeout}, {"MaxBackoff", o.MaxBackoff}, {"PollInterval", o.PollInterval}} {
		if d.v < 0 {
			errs = append(errs, fmt.Errorf("%s = %v < 0", d.name, d.v))
		}
	}
	return errs
}

// ShipperStats is a snapshot of one follower's stream counters (a Shipper's,
// or one follower's of a Fanout).
type ShipperStats struct {
	Connections   uint64 // follower connections taken into service
	BadHellos     uint64 // connections refused (HelloRefusals.Total)
	BatchesSent   uint64 // every Send, resends included
	BatchesResent uint64 // sends of batches at or below SentLSN
	BytesSent     uint64
	Acks          uint64 // acks received (hellos not included)
	Refusals      uint64 // acks with Refused set
	Rewinds       uint64 // times the send position moved back (refusal, timeout, reconnect)
	Timeouts      uint64 // retransmit timer expiries
	ReaderErrors  uint64 // WAL reader failures (retried)
	AckedLSN      uint64 // the follower's acknowledged position
	SentLSN       uint64 // highest LSN ever sent
}

type shipperCounters struct {
	connections, sent, resent, bytes, acks, refusals, rewinds, timeouts, readerErrors atomic.Uint64
	sentLSN                                                                           atomic.Uint64
}

// Shipper streams one shard's WAL to one follower, whoever dials (the
// simple single-follower case; a Fanout serves several named followers).
// Create it with NewShipper and start it with Run.
type Shipper struct {
	f *Fanout
}

// NewShipper validates opts (every problem in one ErrBadOptions
// error) and returns a Shipper.
func NewShipper(opts *ShipperOptions) (*Shipper, error) {
	var o ShipperOptions
	if opts != nil {
		o = *opts
	}
	if err := o.EnsureDefaults().Validate(); err != nil {
		return nil, err
	}
	return &Shipper{f: newFanout(FanoutOptions{ShipperOptions: o}, true)}, nil
}

// Stats returns a snapshot of the counters. BadHellos counts every refused
// connection, whatever the reason.
func (s *Shipper) Stats() ShipperStats { return s.f.followerStats(s.f.single).ShipperStats }

// AckedLSN returns the position the current follower has acknowledged (its
// hello, then its acks). It can move back when a follower reconnects with
// less than it had (see the package documentation).
func (s *Shipper) AckedLSN() uint64 {
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	return s.f.single.acked
}

// Run accepts follower connections and ships batches until ctx ends, then
// returns nil after every goroutine it started has stopped. It returns early
// with ErrFenced (see the package documentation) or with the Listener's error once the
// Listener is closed (errors.Is(err, replication.ErrClosed)). Run may be called again
// after it returned, not concurrently (ErrShipperRunning).
func (s *Shipper) Run(ctx context.Context) error { return s.f.Run(ctx) }

// Appended hands the Shipper a batch the leader appended (see
// Fanout.Appended).
func (s *Shipper) Appended(h wal.Header, raw []byte) { s.f.Appended(h, raw) }

// ackPump reads acks off one connection so that the main loop can block in
// Send without the follower blocking on its ack Send (which would deadlock a
// transport with bounded buffers). The queue is bounded in practice by the
// batches in flight plus transport duplicates.
type ackPump struct {
	mu   sync.Mutex
	acks []replication.Ack
	err  error
	wake chan struct{}
}

func (p *ackPump) run(ctx context.Context, c replication.LeaderConn) {
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

func (p *ackPump) take(dst []replication.Ack) ([]replication.Ack, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	dst = append(dst, p.acks...)
	clear(p.acks)
	p.acks = p.acks[:0]
	return dst, p.err
}

type span struct{ first, last uint64 }

// shipLoop is one follower's stream during one Run; only its goroutine
// touches it.
type shipLoop struct {
	f  *Fanout
	p  *peer
	o  *ShipperOptions
	wg sync.WaitGroup // the ack pumps

	// Current connection; conn == nil between connections.
	conn   replication.LeaderConn
	cctx   context.Context
	cabort context.CancelFunc
	pump   *ackPump
	ackBuf []replication.Ack

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

	hb     replication.HeartbeatConn // the connection, if it carries heartbeats; nil: none
	hbNext time.Time                 // when the next heartbeat is due
}

func newShipLoop(f *Fanout, p *peer) *shipLoop {
	return &shipLoop{f: f, p: p, o: &f.opts.ShipperOptions, rto: f.opts.RetransmitTimeout, maxSent: p.stats.sentLSN.Load()}
}

// run serves the follower's connections until ctx ends (nil) or the leader
// is fenced (ErrFenced).
func (l *shipLoop) run(ctx context.Context) error {
	defer func() {
		l.dropConn()
		l.wg.Wait()
		l.closeReader()
	}()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		if l.conn == nil {
			select {
			case <-l.p.connCh:
				if err := l.takeConn(ctx); err != nil {
					return err
				}
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
		if err := l.fill(ctx); err != nil {
			return err
		}
		if l.conn == nil {
			continue
		}
		l.heartbeat()

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
		if l.hb != nil {
			earliest(l.hbNext)
		}
		if l.needSeek && !l.seekRetry.IsZero() {
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
		case <-l.p.connCh:
			if err := l.takeConn(ctx); err != nil {
				return err
			}
		case <-timerC:
			l.atEOF = false
			if len(l.inflight) > 0 && !time.Now().Before(l.progressAt.Add(l.rto)) {
				l.p.stats.timeouts.Add(1)
				l.rto = min(2*l.rto, l.o.MaxBackoff)
				l.rewind()
			}
		case <-l.p.wake:
			l.atEOF = false
		case <-l.cctx.Done():
			// Preempted by a new connection of this follower, which
			// arrives on connCh.
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

// fencedErr is ErrFenced by a follower that has seen epoch.
func (l *shipLoop) fencedErr(epoch uint64) error {
	return fmt.Errorf("%w: follower %q at epoch %d, this leader at %d: a newer leader was promoted; stop this one and point the followers at the current leader",
		replication.ErrFenced, l.p.id, epoch, l.o.Epoch())
}

// checkHello applies the checks that need the leader's state, in order:
// fencing (ErrFenced, which ends Run), the epoch-start rule, VerifyHello.
func (l *shipLoop) checkHello(h replication.Ack) error {
	if l.fenced(h.Epoch) {
		return l.fencedErr(h.Epoch)
	}
	if l.o.EpochStartLSN > 0 && l.o.Epoch != nil && h.Epoch < l.o.Epoch() && h.AppliedLSN >= l.o.EpochStartLSN {
		return fmt.Errorf("%w: follower applied LSN %d under epoch %d, but epoch %d starts at LSN %d; %s",
			replication.ErrDiverged, h.AppliedLSN, h.Epoch, l.o.Epoch(), l.o.EpochStartLSN, remedyDiverged)
	}
	if l.o.VerifyHello != nil {
		return l.o.VerifyHello(h)
	}
	return nil
}

// takeConn takes the follower's newest accepted connection into service,
// unless its hello is refused.
func (l *shipLoop) takeConn(ctx context.Context) error {
	a := l.f.takePending(l.p)
	if a == nil {
		return nil
	}
	if err := l.checkHello(a.hello); err != nil {
		if errors.Is(err, replication.ErrFenced) {
			replication.EndConn(a.conn, err)
			return err
		}
		l.f.refuse(l.p, a.hello, err, a.conn)
		return nil
	}
	l.dropConn()
	l.startConn(ctx, a)
	return nil
}

func (l *shipLoop) startConn(ctx context.Context, a *accepted) {
	l.p.stats.connections.Add(1)
	l.conn = a.conn
	l.cctx, l.cabort = context.WithCancel(ctx)
	l.f.setConn(l.p, l.conn, l.cabort)
	l.pump = &ackPump{wake: make(chan struct{}, 1)}
	pump, conn, cctx := l.pump, l.conn, l.cctx
	l.wg.Go(func() { pump.run(cctx, conn) })

	l.hb = nil
	if hc, ok := a.conn.(replication.HeartbeatConn); ok && hc.HeartbeatInterval() > 0 {
		l.hb, l.hbNext = hc, time.Now() // the first at once: the follower learns the log's end
	}

	l.acked = a.hello.AppliedLSN
	l.f.setAcked(l.p, l.acked)
	l.rto = l.o.RetransmitTimeout
	l.rewoundTo = 0
	l.seekTo(l.acked + 1)
}

// heartbeat sends the connection's heartbeat when it is due: every
// interval, whether or not batches flow, so that the follower's silence
// bound (follower.Options.LeaderTimeout) measures this stream's liveness,
// not the log's traffic.
func (l *shipLoop) heartbeat() {
	if l.hb == nil || time.Now().Before(l.hbNext) {
		return
	}
	hb := replication.Heartbeat{LastLSN: l.f.endLSN()}
	if l.o.WALTime != nil {
		hb.WALTime = l.o.WALTime()
	}
	// A full send buffer drops it (the batches queued are signs of life);
	// a dead connection shows in the ack pump.
	_ = l.hb.SendHeartbeat(hb)
	l.hbNext = time.Now().Add(l.hb.HeartbeatInterval())
}

func (l *shipLoop) dropConn() {
	if l.conn == nil {
		return
	}
	l.hb = nil
	l.cabort()
	l.conn.Close()
	l.conn, l.pump = nil, nil
	l.inflight = l.inflight[:0]
	l.f.setConn(l.p, nil, nil)
}

// seekTo makes lsn the next position to send from. The WAL reader is
// positioned when a batch is not in the cache.
func (l *shipLoop) seekTo(lsn uint64) {
	if lsn < l.next {
		l.p.stats.rewinds.Add(1)
	}
	l.next = lsn
	l.inflight = l.inflight[:0]
	l.progressAt = time.Now()
	l.needSeek = true
	l.seekRetry = time.Time{}
	l.atEOF = false
}

// rewind goes back to the follower's position (go-back-N).
func (l *shipLoop) rewind() {
	l.rewoundTo = l.acked + 1
	l.seekTo(l.acked + 1)
}

// position (re)opens the reader if needed and seeks it to next.
func (l *shipLoop) position() error {
	if l.reader == nil {
		r, err := l.o.OpenReader()
		if err != nil {
			return fmt.Errorf("open: %w", err)
		}
		l.reader = r
	}
	if err := l.reader.Seek(l.next); err != nil {
		return fmt.Errorf("seek %d: %w", l.next, err)
	}
	l.needSeek = false
	l.seekWait = 0
	l.seekRetry = time.Time{}
	return nil
}

// readerFailed handles a failed open, seek or read of the WAL: the reader
// is reopened after a backoff. A log that no longer holds what the follower
// needs (an error wrapping replication.ErrBehindRetention) ends the connection instead:
// nothing can be shipped to it, and its next hello is checked again
// (CheckHello refuses it until it is rebuilt). It is counted as a refusal.
func (l *shipLoop) readerFailed(err error) {
	l.p.stats.readerErrors.Add(1)
	l.closeReader()
	l.needSeek = true
	if errors.Is(err, wal.ErrCompacted) && !errors.Is(err, replication.ErrBehindRetention) {
		err = fmt.Errorf("%w: %w", replication.ErrBehindRetention, err)
	}
	if errors.Is(err, replication.ErrBehindRetention) {
		l.f.refuse(l.p, replication.Ack{Shard: l.o.Shard, FollowerID: l.p.id, AppliedLSN: l.acked}, err, l.conn)
		l.dropConn()
		return
	}
	l.seekWait = min(max(2*l.seekWait, l.o.PollInterval), l.o.MaxBackoff)
	l.seekRetry = time.Now().Add(l.seekWait)
	l.o.Logger.Warn("leader: shipper: WAL read failed, retrying", "follower", l.p.id, "lsn", l.next, "err", err, "retry_in", l.seekWait)
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
		l.o.Logger.Info("leader: shipper: connection lost", "follower", l.p.id, "err", err)
		l.dropConn()
	}
	return nil
}

func (l *shipLoop) onAck(a replication.Ack) error {
	l.p.stats.acks.Add(1)
	if a.Shard != l.o.Shard {
		return nil // not ours; never happens on a connection whose hello matched
	}
	if l.fenced(a.Epoch) {
		return l.fencedErr(a.Epoch)
	}
	if a.AppliedLSN > l.acked {
		l.acked = a.AppliedLSN
		l.f.setAcked(l.p, l.acked)
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
		l.p.stats.refusals.Add(1)
		// A refusal below the known position is stale; one at the position
		// already rewound to belongs to the window sent before the rewind.
		if a.AppliedLSN == l.acked && l.next > l.acked+1 && l.rewoundTo != l.acked+1 {
			l.rewind()
		}
	}
	return nil
}

// errNotPositioned: the WAL reader could not be positioned; read again
// after seekRetry.
var errNotPositioned = errors.New("leader: WAL reader not positioned")

// read returns the next batch to send (the one holding next, or a later
// one): from the cache when it holds it, io.EOF when next is the cache's
// end (not appended yet), else from this stream's WAL reader. fromDisk says
// which.
func (l *shipLoop) read() (h wal.Header, raw []byte, fromDisk bool, err error) {
	if c := l.f.cache; c != nil {
		h, raw, ok, atEnd := c.get(l.next)
		if ok || atEnd {
			if l.reader != nil { // rejoined the cache: the reader's position is stale
				l.closeReader()
			}
			l.needSeek = true
			if atEnd {
				return h, nil, false, io.EOF
			}
			return h, raw, false, nil
		}
	}
	if l.needSeek {
		if time.Now().Before(l.seekRetry) {
			return h, nil, true, errNotPositioned
		}
		if err := l.position(); err != nil {
			l.readerFailed(err)
			return h, nil, true, errNotPositioned
		}
	}
	h, raw, err = l.reader.Next()
	if err == nil {
		l.p.diskReads.Add(1)
	}
	return h, raw, true, err
}

// fill sends batches while the window has room and the WAL has data.
func (l *shipLoop) fill(ctx context.Context) error {
	for l.conn != nil && !l.atEOF && len(l.inflight) < l.o.MaxInFlight {
		h, buf, fromDisk, err := l.read()
		if err == io.EOF {
			l.atEOF = true
			return nil
		}
		if err == errNotPositioned {
			return nil
		}
		if err != nil {
			l.readerFailed(fmt.Errorf("read: %w", err))
			return nil
		}
		if h.Count == 0 || h.LastLSN() < l.next {
			continue // before the position (Seek may land on an earlier batch)
		}
		if h.FirstLSN > l.next {
			l.o.Logger.Warn("leader: shipper: WAL has a gap", "missing_lsn", l.next, "next_batch_lsn", h.FirstLSN)
		}
		if l.o.DurableLSN != nil && h.LastLSN() > l.o.DurableLSN() {
			// Written but not yet synced by the leader: a leader crash could
			// still lose it, so a follower must not apply it yet. Read it
			// again once the writer has synced (Notify or the next poll).
			if fromDisk {
				l.needSeek = true
			}
			l.atEOF = true
			return nil
		}
		if err := l.conn.Send(l.cctx, buf); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			l.o.Logger.Info("leader: shipper: send failed", "follower", l.p.id, "err", err)
			l.dropConn()
			return nil
		}
		c := &l.p.stats
		c.sent.Add(1)
		c.bytes.Add(uint64(len(buf)))
		l.f.sentEvents.Add(uint64(h.Count))
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

// signal wakes whoever waits on c without blocking: c has room for one
// wake-up, and one pending is as good as several.
func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}
