package client

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"github.com/oncewal/oncewal/internal/ctxtime"
	clientv1 "github.com/oncewal/oncewal/proto/oncewal/client/v1"
)

// principalKey is the gRPC metadata key that names the caller on an
// insecure connection (Options.Principal); with TLS the node reads the
// caller from its certificate and ignores it.
const principalKey = "oncewal-principal"

// Client sends requests to an oncewal cluster's leader (see the package
// doc). Safe for concurrent use.
type Client struct {
	opts  Options
	creds credentials.TransportCredentials
	// life ends when Close is called; every call's context ends with it.
	life    context.Context
	endLife context.CancelFunc

	mu     sync.Mutex
	closed bool
	conns  map[string]*grpc.ClientConn
	addrs  []string // Options.Addrs, then the leaders redirects named
	leader string   // where the last answer came from: where calls start ("": none known)
	epoch  uint64   // the highest leader epoch an answer carried (invariant 9)

	sess sessions
	// shards is the cluster's shard count as the last session opened said
	// (0: not known yet); keyed holds the session of each shard whose keys
	// a call used (invariant 10). Under mu.
	shards uint32
	keyed  map[uint32]*sessions
}

// New makes a Client for opts (defaults filled in a copy). It dials
// nothing yet: connections are made by the first call to each node.
func New(opts *Options) (*Client, error) {
	o := *opts
	o.Addrs = slices.Clone(o.Addrs)
	o.EnsureDefaults()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	var creds credentials.TransportCredentials
	if o.Insecure {
		creds = insecure.NewCredentials()
	} else {
		t := o.TLS.Clone()
		t.MinVersion = max(t.MinVersion, tls.VersionTLS13)
		creds = credentials.NewTLS(t)
	}
	life, end := context.WithCancel(context.Background())
	c := &Client{opts: o, creds: creds, life: life, endLife: end, conns: map[string]*grpc.ClientConn{}}
	for _, a := range o.Addrs {
		if !slices.Contains(c.addrs, a) {
			c.addrs = append(c.addrs, a)
		}
	}
	c.sess.init(&c.opts)
	return c, nil
}

// Close closes the connections; calls in progress end (invariant 7) and
// later calls return ErrClosed. A second Close does nothing.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	conns := c.conns
	c.conns = nil
	c.mu.Unlock()
	c.endLife()
	var errs []error
	for addr, cc := range conns {
		if err := cc.Close(); err != nil {
			errs = append(errs, fmt.Errorf("client: closing the connection to %s: %w", addr, err))
		}
	}
	return errors.Join(errs...)
}

// Result is the answer to a Submit.
type Result struct {
	// Outcome is what the node's handler recorded for the request.
	Outcome []byte
	// LSN is the WAL batch that logged the request (a replay: the log's end
	// when the retry came, which covers it); durable under the ack policy.
	LSN uint64
	// Epoch is the leader's epoch when it answered.
	Epoch uint64
	// Replayed: an earlier attempt (of this call or of an earlier one with
	// the same request ID) ran the request; this is its recorded answer.
	Replayed bool
}

// Sizes a node accepts; a larger request is refused before it is sent.
const (
	MaxRequestID = clientv1.MaxRequestID
	MaxAction    = clientv1.MaxAction
	MaxPayload   = clientv1.MaxPayload
)

// SubmitOption adjusts one Submit.
type SubmitOption func(*clientv1.SubmitRequest)

// WithAction says what the request does ("transfer 10 from a to b"): the
// node records it with the request ID and names it in a conflict's
// message, so that a reused ID is recognised. At most MaxAction bytes.
func WithAction(action string) SubmitOption {
	return func(r *clientv1.SubmitRequest) { r.Action = action }
}

// WithAck sets the ack policy of this Submit (default Options.Ack).
func WithAck(a Ack) SubmitOption {
	return func(r *clientv1.SubmitRequest) {
		if a != 0 {
			r.Ack = a.wire()
		}
	}
}

// Submit runs the request named requestID once, with payload (Ops builds
// the default one), on the leader, retrying under the budget with the
// same request ID (invariant 1). Errors: ErrConflict (a *ConflictError),
// ErrRejected (a *RejectedError: the node's handler rejected it and the
// rejection is recorded), ErrRefused, ErrDenied, ErrOutcomeUnknown (retry with the same ID),
// ErrUnavailable (it did not run), ErrClosed, or the caller's context
// error (with ErrOutcomeUnknown if an attempt may have run).
func (c *Client) Submit(ctx context.Context, requestID string, payload []byte, opts ...SubmitOption) (Result, error) {
	req := clientv1.SubmitRequest{RequestId: requestID, Ack: c.opts.Ack.wire(), Payload: payload}
	for _, o := range opts {
		o(&req)
	}
	if err := checkRequest(&req); err != nil {
		return Result{}, err
	}
	var res Result
	var expired *sessionID // the session a node last answered SessionExpired for
	what := fmt.Sprintf("submit %q", requestID)
	err := c.run(ctx, what, func(ctx context.Context, addr string) step {
		cc, err := c.conn(addr)
		if err != nil {
			return connStep(addr, err)
		}
		sid, s, ok := c.sess.get(ctx, c, cc, addr, expired)
		if !ok {
			return s
		}
		req.Session = sid[:]
		var p peer.Peer
		rep, err := clientv1.NewClientClient(cc).Submit(c.callContext(ctx), &req, grpc.Peer(&p))
		if err != nil {
			return rpcStep(addr, err, p.Addr != nil)
		}
		switch rep.GetCode() {
		case clientv1.Code_OK, clientv1.Code_REPLAY:
			if rep.GetCode() == clientv1.Code_OK {
				c.sess.used(sid)
			}
			res = Result{Outcome: rep.GetOutcome(), LSN: rep.GetLsn(), Epoch: rep.GetEpoch(), Replayed: rep.GetCode() == clientv1.Code_REPLAY}
			return step{v: vDone, epoch: rep.GetEpoch()}
		}
		return writeStep(addr, requestID, req.GetAction(), rep, sid, &expired)
	})
	if err != nil {
		return Result{}, err
	}
	return res, nil
}

// writeReply is what a write's reply (Submit's, Txn's) says besides its
// answer.
type writeReply interface {
	GetCode() clientv1.Code
	GetLeader() string
	GetEpoch() uint64
	GetMessage() string
	GetRejection() *clientv1.Rejection
}

// writeStep handles the codes every write shares but OK and Replay: a
// conflict and a recorded rejection end the call; an expired session sid
// is noted in *expired, and the attempt is made again at addr under a
// renewed one (nothing was claimed); the rest as replyStep.
func writeStep(addr, requestID, action string, rep writeReply, sid sessionID, expired **sessionID) step {
	switch rep.GetCode() {
	case clientv1.Code_REJECTED:
		return step{v: vDone, epoch: rep.GetEpoch(), err: &RejectedError{RequestID: requestID, Code: rep.GetRejection().GetCode(), Detail: rep.GetRejection().GetDetail()}}
	case clientv1.Code_CONFLICT:
		return step{v: vDone, err: &ConflictError{RequestID: requestID, Action: action, Message: rep.GetMessage()}}
	case clientv1.Code_SESSION_EXPIRED:
		*expired = &sid
		return step{v: vMove, addr: addr, err: fmt.Errorf("%s: session expired: %s", addr, rep.GetMessage())}
	}
	return replyStep(addr, rep.GetCode(), rep.GetLeader(), rep.GetEpoch(), rep.GetMessage(), true)
}

// checkRequest refuses, before anything is sent, what every node would
// refuse for its size.
func checkRequest(r *clientv1.SubmitRequest) error {
	var errs []error
	if r.RequestId == "" || len(r.RequestId) > clientv1.MaxRequestID {
		errs = append(errs, fmt.Errorf("request ID of %d bytes, want 1 to %d", len(r.RequestId), clientv1.MaxRequestID))
	}
	if len(r.Action) > clientv1.MaxAction {
		errs = append(errs, fmt.Errorf("action of %d bytes, limit %d", len(r.Action), clientv1.MaxAction))
	}
	if len(r.Payload) > clientv1.MaxPayload {
		errs = append(errs, fmt.Errorf("payload of %d bytes, limit %d", len(r.Payload), clientv1.MaxPayload))
	}
	if r.Ack < clientv1.Ack_ACK_LEADER || r.Ack > clientv1.Ack_ACK_ALL {
		errs = append(errs, fmt.Errorf("ack policy %d is not one of AckLeader, AckOne, AckMajority, AckAll", r.Ack+1))
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: not sent: %w", ErrRefused, errors.Join(errs...))
	}
	return nil
}

// State is what a node's ledger knows of a request ID.
type State uint8

// States.
const (
	// StateUnknown: nothing (never seen, or past its replay window).
	StateUnknown State = iota
	// StateInFlight: an attempt is running.
	StateInFlight
	// StateDone: the request ran; Outcome is its recorded answer.
	StateDone
	// StateFailed: the request ran and recorded a failure; Outcome says
	// which.
	StateFailed
	// StateRejected: a business rule rejected the request and the
	// rejection is recorded (Status.Rejection).
	StateRejected
)

func (s State) String() string {
	switch s {
	case StateUnknown:
		return "unknown"
	case StateInFlight:
		return "in flight"
	case StateDone:
		return "done"
	case StateFailed:
		return "failed"
	case StateRejected:
		return "rejected"
	}
	return fmt.Sprintf("State(%d)", uint8(s))
}

// Status is the leader's ledger entry for a request ID.
type Status struct {
	State   State
	Outcome []byte
	// Rejection is StateRejected's recorded rejection.
	Rejection *RejectedError
	// Time is the WAL time (nanoseconds) of the entry's last decision;
	// Expires the WAL time at which it leaves the ledger.
	Time, Expires int64
	// Epoch is the leader's epoch when it answered.
	Epoch uint64
}

// StatusOption adjusts one Status.
type StatusOption func(*statusOptions)

type statusOptions struct{ key []byte }

// OfTxn asks about a transaction: its ledger entry is in the shard of its
// keys, of which key is one.
func OfTxn(key []byte) StatusOption { return func(o *statusOptions) { o.key = key } }

// Status asks the leader what its ledger knows of requestID, in the shard
// of the Client's Submit session — the shard of every request this Client
// submitted — or, with OfTxn(key), in key's shard, where a transaction on
// key is recorded (opening a session first if there is none). It runs
// nothing, so it never ends with ErrOutcomeUnknown: a spent budget is
// ErrUnavailable.
func (c *Client) Status(ctx context.Context, requestID string, opts ...StatusOption) (Status, error) {
	var o statusOptions
	for _, f := range opts {
		f(&o)
	}
	if requestID == "" || len(requestID) > clientv1.MaxRequestID {
		return Status{}, fmt.Errorf("%w: not sent: request ID of %d bytes, want 1 to %d", ErrRefused, len(requestID), clientv1.MaxRequestID)
	}
	var st Status
	err := c.run(ctx, fmt.Sprintf("status %q", requestID), func(ctx context.Context, addr string) step {
		cc, err := c.conn(addr)
		if err != nil {
			return connStep(addr, err)
		}
		// The ledger is per shard and the session names the shard: the
		// Client's Submit session (renewals stay in its shard) finds what
		// it submitted, the session of a key's shard a transaction on it.
		ss := &c.sess
		if o.key != nil {
			var s step
			var ok bool
			if ss, s, ok = c.keysSession(ctx, cc, addr, o.key); !ok {
				return s
			}
		}
		sid, s, ok := ss.get(ctx, c, cc, addr, nil)
		if !ok {
			return s
		}
		rep, err := clientv1.NewClientClient(cc).Status(c.callContext(ctx), &clientv1.StatusRequest{Session: sid[:], RequestId: requestID})
		if err != nil {
			return rpcStep(addr, err, false)
		}
		st = Status{Outcome: rep.GetOutcome(), Time: rep.GetTime(), Expires: rep.GetExpires(), Epoch: rep.GetEpoch()}
		switch rep.GetCode() {
		case clientv1.Code_UNKNOWN:
			st.State = StateUnknown
		case clientv1.Code_IN_FLIGHT:
			st.State = StateInFlight
		case clientv1.Code_REPLAY:
			st.State = StateDone
		case clientv1.Code_FAILED:
			st.State = StateFailed
		case clientv1.Code_REJECTED:
			st.State, st.Rejection = StateRejected, &RejectedError{RequestID: requestID, Code: rep.GetRejection().GetCode(), Detail: rep.GetRejection().GetDetail()}
		default:
			return replyStep(addr, rep.GetCode(), rep.GetLeader(), rep.GetEpoch(), rep.GetMessage(), false)
		}
		return step{v: vDone, epoch: rep.GetEpoch()}
	})
	if err != nil {
		return Status{}, err
	}
	return st, nil
}

// conn returns the connection to addr, made on first use. gRPC redials it
// under Options.Backoff.
func (c *Client) conn(addr string) (*grpc.ClientConn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, ErrClosed
	}
	if cc := c.conns[addr]; cc != nil {
		return cc, nil
	}
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(c.creds),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: c.opts.Backoff, MinConnectTimeout: c.opts.AttemptTimeout}))
	if err != nil {
		return nil, err
	}
	c.conns[addr] = cc
	return cc, nil
}

// callContext is ctx as an RPC's: with Options.Insecure, naming the
// principal in the metadata an insecure node reads it from.
func (c *Client) callContext(ctx context.Context) context.Context {
	if c.opts.Insecure {
		ctx = metadata.AppendToOutgoingContext(ctx, principalKey, c.opts.Principal)
	}
	return ctx
}

// start is where a call starts: the last node that answered as leader.
func (c *Client) start() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.leader != "" {
		return c.leader
	}
	return c.addrs[0]
}

// heard records that addr answered as leader at epoch, so that calls
// start there; a new address joins the known ones. An answer is proof of
// leadership whatever its epoch, which only raises the highest seen.
func (c *Client) heard(addr string, epoch uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.leader, c.epoch = addr, max(c.epoch, epoch)
	if !slices.Contains(c.addrs, addr) {
		c.addrs = append(c.addrs, addr)
	}
}

// learnShards records the cluster's shard count a session's opening said
// (0: the node did not say).
func (c *Client) learnShards(n uint32) {
	if n == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.shards = n
}

// knownShards is the cluster's shard count, 0 if no session said it yet.
func (c *Client) knownShards() uint32 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.shards
}

// shardSession is the session of shard's keys, made on first use.
func (c *Client) shardSession(shard uint32) *sessions {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.keyed == nil {
		c.keyed = map[uint32]*sessions{}
	}
	s := c.keyed[shard]
	if s == nil {
		s = &sessions{}
		s.initShard(&c.opts, shard)
		c.keyed[shard] = s
	}
	return s
}

// learned records an epoch an answer carried without naming a leader (a
// session opened).
func (c *Client) learned(epoch uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.epoch = max(c.epoch, epoch)
}

// redirected records that from answered NotLeader naming leader to ("":
// unknown) at epoch, and says whether to follow it (invariant 9): a named
// leader at an epoch below the highest seen is stale — from has not heard
// of its successor — and is neither followed nor remembered. A redirect
// away from the leader calls start at forgets it.
func (c *Client) redirected(from, to string, epoch uint64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.leader == from {
		c.leader = ""
	}
	if to == "" || epoch < c.epoch {
		c.epoch = max(c.epoch, epoch)
		return false
	}
	c.leader, c.epoch = to, epoch
	if !slices.Contains(c.addrs, to) {
		c.addrs = append(c.addrs, to)
	}
	return true
}

// Leader is the node calls start at and the highest leader epoch the
// client has seen; "" when no node is known to lead (calls then start at
// the first of Options.Addrs).
func (c *Client) Leader() (addr string, epoch uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.leader, c.epoch
}

// after returns the known address after addr, and how many are known.
func (c *Client) after(addr string) (string, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	i := slices.Index(c.addrs, addr)
	return c.addrs[(i+1)%len(c.addrs)], len(c.addrs)
}

// wait sleeps the backoff before the retry that follows `waits` earlier
// ones, or until ctx ends.
func (c *Client) wait(ctx context.Context, waits int) error {
	return ctxtime.Sleep(ctx, delay(c.opts.Backoff, waits, rand.Float64()))
}
