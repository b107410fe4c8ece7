package grpctransport

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/snapshot"
)

const (
	serviceName = "oncewal.replication.v1.Replication"
	streamName  = "Stream"
	fullMethod  = "/" + serviceName + "/" + streamName

	streamWindow = 4 << 20
)

// ServerOptions configures the leader side. Exactly one of TLS and Insecure
// must be set.
type ServerOptions struct {
	// TLS is the leader's mutual-TLS configuration (ServerTLSConfig or
	// LoadServerTLS). It must require and verify client certificates against
	// ClientCAs; MinVersion is raised to TLS 1.3. A follower's certificate
	// must name its ID (doc.go, "Identities").
	TLS *tls.Config
	// Insecure serves plaintext. Only for tests on loopback: anyone who
	// can reach the port can then read the log and pose as any follower
	// (no certificate names them: IDs are taken on trust).
	Insecure bool
	// Logger receives connection-level log lines (refused handshakes, bad
	// frames). Default slog.Default().
	Logger *slog.Logger
	// SendBuffer is the number of batches a connection queues ahead of gRPC
	// flow control. The Shipper's MaxInFlight bounds what is outstanding;
	// this only smooths bursts. Default 8.
	SendBuffer int
	// HelloTimeout bounds the wait for a new stream's hello. Default 10s.
	HelloTimeout time.Duration
	// KeepaliveTime is the idle time after which the leader pings a
	// follower; KeepaliveTimeout how long it waits for the answer before
	// dropping the connection. Defaults 30s and 10s. The enforcement policy
	// lets followers ping every 5s at most.
	KeepaliveTime, KeepaliveTimeout time.Duration
	// HeartbeatInterval is how often the leader sends a heartbeat on each
	// stream whose follower asks for them (replication.Heartbeat), whether
	// or not batches flow, so that a follower can tell a stopped leader
	// from an idle one; the follower answers each, which tells the leader
	// which connection of a follower ID is alive. Default
	// DefaultHeartbeatInterval (1s); negative: none.
	HeartbeatInterval time.Duration
	// Snapshots, if set, gives the snapshot donor of a shard (nil: none)
	// that the Snapshot method serves (see snapshot.go); a follower that
	// must be rebuilt fetches from it with a SnapshotClient. Default: none
	// (a begin is refused with snapshot.ErrNoDonor).
	Snapshots func(shard uint32) snapshot.Source
	// Services are served beside replication on the same port (see
	// Service). Default: none.
	Services []Service
}

// EnsureDefaults fills unset fields with their defaults and returns o.
func (o *ServerOptions) EnsureDefaults() *ServerOptions {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.SendBuffer == 0 {
		o.SendBuffer = DefaultSendBuffer
	}
	if o.HelloTimeout == 0 {
		o.HelloTimeout = DefaultHelloTimeout
	}
	if o.KeepaliveTime == 0 {
		o.KeepaliveTime = DefaultServerKeepaliveTime
	}
	if o.KeepaliveTimeout == 0 {
		o.KeepaliveTimeout = DefaultKeepaliveTimeout
	}
	if o.HeartbeatInterval == 0 {
		o.HeartbeatInterval = DefaultHeartbeatInterval
	}
	return o
}

// Validate reports every invalid field, the TLS setup included, in one error
// wrapping ErrBadOptions (zero fields are valid: they mean the default;
// a negative HeartbeatInterval turns heartbeats off).
func (o *ServerOptions) Validate() error {
	errs := negatives([]namedValue{{"SendBuffer", int64(o.SendBuffer)}, {"HelloTimeout", int64(o.HelloTimeout)},
		{"KeepaliveTime", int64(o.KeepaliveTime)}, {"KeepaliveTimeout", int64(o.KeepaliveTimeout)}})
	var probe atomic.Uint64
	if _, err := o.creds(&probe); err != nil {
		errs = append(errs, err)
	}
	names := map[string]bool{}
	for i := range o.Services {
		if err := o.Services[i].validate(); err != nil {
			errs = append(errs, err)
		}
		if names[o.Services[i].Name] {
			errs = append(errs, fmt.Errorf("service %s given twice", o.Services[i].Name))
		}
		names[o.Services[i].Name] = true
	}
	return badOptions(errs)
}

// maxRecv is the server's receive limit: the largest message any of its
// methods takes. Each handler checks its own, smaller limit.
func (o *ServerOptions) maxRecv() int {
	n := max(maxControlFrame, maxSnapshotRequest)
	for _, u := range o.Services {
		n = max(n, u.MaxRequest)
	}
	return n
}

func (o *ServerOptions) creds(refused *atomic.Uint64) (credentials.TransportCredentials, error) {
	c, err := transportCreds(o.TLS, o.Insecure, checkServerTLS)
	if err != nil || o.Insecure {
		return c, err
	}
	return loggedCreds{c, o.Logger, refused}, nil
}

// grpcServer is the gRPC server of a Server or a ServiceServer: the raw
// codec, the limits, keepalives and windows every server of the package
// shares.
func (o *ServerOptions) grpcServer(creds credentials.TransportCredentials) *grpc.Server {
	return grpc.NewServer(
		grpc.Creds(creds),
		grpc.ForceServerCodecV2(serverCodec{}),
		grpc.MaxRecvMsgSize(o.maxRecv()),
		grpc.MaxSendMsgSize(MaxBatchFrame),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: o.KeepaliveTime, Timeout: o.KeepaliveTimeout}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
		grpc.WaitForHandlers(true),
		// Static 4 MiB windows: a batch stream is one long bulk transfer;
		// gRPC's 64 KiB default (BDP-probed upward) throttles it on loopback.
		grpc.InitialWindowSize(streamWindow),
		grpc.InitialConnWindowSize(streamWindow),
	)
}

// ServerStats counts what a Server did.
type ServerStats struct {
	Streams      uint64 // streams opened by followers (TLS passed)
	Accepted     uint64 // streams handed to Accept
	RefusedTLS   uint64 // connections whose TLS handshake failed
	BadFrames    uint64 // streams ended for a malformed or oversized frame
	BatchesSent  uint64
	BytesSent    uint64
	AcksReceived uint64
	Disconnects  uint64 // accepted streams that ended other than by a local Close
	// UnservedShard counts streams refused because their hello named a
	// shard no Listener(shard) serves (routed servers only).
	UnservedShard uint64
	// Refused counts accepted streams the leader refused with a reason
	// (LeaderConn.Refuse: unknown follower, diverged, behind retention, …).
	Refused uint64
	// RefusedIdentity counts streams and snapshot calls refused because
	// the caller's certificate may not claim the hello's follower ID, or
	// names a client (replication.ErrIdentityMismatch).
	RefusedIdentity uint64
}

type serverCounters struct {
	streams, accepted, refused, badFrames, batches, bytes, acks, disconnects, unserved, refusedHello, identity atomic.Uint64
}

// Server is the leader side of the gRPC transport: a gRPC server whose one
// bidirectional streaming method carries a follower connection. It
// implements replication.Listener for a leader of one shard; Listener(shard)
// serves several shards on one server (see there).
type Server struct {
	opts    ServerOptions
	lis     net.Listener
	gs      *grpc.Server
	acceptq chan *leaderConn
	closed  chan struct{}

	mu     sync.Mutex
	shards map[uint32]*ShardListener // nil until the first Listener call
	routed chan struct{}             // closed by the first Listener call

	once  sync.Once
	serve chan struct{} // closed when gs.Serve returned
	wg    sync.WaitGroup
	stats serverCounters
}

var _ replication.Listener = (*Server)(nil)

// Listen listens on the TCP address addr and serves followers on it until
// Close.
func Listen(addr string, opts *ServerOptions) (*Server, error) {
	var o ServerOptions
	if opts != nil {
		o = *opts
	}
	// Validate before binding: bad options must not leave a port open.
	if err := o.EnsureDefaults().Validate(); err != nil {
		return nil, err
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("grpctransport: %w", err)
	}
	s, err := NewServer(lis, &o)
	if err != nil {
		lis.Close()
		return nil, err
	}
	return s, nil
}

// NewServer serves followers on lis until Close (which closes lis).
func NewServer(lis net.Listener, opts *ServerOptions) (*Server, error) {
	s := &Server{
		lis:     lis,
		acceptq: make(chan *leaderConn),
		closed:  make(chan struct{}),
		serve:   make(chan struct{}),
		routed:  make(chan struct{}),
	}
	if opts != nil {
		s.opts = *opts
	}
	o := s.opts.EnsureDefaults()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	creds, err := o.creds(&s.stats.refused)
	if err != nil {
		return nil, err
	}
	s.gs = o.grpcServer(creds)
	snaps := &snapshotService{donors: snapshot.NewRouter(o.Snapshots), insecure: o.Insecure, log: o.Logger, refused: &s.stats.identity}
	s.gs.RegisterService(&grpc.ServiceDesc{
		ServiceName: serviceName,
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{{
			MethodName: snapshotMethodName,
			Handler: func(_ any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
				return snaps.handle(ctx, dec)
			},
		}},
		Streams: []grpc.StreamDesc{{
			StreamName:    streamName,
			Handler:       func(_ any, ss grpc.ServerStream) error { return s.handle(ss) },
			ServerStreams: true,
			ClientStreams: true,
		}},
	}, struct{}{})
	registerServices(s.gs, o.Services)
	go func() {
		defer close(s.serve)
		_ = s.gs.Serve(lis)
	}()
	return s, nil
}

// Addr is the address the server listens on.
func (s *Server) Addr() net.Addr { return s.lis.Addr() }

// Stats returns a snapshot of the counters.
func (s *Server) Stats() ServerStats {
	c := &s.stats
	return ServerStats{
		Streams: c.streams.Load(), Accepted: c.accepted.Load(), RefusedTLS: c.refused.Load(),
		BadFrames: c.badFrames.Load(), BatchesSent: c.batches.Load(), BytesSent: c.bytes.Load(),
		AcksReceived: c.acks.Load(), Disconnects: c.disconnects.Load(),
		UnservedShard: c.unserved.Load(), Refused: c.refusedHello.Load(), RefusedIdentity: c.identity.Load(),
	}
}

// ErrRouted: Accept was called on a Server that routes streams by shard
// (Listener was called): accept on the shard's Listener instead.
var ErrRouted = errors.New("grpctransport: server routes streams by shard: accept on Server.Listener(shard)")

// Accept implements replication.Listener: it returns the next stream,
// whatever shard its hello names. Once the server routes by shard
// (Listener), Accept returns ErrRouted.
func (s *Server) Accept(ctx context.Context) (replication.LeaderConn, replication.Ack, error) {
	select {
	case c := <-s.acceptq:
		return c, c.hello, nil
	case <-s.routed:
		return nil, replication.Ack{}, ErrRouted
	case <-ctx.Done():
		return nil, replication.Ack{}, ctx.Err()
	case <-s.closed:
		return nil, replication.Ack{}, fmt.Errorf("grpctransport: accept: %w", replication.ErrClosed)
	}
}

// ShardListener is the replication.Listener of one shard of a Server (see
// Server.Listener).
type ShardListener struct {
	s     *Server
	shard uint32
	q     chan *leaderConn
}

var _ replication.Listener = (*ShardListener)(nil)

// Listener returns the replication.Listener of shard: its Accept returns
// only streams whose hello names shard. It lets one server (one address,
// one TLS identity) serve every shard of a leader node, each shard's
// shipper accepting on its own Listener. From the first call on, the
// server routes every stream by its hello's shard: a stream for a shard
// that no Listener serves is refused at once — the follower's Dial fails
// with the reason, the leader logs it and counts it (UnservedShard) — and
// Accept on the Server itself returns ErrRouted. Calling Listener again for
// a shard returns the same Listener. Closing the Server ends them all
// (their Accept returns replication.ErrClosed).
func (s *Server) Listener(shard uint32) *ShardListener {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.shards == nil {
		s.shards = make(map[uint32]*ShardListener)
		close(s.routed)
	}
	l, ok := s.shards[shard]
	if !ok {
		l = &ShardListener{s: s, shard: shard, q: make(chan *leaderConn)}
		s.shards[shard] = l
	}
	return l
}

// Shard is the shard l serves.
func (l *ShardListener) Shard() uint32 { return l.shard }

// Accept implements replication.Listener.
func (l *ShardListener) Accept(ctx context.Context) (replication.LeaderConn, replication.Ack, error) {
	select {
	case c := <-l.q:
		return c, c.hello, nil
	case <-ctx.Done():
		return nil, replication.Ack{}, ctx.Err()
	case <-l.s.closed:
		return nil, replication.Ack{}, fmt.Errorf("grpctransport: accept (shard %d): %w", l.shard, replication.ErrClosed)
	}
}

// queueFor returns the queue a stream for shard waits in: the server's own
// (unrouted; routed is then closed when routing starts, so the stream can
// move) or its shard's. ok is false when the server routes and no Listener
// serves shard; served then lists the shards that are served.
func (s *Server) queueFor(shard uint32) (q chan *leaderConn, routed <-chan struct{}, served []uint32, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.shards == nil {
		return s.acceptq, s.routed, nil, true
	}
	if l, found := s.shards[shard]; found {
		return l.q, nil, nil, true
	}
	for sh := range s.shards {
		served = append(served, sh)
	}
	slices.Sort(served)
	return nil, nil, served, false
}

// Close stops the server: the listener is closed, every connection ends
// (followers see ErrDisconnected, local LeaderConns ErrClosed), and Close
// returns once every goroutine of the server has exited. Idempotent.
func (s *Server) Close() error {
	s.once.Do(func() {
		close(s.closed)
		s.gs.Stop() // WaitForHandlers: returns after every handler returned
		<-s.serve
		s.wg.Wait()
	})
	return nil
}

func (s *Server) isClosed() bool {
	select {
	case <-s.closed:
		return true
	default:
		return false
	}
}

// handle runs one follower stream. The handler goroutine is the only one
// that calls SendMsg (batches come to it through sendq), so nothing sends
// after the handler returned; a helper goroutine reads acks.
func (s *Server) handle(ss grpc.ServerStream) error {
	ctx := ss.Context()
	s.stats.streams.Add(1)
	remote := "?"
	if p, ok := peer.FromContext(ctx); ok {
		remote = p.Addr.String()
	}
	c := &leaderConn{
		s:      s,
		remote: remote,
		hb:     wantsHeartbeats(ctx, s.opts.HeartbeatInterval),
		ss:     ss,
		sendq:  make(chan []byte, s.opts.SendBuffer),
		acks:   make(chan replication.Ack, 64),
		helloc: make(chan replication.Ack, 1),
		done:   make(chan struct{}),
	}
	s.wg.Add(1)
	go func() { defer s.wg.Done(); c.recvLoop(ctx) }()
	local := false
	defer func() {
		if s.isClosed() {
			c.fail(fmt.Errorf("grpctransport: %w (server closed)", replication.ErrClosed))
		} else {
			c.fail(fmt.Errorf("%w: stream to %s ended", replication.ErrDisconnected, remote))
		}
		if !local {
			s.stats.disconnects.Add(1)
		}
	}()

	timer := time.NewTimer(s.opts.HelloTimeout)
	defer timer.Stop()
	select {
	case c.hello = <-c.helloc:
	case <-c.done:
		return c.status()
	case <-timer.C:
		s.opts.Logger.Warn("oncewal leader: no hello from follower", "remote", remote, "timeout", s.opts.HelloTimeout)
		return status.Error(codes.DeadlineExceeded, "oncewal: no hello within timeout")
	case <-ctx.Done():
		return ctx.Err()
	case <-s.closed:
		return status.Error(codes.Unavailable, "oncewal: leader shutting down")
	}
	// Who may ack as an ID is settled before anything else reads the hello:
	// a forged ID's acks would make a quorum lie (doc.go, "Identities").
	if why := mayFollow(ctx, s.opts.Insecure, c.hello); why != nil {
		s.stats.identity.Add(1)
		s.opts.Logger.Warn("oncewal leader: refused a follower whose certificate does not name its ID", "remote", remote,
			"follower", c.hello.FollowerID, "err", why)
		return status.Error(codes.PermissionDenied, refusalMessage(why))
	}
	for accepted := false; !accepted; {
		q, routed, served, ok := s.queueFor(c.hello.Shard)
		if !ok {
			s.stats.unserved.Add(1)
			why := fmt.Errorf("%w: leader serves no shard %d (it serves shards %v); start the follower with a shard the leader serves (oncewal follower --shard, --shards)",
				replication.ErrWrongShard, c.hello.Shard, served)
			s.opts.Logger.Warn("oncewal leader: refused a stream for a shard it does not serve", "remote", remote,
				"follower", c.hello.FollowerID, "err", why)
			return status.Error(codes.NotFound, refusalMessage(why))
		}
		select {
		case q <- c:
			s.stats.accepted.Add(1)
			accepted = true
		case <-routed:
			// Routing started while the stream waited: route it again.
		case <-c.done:
			return c.status()
		case <-ctx.Done():
			return ctx.Err()
		case <-s.closed:
			return status.Error(codes.Unavailable, "oncewal: leader shutting down")
		}
	}
	// The header tells the follower's Dial that the leader took the stream,
	// and, if it asked, the heartbeat interval promised.
	md := metadata.Pairs("oncewal-accepted", "1")
	if c.hb > 0 {
		md.Set(heartbeatIntervalKey, c.hb.String())
	}
	if err := ss.SendHeader(md); err != nil {
		return err
	}
	for {
		select {
		case b := <-c.sendq:
			if err := ss.SendMsg(&frame{b}); err != nil {
				return err
			}
			if b[0] == frameBatch {
				s.stats.batches.Add(1)
				s.stats.bytes.Add(uint64(len(b) - 1))
			}
		case <-c.done:
			local = c.closedLocally()
			return c.status()
		case <-ctx.Done():
			return ctx.Err()
		case <-s.closed:
			return status.Error(codes.Unavailable, "oncewal: leader shutting down")
		}
	}
}

// wantsHeartbeats is the heartbeat interval of a stream: every, if the
// follower asked for heartbeats in its request metadata, else 0.
func wantsHeartbeats(ctx context.Context, every time.Duration) time.Duration {
	md, _ := metadata.FromIncomingContext(ctx)
	if every <= 0 || !slices.Contains(md.Get(heartbeatKey), "1") {
		return 0
	}
	return every
}

// leaderConn is the leader's end of one stream; implements replication.LeaderConn.
type leaderConn struct {
	s      *Server
	remote string
	hb     time.Duration // heartbeat interval; 0: the follower did not ask
	heard  atomic.Int64  // unix ns of the last frame from the follower
	ss     grpc.ServerStream
	hello  replication.Ack
	helloc chan replication.Ack
	sendq  chan []byte
	acks   chan replication.Ack

	mu      sync.Mutex
	err     error // why the connection ended; set once, before done closes
	local   bool  // ended by Close or Refuse
	refusal error // the reason given to Refuse
	done    chan struct{}
}

var (
	_ replication.RefusingConn  = (*leaderConn)(nil)
	_ replication.HeartbeatConn = (*leaderConn)(nil)
	_ replication.PeerConn      = (*leaderConn)(nil)
)

// HeartbeatInterval implements replication.HeartbeatConn.
func (c *leaderConn) HeartbeatInterval() time.Duration { return c.hb }

// SendHeartbeat implements replication.HeartbeatConn: it queues the
// heartbeat unless the send queue is full.
func (c *leaderConn) SendHeartbeat(hb replication.Heartbeat) error {
	if c.hb <= 0 {
		return nil
	}
	if err := c.ended(); err != nil {
		return fmt.Errorf("grpctransport: heartbeat: %w", err)
	}
	select {
	case c.sendq <- encodeHeartbeat(hb):
	default:
	}
	return nil
}

// RemoteAddr implements replication.PeerConn.
func (c *leaderConn) RemoteAddr() string { return c.remote }

// LastHeard implements replication.PeerConn.
func (c *leaderConn) LastHeard() time.Time { return time.Unix(0, c.heard.Load()) }

// refusedPrefix starts the status message of a refused stream: then the
// refusal's kind (refusalKinds, or "other"), ": " and its text. The
// follower's Dialer turns it back into ErrRefused and the kind's sentinel.
const refusedPrefix = "oncewal: refused: "

// refusalKind names a refusal's sentinel on the wire.
type refusalKind struct {
	name string
	err  error
}

// refusalKinds are checked in order: a reason wrapping several sentinels (a
// Fanout's wrong-shard or bad-ID refusal also wraps ErrBadHello) is sent as
// the most specific.
var refusalKinds = []refusalKind{
	{"wrong-shard", replication.ErrWrongShard},
	{"fenced", replication.ErrFenced},
	{"stale-epoch", replication.ErrStaleEpoch},
	{"diverged", replication.ErrDiverged},
	{"behind-retention", replication.ErrBehindRetention},
	{"unknown-follower", replication.ErrUnknownFollower},
	{"identity-mismatch", replication.ErrIdentityMismatch},
	{"duplicate-follower", replication.ErrDuplicateFollower},
	{"bad-follower-id", replication.ErrBadFollowerID},
	{"bad-hello", replication.ErrBadHello},
}

// refusalMessage is the status message of a stream refused with reason.
func refusalMessage(reason error) string {
	kind := "other"
	if k := slices.IndexFunc(refusalKinds, func(k refusalKind) bool { return errors.Is(reason, k.err) }); k >= 0 {
		kind = refusalKinds[k].name
	}
	return refusedPrefix + kind + ": " + reason.Error()
}

func (c *leaderConn) recvLoop(ctx context.Context) {
	first := true
	for {
		var f frame
		err := c.ss.RecvMsg(&f)
		if err != nil {
			if status.Code(err) == codes.ResourceExhausted {
				c.badFrame(fmt.Errorf("%w: %w", ErrFrameTooLarge, err))
				return
			}
			if c.s.isClosed() {
				// Close marks the server closed before stopping gRPC, so a
				// stream that Stop cancelled ends as closed, whichever of
				// this goroutine and the handler notices first.
				c.fail(fmt.Errorf("grpctransport: %w (server closed)", replication.ErrClosed))
				return
			}
			if err == io.EOF {
				err = errors.New("follower closed the stream")
			}
			c.fail(fmt.Errorf("%w: %w", replication.ErrDisconnected, err))
			return
		}
		if len(f.b) > maxControlFrame {
			c.badFrame(fmt.Errorf("%w: control frame of %d bytes, limit %d", ErrFrameTooLarge, len(f.b), maxControlFrame))
			return
		}
		c.heard.Store(time.Now().UnixNano())
		if !first && c.hb > 0 && len(f.b) == 1 && f.b[0] == framePong {
			continue // its only job: heard, above
		}
		if first {
			first = false
			h, err := decodeHello(f.b)
			if err != nil {
				c.badFrame(err)
				return
			}
			c.helloc <- h
			continue
		}
		a, err := decodeAck(f.b)
		if err != nil {
			c.badFrame(err)
			return
		}
		c.s.stats.acks.Add(1)
		select {
		case c.acks <- a:
		case <-c.done:
			return
		case <-ctx.Done():
			return
		}
	}
}

func (c *leaderConn) badFrame(err error) {
	c.s.stats.badFrames.Add(1)
	c.s.opts.Logger.Warn("oncewal leader: closing stream: bad frame from follower", "remote", c.remote, "err", err)
	c.fail(fmt.Errorf("%w: %w", replication.ErrDisconnected, err))
}

// fail ends the connection with err unless it already ended.
func (c *leaderConn) fail(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return
	}
	c.err = err
	close(c.done)
}

func (c *leaderConn) closedLocally() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.local
}

// status is what the handler returns for the ended connection: the follower
// reads it as the reason its stream ended.
func (c *leaderConn) status() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.refusal != nil:
		return status.Error(codes.FailedPrecondition, refusalMessage(c.refusal))
	case c.local:
		return status.Error(codes.Aborted, "oncewal: leader closed the stream")
	case errors.Is(c.err, ErrBadFrame) || errors.Is(c.err, ErrFrameTooLarge):
		return status.Error(codes.InvalidArgument, "oncewal: "+c.err.Error())
	default:
		return status.Error(codes.Unavailable, c.err.Error())
	}
}

func (c *leaderConn) ended() error {
	select {
	case <-c.done:
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.err
	default:
		return nil
	}
}

// Send implements replication.LeaderConn. It copies batch into a frame and
// queues it for the stream; it blocks while the queue is full (gRPC flow
// control pushing back), bounded by ctx, which leaves the connection usable.
func (c *leaderConn) Send(ctx context.Context, batch []byte) error {
	if 1+len(batch) > MaxBatchFrame {
		return fmt.Errorf("%w: batch of %d bytes", ErrFrameTooLarge, len(batch))
	}
	if err := c.ended(); err != nil {
		return fmt.Errorf("grpctransport: send: %w", err)
	}
	b := make([]byte, 1+len(batch))
	b[0] = frameBatch
	copy(b[1:], batch)
	select {
	case c.sendq <- b:
		return nil
	case <-c.done:
		return fmt.Errorf("grpctransport: send: %w", c.ended())
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Recv implements replication.LeaderConn.
func (c *leaderConn) Recv(ctx context.Context) (replication.Ack, error) {
	select {
	case a := <-c.acks:
		return a, nil
	case <-c.done:
		return replication.Ack{}, fmt.Errorf("grpctransport: recv: %w", c.ended())
	case <-ctx.Done():
		return replication.Ack{}, ctx.Err()
	}
}

// Close implements replication.LeaderConn: the stream ends with status
// Aborted, which the follower sees as ErrDisconnected. Idempotent.
func (c *leaderConn) Close() error { return c.end(nil) }

// Refuse implements replication.RefusingConn: the stream ends like Close,
// and the follower's Dialer sees reason (its error wraps ErrRefused and
// replication.ErrDisconnected) and logs it.
func (c *leaderConn) Refuse(reason error) error {
	if reason == nil {
		reason = errors.New("no reason given")
	}
	return c.end(reason)
}

func (c *leaderConn) end(refusal error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil {
		if refusal != nil {
			c.s.stats.refusedHello.Add(1)
		}
		c.local, c.refusal = true, refusal
		c.err = fmt.Errorf("grpctransport: %w", replication.ErrClosed)
		close(c.done)
	}
	return nil
}
