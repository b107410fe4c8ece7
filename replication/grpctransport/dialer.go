package grpctransport

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/oncewal/oncewal/replication"
)

// DialerOptions configures the follower side. Exactly one of TLS and
// Insecure must be set.
type DialerOptions struct {
	// TLS is the follower's mutual-TLS configuration (ClientTLSConfig or
	// LoadClientTLS): RootCAs to verify the leader, a client certificate to
	// present. MinVersion is raised to TLS 1.3.
	TLS *tls.Config
	// Insecure dials plaintext. Only for tests and loopback experiments.
	Insecure bool
	// Logger receives connection-level log lines. Default slog.Default().
	Logger *slog.Logger
	// ConnectTimeout bounds one TCP connect + TLS handshake. Default 10s.
	ConnectTimeout time.Duration
	// KeepaliveTime is the idle time after which the follower pings the
	// leader (gRPC enforces at least 10s); KeepaliveTimeout how long it waits
	// for the answer before dropping the connection. Defaults 20s and 10s.
	KeepaliveTime, KeepaliveTimeout time.Duration
	// RecvBuffer is the number of received batches queued ahead of Recv.
	// Default 4.
	RecvBuffer int
	// MaxBatchSize is the largest batch (header + body) accepted from the
	// leader; a larger message ends the stream unread (ErrFrameTooLarge).
	// Default and maximum wal.HeaderSize + wal.MaxBodySize.
	MaxBatchSize int
}

// EnsureDefaults fills unset fields with their defaults and returns o.
func (o *DialerOptions) EnsureDefaults() *DialerOptions {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.ConnectTimeout == 0 {
		o.ConnectTimeout = DefaultConnectTimeout
	}
	if o.KeepaliveTime == 0 {
		o.KeepaliveTime = DefaultDialerKeepaliveTime
	}
	if o.KeepaliveTimeout == 0 {
		o.KeepaliveTimeout = DefaultKeepaliveTimeout
	}
	if o.RecvBuffer == 0 {
		o.RecvBuffer = DefaultRecvBuffer
	}
	if o.MaxBatchSize == 0 {
		o.MaxBatchSize = MaxBatchFrame - 1
	}
	return o
}

// remedyAuth is what an operator does about a TLS handshake either side
// refused.
const remedyAuth = "check that the leader and the follower trust each other's CA (--tls-ca), that neither certificate has expired, and that the leader's certificate names the host in --leader (or --tls-server-name)"

// Defaults of DialerOptions and ServerOptions.
const (
	DefaultConnectTimeout      = 10 * time.Second
	DefaultDialerKeepaliveTime = 20 * time.Second
	DefaultServerKeepaliveTime = 30 * time.Second
	DefaultKeepaliveTimeout    = 10 * time.Second
	DefaultHelloTimeout        = 10 * time.Second
	DefaultRecvBuffer          = 4
	DefaultSendBuffer          = 8
	DefaultHeartbeatInterval   = time.Second
)

// Validate reports every invalid field, the TLS setup included, in one error
// wrapping ErrBadOptions (zero fields are valid: they mean the default).
func (o *DialerOptions) Validate() error {
	errs := negatives([]namedValue{{"ConnectTimeout", int64(o.ConnectTimeout)}, {"KeepaliveTime", int64(o.KeepaliveTime)},
		{"KeepaliveTimeout", int64(o.KeepaliveTimeout)}, {"RecvBuffer", int64(o.RecvBuffer)}, {"MaxBatchSize", int64(o.MaxBatchSize)}})
	if o.MaxBatchSize > MaxBatchFrame-1 {
		errs = append(errs, fmt.Errorf("MaxBatchSize %d is above the largest batch, %d", o.MaxBatchSize, MaxBatchFrame-1))
	}
	if _, err := o.creds(); err != nil {
		errs = append(errs, err)
	}
	return badOptions(errs)
}

type namedValue struct {
	name string
	v    int64
}

func negatives(fields []namedValue) []error {
	var errs []error
	for _, f := range fields {
		if f.v < 0 {
			errs = append(errs, fmt.Errorf("%s %d is negative", f.name, f.v))
		}
	}
	return errs
}

func badOptions(errs []error) error {
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrBadOptions, errors.Join(errs...))
}

func (o *DialerOptions) creds() (credentials.TransportCredentials, error) {
	return transportCreds(o.TLS, o.Insecure, checkClientTLS)
}

// DialerStats counts what a Dialer did.
type DialerStats struct {
	Dials           uint64 // Dial calls
	DialFailures    uint64 // Dials that did not produce a connection
	BadFrames       uint64 // streams ended for a malformed or oversized frame
	BatchesReceived uint64
	BytesReceived   uint64
	AcksSent        uint64
	Refused         uint64 // streams the leader refused with a reason (ErrRefused)
}

type dialerCounters struct {
	dials, failures, badFrames, batches, bytes, acks, refused atomic.Uint64
}

// Dialer is the follower side of the gRPC transport; it implements
// replication.Dialer. Every Dial makes a fresh gRPC client connection (TCP +
// TLS handshake) and one stream on it, so each reconnect re-verifies the
// leader and re-reads nothing cached; the follower's own backoff paces
// redials.
type Dialer struct {
	addr  string
	opts  DialerOptions
	creds credentials.TransportCredentials
	stats dialerCounters

	mu      sync.Mutex
	closed  bool
	conns   map[*followerConn]struct{}
	lastLog string
	lastAt  time.Time
}

var _ replication.Dialer = (*Dialer)(nil)

// NewDialer returns a Dialer for the leader at addr (host:port).
func NewDialer(addr string, opts *DialerOptions) (*Dialer, error) {
	d := &Dialer{addr: addr, conns: make(map[*followerConn]struct{})}
	if opts != nil {
		d.opts = *opts
	}
	if err := d.opts.EnsureDefaults().Validate(); err != nil {
		return nil, err
	}
	var err error
	if d.creds, err = d.opts.creds(); err != nil {
		return nil, err
	}
	if addr == "" {
		return nil, fmt.Errorf("%w: empty leader address", ErrBadOptions)
	}
	return d, nil
}

// Stats returns a snapshot of the counters.
func (d *Dialer) Stats() DialerStats {
	c := &d.stats
	return DialerStats{Dials: c.dials.Load(), DialFailures: c.failures.Load(), BadFrames: c.badFrames.Load(),
		BatchesReceived: c.batches.Load(), BytesReceived: c.bytes.Load(), AcksSent: c.acks.Load(), Refused: c.refused.Load()}
}

// Close ends every connection the Dialer made (they return ErrClosed) and
// makes further Dials fail with ErrClosed. Idempotent.
func (d *Dialer) Close() error {
	d.mu.Lock()
	d.closed = true
	conns := make([]*followerConn, 0, len(d.conns))
	for c := range d.conns {
		conns = append(conns, c)
	}
	d.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
	return nil
}

// logDialError logs a failed dial or a refused stream at Warn, once per
// distinct reason per 30s, so a follower redialling a leader that refuses
// it says why without flooding the log.
func (d *Dialer) logDialError(err error) {
	if errors.Is(err, ErrRefused) {
		d.stats.refused.Add(1)
	}
	msg := err.Error()
	d.mu.Lock()
	repeat := msg == d.lastLog && time.Since(d.lastAt) < 30*time.Second
	if !repeat {
		d.lastLog, d.lastAt = msg, time.Now()
	}
	d.mu.Unlock()
	level := slog.LevelWarn
	if repeat {
		level = slog.LevelDebug
	}
	what := "oncewal follower: cannot reach leader: connection failed"
	switch {
	case errors.Is(err, ErrRefused):
		what = "oncewal follower: the leader refused this follower"
	case errors.Is(err, replication.ErrAuthFailed):
		what = "oncewal follower: cannot reach leader: TLS authentication failed"
	}
	d.opts.Logger.Log(context.Background(), level, what, "leader", d.addr, "err", msg)
}

// refusal turns a stream status that carries the leader's refusal (see
// leaderConn.Refuse) into an error wrapping ErrRefused,
// replication.ErrDisconnected and the refusal's sentinel; ok is false for
// any other error.
func refusal(err error) (_ error, ok bool) {
	st, isStatus := status.FromError(err)
	if !isStatus {
		return nil, false
	}
	msg, found := strings.CutPrefix(st.Message(), refusedPrefix)
	if !found {
		return nil, false
	}
	kind, reason, _ := strings.Cut(msg, ": ")
	if k := slices.IndexFunc(refusalKinds, func(k refusalKind) bool { return k.name == kind }); k >= 0 {
		sentinel := refusalKinds[k].err
		reason = strings.TrimPrefix(reason, sentinel.Error()+": ") // the text led with it
		return fmt.Errorf("%w: %w: %w: %s", replication.ErrDisconnected, ErrRefused, sentinel, reason), true
	}
	return fmt.Errorf("%w: %w: %s", replication.ErrDisconnected, ErrRefused, msg), true
}

// Dial implements replication.Dialer. It returns once the leader accepted
// the stream (its Listener's Accept took it), or with ctx.Err(), or with an
// error wrapping replication.ErrDisconnected (connect, TLS or stream
// failure; the caller retries), replication.ErrClosed, or
// replication.ErrBadFollowerID (hello.FollowerID cannot be sent; nothing
// was dialled).
func (d *Dialer) Dial(ctx context.Context, hello replication.Ack) (replication.FollowerConn, error) {
	d.stats.dials.Add(1)
	c, err := d.dial(ctx, hello)
	if err != nil {
		d.stats.failures.Add(1)
		if ctx.Err() == nil && !errors.Is(err, replication.ErrClosed) {
			d.logDialError(err)
		}
		return nil, err
	}
	return c, nil
}

func (d *Dialer) dial(ctx context.Context, hello replication.Ack) (*followerConn, error) {
	d.mu.Lock()
	closed := d.closed
	d.mu.Unlock()
	if closed {
		return nil, fmt.Errorf("grpctransport: dial: %w", replication.ErrClosed)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	helloFrame, err := encodeHello(hello)
	if err != nil {
		return nil, fmt.Errorf("grpctransport: dial: %w", err)
	}
	o := &d.opts
	creds := d.creds
	var probe *authProbe
	if !o.Insecure {
		probe = newAuthProbe(d.creds)
		creds = probe
	}
	cc, err := grpc.NewClient("passthrough:///"+d.addr,
		grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(
			grpc.ForceCodecV2(rawCodec{}),
			grpc.MaxCallRecvMsgSize(1+o.MaxBatchSize),
			grpc.MaxCallSendMsgSize(maxControlFrame),
		),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: o.KeepaliveTime, Timeout: o.KeepaliveTimeout, PermitWithoutStream: true}),
		// One connection per Dial: no reconnect loop inside gRPC, the
		// follower's backoff decides when to try again.
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.DefaultConfig, MinConnectTimeout: o.ConnectTimeout}),
		grpc.WithDisableRetry(),
		grpc.WithInitialWindowSize(streamWindow),
		grpc.WithInitialConnWindowSize(streamWindow),
	)
	if err != nil {
		return nil, fmt.Errorf("%w: grpctransport: %w", ErrBadOptions, err)
	}
	sctx, cancel := context.WithCancel(context.Background())
	c := &followerConn{
		d: d, cc: cc, cancel: cancel,
		batches: make(chan []byte, o.RecvBuffer),
		done:    make(chan struct{}),
	}
	fail := func(err error) (*followerConn, error) {
		cancel()
		cc.Close()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if probe != nil && !errors.Is(err, replication.ErrRefused) {
			if authErr := probe.slot.get(); authErr != nil {
				return nil, fmt.Errorf("%w: %w: dial %s: TLS: %w; %s", replication.ErrDisconnected, replication.ErrAuthFailed, d.addr, authErr, remedyAuth)
			}
		}
		return nil, err
	}
	// The dial ctx bounds the handshake only; the stream lives on sctx.
	stop := context.AfterFunc(ctx, cancel)
	defer stop()
	// Ask for heartbeats: a leader that knows them promises an interval in
	// its header; an older one ignores the key.
	cs, err := cc.NewStream(metadata.AppendToOutgoingContext(sctx, heartbeatKey, "1"), &grpc.StreamDesc{StreamName: streamName, ServerStreams: true, ClientStreams: true}, fullMethod)
	if err != nil {
		return fail(fmt.Errorf("%w: dial %s: %w", replication.ErrDisconnected, d.addr, err))
	}
	c.cs = cs
	if err := cs.SendMsg(&frame{helloFrame}); err != nil {
		if err == io.EOF {
			err = cs.RecvMsg(&frame{})
		}
		return fail(fmt.Errorf("%w: dial %s: hello: %w", replication.ErrDisconnected, d.addr, err))
	}
	md, err := cs.Header()
	if err == nil && md == nil {
		// The stream ended without headers: RecvMsg has the reason.
		err = cs.RecvMsg(&frame{})
		if err == nil || err == io.EOF {
			err = errors.New("stream ended before the leader accepted it")
		}
	}
	if err != nil {
		if r, ok := refusal(err); ok {
			return fail(fmt.Errorf("dial %s: %w", d.addr, r))
		}
		return fail(fmt.Errorf("%w: dial %s: %w", replication.ErrDisconnected, d.addr, err))
	}
	if !stop() {
		return fail(ctx.Err()) // ctx ended just now and cancelled the stream
	}
	if v := md.Get(heartbeatIntervalKey); len(v) == 1 {
		if every, perr := time.ParseDuration(v[0]); perr == nil && every > 0 {
			c.hb = every
		}
	}
	c.heard.Store(time.Now().UnixNano())
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return fail(fmt.Errorf("grpctransport: dial: %w", replication.ErrClosed))
	}
	d.conns[c] = struct{}{}
	d.mu.Unlock()
	c.wg.Add(1)
	go c.recvLoop()
	return c, nil
}

// followerConn is the follower's end of one stream; implements
// replication.FollowerConn.
type followerConn struct {
	d       *Dialer
	cc      *grpc.ClientConn
	cs      grpc.ClientStream
	cancel  context.CancelFunc
	batches chan []byte
	wg      sync.WaitGroup

	mu    sync.Mutex
	err   error
	local bool
	done  chan struct{}
	once  sync.Once

	// sendMu serialises SendMsg between Send (acks) and the pongs of
	// recvLoop: gRPC allows one SendMsg at a time.
	sendMu sync.Mutex
	hb     time.Duration // the leader's heartbeat interval; 0: none
	heard  atomic.Int64  // unix ns of the last frame from the leader
	lastHB atomic.Pointer[replication.Heartbeat]
}

var _ replication.LivenessConn = (*followerConn)(nil)

// HeartbeatInterval implements replication.LivenessConn.
func (c *followerConn) HeartbeatInterval() time.Duration { return c.hb }

// LastHeard implements replication.LivenessConn.
func (c *followerConn) LastHeard() (time.Time, replication.Heartbeat) {
	var hb replication.Heartbeat
	if p := c.lastHB.Load(); p != nil {
		hb = *p
	}
	return time.Unix(0, c.heard.Load()), hb
}

// heartbeat records a heartbeat and answers it, unless an ack is being
// sent just now (that ack tells the leader the same).
func (c *followerConn) heartbeat(f []byte) error {
	hb, err := decodeHeartbeat(f)
	if err != nil {
		return err
	}
	c.lastHB.Store(&hb)
	if c.sendMu.TryLock() {
		_ = c.cs.SendMsg(&frame{[]byte{framePong}}) // a failure shows in RecvMsg
		c.sendMu.Unlock()
	}
	return nil
}

func (c *followerConn) fail(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return
	}
	c.err = err
	close(c.done)
	c.cancel()
}

func (c *followerConn) ended() error {
	select {
	case <-c.done:
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.err
	default:
		return nil
	}
}

// streamErr turns a stream error into the transport's error vocabulary.
func (c *followerConn) streamErr(err error) error {
	c.mu.Lock()
	local := c.local
	c.mu.Unlock()
	if local {
		return fmt.Errorf("grpctransport: %w", replication.ErrClosed)
	}
	if status.Code(err) == codes.ResourceExhausted {
		return fmt.Errorf("%w: %w: %w", replication.ErrDisconnected, ErrFrameTooLarge, err)
	}
	if r, ok := refusal(err); ok {
		return r
	}
	if err == io.EOF {
		err = errors.New("leader ended the stream")
	}
	return fmt.Errorf("%w: %w", replication.ErrDisconnected, err)
}

func (c *followerConn) recvLoop() {
	defer c.wg.Done()
	for {
		var f frame
		if err := c.cs.RecvMsg(&f); err != nil {
			err = c.streamErr(err)
			if errors.Is(err, ErrFrameTooLarge) {
				c.d.stats.badFrames.Add(1)
				c.d.opts.Logger.Warn("oncewal follower: closing stream: oversized frame from leader", "leader", c.d.addr, "err", err)
			}
			if errors.Is(err, ErrRefused) {
				// Counted here; the follower's redial loop logs it.
				c.d.stats.refused.Add(1)
			}
			c.fail(err)
			return
		}
		c.heard.Store(time.Now().UnixNano())
		if c.hb > 0 && len(f.b) > 0 && f.b[0] == frameHeartbeat {
			if err := c.heartbeat(f.b); err != nil {
				c.badFrame(err)
				return
			}
			continue
		}
		b, err := decodeBatchFrame(f.b)
		if err != nil {
			c.badFrame(err)
			return
		}
		c.d.stats.batches.Add(1)
		c.d.stats.bytes.Add(uint64(len(b)))

		select {
		case c.batches <- b:
		case <-c.done:
			return
		}
	}
}

// badFrame ends the stream for a frame the leader should not have sent.
func (c *followerConn) badFrame(err error) {
	c.d.stats.badFrames.Add(1)
	c.d.opts.Logger.Warn("oncewal follower: closing stream: bad frame from leader", "leader", c.d.addr, "err", err)
	c.fail(fmt.Errorf("%w: %w", replication.ErrDisconnected, err))
}

// Recv implements replication.FollowerConn. The returned slice is the
// caller's. Batches already queued are delivered before a broken link is
// reported.
func (c *followerConn) Recv(ctx context.Context) ([]byte, error) {
	select {
	case b := <-c.batches:
		return b, nil
	default:
	}
	select {
	case b := <-c.batches:
		return b, nil
	case <-c.done:
		return nil, fmt.Errorf("grpctransport: recv: %w", c.ended())
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Send implements replication.FollowerConn. A ctx that ends while SendMsg is
// blocked (flow control) ends the stream, as the Transport contract allows.
func (c *followerConn) Send(ctx context.Context, ack replication.Ack) error {
	if err := c.ended(); err != nil {
		return fmt.Errorf("grpctransport: send: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, func() { c.fail(fmt.Errorf("%w: send cancelled", replication.ErrDisconnected)) })
	c.sendMu.Lock()
	err := c.cs.SendMsg(&frame{encodeAck(ack)})
	c.sendMu.Unlock()
	if !stop() {
		return ctx.Err()
	}
	if err != nil {
		// SendMsg reports io.EOF for a stream that ended; the reason comes
		// from the receive side.
		c.fail(c.streamErr(err))
		return fmt.Errorf("grpctransport: send: %w", c.ended())
	}
	c.d.stats.acks.Add(1)
	return nil
}

// Close implements replication.FollowerConn: it ends the stream and the
// client connection (the leader sees ErrDisconnected) and waits for the
// connection's goroutine. Idempotent.
func (c *followerConn) Close() error {
	c.once.Do(func() {
		c.mu.Lock()
		if c.err == nil {
			c.local = true
		}
		c.mu.Unlock()
		c.fail(fmt.Errorf("grpctransport: %w", replication.ErrClosed))
		c.wg.Wait()
		c.cc.Close()
		c.d.mu.Lock()
		delete(c.d.conns, c)
		c.d.mu.Unlock()
	})
	return nil
}
