package clientapi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/oncewal/oncewal/idempotency"
	"github.com/oncewal/oncewal/internal/pki"
	"github.com/oncewal/oncewal/leader"
	clientv1 "github.com/oncewal/oncewal/proto/oncewal/client/v1"
	"github.com/oncewal/oncewal/replication/grpctransport"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/wal"
)

// Service is the client service of a leader: Submit, Status and
// OpenSession over the leader's shards (see the package doc). It holds no
// resources of its own: it serves until the leader is closed, and then
// answers Unavailable.
type Service struct {
	l     *leader.Leader
	opts  Options
	log   *slog.Logger
	stats counters
}

// New returns the client service of l.
func New(l *leader.Leader, opts *Options) (*Service, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	if err := o.EnsureDefaults().Validate(); err != nil {
		return nil, err
	}
	if l == nil {
		return nil, fmt.Errorf("%w: no leader", ErrBadOptions)
	}
	return &Service{l: l, opts: o, log: o.Logger}, nil
}

// GRPC is the service to put in grpctransport.ServerOptions.Services: the
// generated oncewal.client.v1.Client over this Service, each call's caller
// named by its certificate (or, with Options.Insecure, its metadata).
func (s *Service) GRPC() grpctransport.Service {
	return grpctransport.Service{
		Name:       clientv1.Client_ServiceDesc.ServiceName,
		MaxRequest: clientv1.MaxRequest,
		Register:   func(r grpc.ServiceRegistrar) { clientv1.RegisterClientServer(r, grpcService{s: s}) },
	}
}

// principal is the caller's name, the scope of its requests (invariant
// 1): a client certificate's, or with Options.Insecure the metadata's for
// a caller without one.
func (s *Service) principal(ctx context.Context) (string, error) {
	id, err := grpctransport.PeerIdentity(ctx)
	if err != nil && s.opts.Insecure {
		if md, ok := metadata.FromIncomingContext(ctx); ok {
			if v := md.Get(PrincipalMetadata); len(v) == 1 && v[0] != "" {
				return v[0], nil
			}
		}
		return "", status.Errorf(codes.Unauthenticated, "clientapi: %v, and no %s metadata on this insecure server: name the caller", err, PrincipalMetadata)
	}
	if err != nil {
		return "", status.Errorf(codes.Unauthenticated, "clientapi: %v: the client service needs a client certificate naming oncewal://client/NAME", err)
	}
	if id.Role != pki.RoleClient {
		return "", status.Errorf(codes.PermissionDenied, "clientapi: the certificate names %s: only a client certificate (oncewal://client/NAME) may use the client service", id)
	}
	return id.Name, nil
}

// admit checks a request's fields that do not decode to the service's
// types (malformed: InvalidArgument) and names its caller; a refusal is
// the call's gRPC status.
func (s *Service) admit(ctx context.Context, malformed error) (string, error) {
	if malformed != nil {
		s.stats.malformed.Add(1)
		return "", status.Error(codes.InvalidArgument, "clientapi: "+malformed.Error())
	}
	who, err := s.principal(ctx)
	if err != nil {
		s.stats.denied.Add(1)
	}
	return who, err
}

// grpcService is the generated service's face of a Service.
type grpcService struct {
	clientv1.UnimplementedClientServer
	s *Service
}

func (g grpcService) Submit(ctx context.Context, r *clientv1.SubmitRequest) (*clientv1.SubmitReply, error) {
	who, err := g.s.admit(ctx, checkSession("session", r.GetSession(), false))
	if err != nil {
		return nil, err
	}
	rep := g.s.Submit(ctx, who, r)
	g.s.stats.submit.add(rep.Code)
	return rep, nil
}

func (g grpcService) Status(ctx context.Context, r *clientv1.StatusRequest) (*clientv1.StatusReply, error) {
	who, err := g.s.admit(ctx, checkSession("session", r.GetSession(), false))
	if err != nil {
		return nil, err
	}
	rep := g.s.Status(who, r)
	g.s.stats.status.add(rep.Code)
	return rep, nil
}

func (g grpcService) OpenSession(ctx context.Context, r *clientv1.OpenSessionRequest) (*clientv1.OpenSessionReply, error) {
	if _, err := g.s.admit(ctx, checkSession("near", r.GetNear(), true)); err != nil {
		return nil, err
	}
	rep := g.s.OpenSession(r)
	g.s.stats.open.add(rep.Code)
	return rep, nil
}

// checkSession reports a session ID field that is not SessionIDLen bytes
// (empty allowed when optional).
func checkSession(field string, id []byte, optional bool) error {
	if len(id) == clientv1.SessionIDLen || optional && len(id) == 0 {
		return nil
	}
	return fmt.Errorf("%s of %d bytes, want %d", field, len(id), clientv1.SessionIDLen)
}

// sessionID is the session a checked field names.
func sessionID(b []byte) (id session.ID) {
	copy(id[:], b)
	return id
}

// Submit runs r for the caller named who (its ledger scope) and returns
// the reply (the package doc, "Submit"). It is the method behind the wire,
// for an embedder that authenticates its callers itself.
func (s *Service) Submit(ctx context.Context, who string, r *clientv1.SubmitRequest) *clientv1.SubmitReply {
	sid := sessionID(r.GetSession())
	sh := s.l.For(sid)
	rep := &clientv1.SubmitReply{Epoch: sh.Epoch()}
	if err := checkSubmit(r); err != nil {
		return s.refuse(rep, err)
	}
	// A node that may have lost its leadership runs nothing (invariant 7).
	if err := s.leading(); err != nil {
		return s.notLeading(rep, err)
	}
	ack := max(r.Ack, s.opts.MinAck) // invariant 2: never weaker than MinAck
	c, err := sh.Claim(ctx, sid, who, r.GetRequestId(), r.Payload, idempotency.ClaimOptions{Wait: true, Action: r.Action})
	if err != nil {
		return s.refuse(rep, err)
	}
	switch c.Status {
	case idempotency.Replay:
		if c.CachedFailure {
			// Not this service's (it never records failures): an embedder's
			// Fail on the same ledger, replayed as the refusal it was.
			rep.Code, rep.Outcome = clientv1.Code_REFUSED, c.Outcome
			rep.Message = fmt.Sprintf("request %q failed earlier and its failure is recorded until WAL time %d", r.GetRequestId(), c.Expires)
			return rep
		}
		// The ledger shows an outcome only once its batch is applied, so
		// the applied LSN now covers it (invariant 2).
		lsn, _ := sh.Position()
		if err := s.waitAck(ctx, sh, lsn, ack); err != nil {
			return s.unknown(rep, r, ack, lsn, err)
		}
		rep.Code, rep.Lsn, rep.Outcome = clientv1.Code_REPLAY, lsn, c.Outcome
		return s.answer(rep, r, ack)
	case idempotency.InFlight: // a waiting claim never answers it
		rep.Code, rep.Message = clientv1.Code_IN_FLIGHT, fmt.Sprintf("request %q is running; retry with the same request ID", r.GetRequestId())
		return rep
	}
	stopBeat := s.keepClaim(sh, c)
	events, outcome, err := s.run(ctx, Request{Principal: who, Session: sid, RequestID: r.GetRequestId(), Action: r.GetAction(), Payload: r.GetPayload()})
	stopBeat()
	if err == nil {
		err = s.sameShard(sh, events)
	}
	var h wal.Header
	if err == nil {
		h, err = sh.Commit(c, outcome, events...)
	}
	if err != nil {
		// Nothing was logged (Commit is atomic): free the ID so a retry
		// runs again (invariant 4). A failed log cannot release; the
		// claim then ends with its lease.
		if rerr := sh.Ledger().Release(c); rerr != nil {
			s.log.Warn("clientapi: releasing a claim after a failed request", "request_id", r.GetRequestId(), "principal", who, "err", rerr)
		}
		return s.refuse(rep, err)
	}
	if err := s.waitAck(ctx, sh, h.LastLSN(), ack); err != nil {
		return s.unknown(rep, r, ack, h.LastLSN(), err)
	}
	rep.Code, rep.Lsn, rep.Outcome = clientv1.Code_OK, h.LastLSN(), outcome
	return s.answer(rep, r, ack)
}

// checkSubmit refuses a request whose fields are out of the service's
// limits (clientv1's), before anything is claimed.
func checkSubmit(r *clientv1.SubmitRequest) error {
	var errs []error
	if err := checkSession("session", r.GetSession(), false); err != nil {
		errs = append(errs, err)
	}
	if a := r.GetAck(); a < clientv1.Ack_ACK_LEADER || a > clientv1.Ack_ACK_ALL {
		errs = append(errs, fmt.Errorf("ack policy %d is not 0 (leader), 1 (one), 2 (majority) or 3 (all)", a))
	}
	if n := len(r.GetAction()); n > clientv1.MaxAction {
		errs = append(errs, fmt.Errorf("action of %d bytes, limit %d", n, clientv1.MaxAction))
	}
	if n := len(r.GetPayload()); n > clientv1.MaxPayload {
		errs = append(errs, fmt.Errorf("payload of %d bytes, limit %d", n, clientv1.MaxPayload))
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %w", errRefused, errors.Join(errs...))
	}
	return nil
}

// answer gives rep, an OK or a Replay durable under ack, if this node
// still leads (invariants 2 and 7), saying so when ack is stronger than
// the request asked for; else the outcome is unknown to the caller.
func (s *Service) answer(rep *clientv1.SubmitReply, r *clientv1.SubmitRequest, ack clientv1.Ack) *clientv1.SubmitReply {
	if err := s.leading(); err != nil {
		s.log.Warn("clientapi: a request's answer withheld: this node's leadership may have ended", "request_id", r.GetRequestId(), "lsn", rep.Lsn, "err", err)
		return &clientv1.SubmitReply{Code: clientv1.Code_UNAVAILABLE, Epoch: rep.Epoch, Message: message(fmt.Sprintf(
			"request %q is logged at LSN %d and acknowledged under ack policy %v, but this node's leadership may have ended (%v): "+
				"its outcome is unknown: retry with the same request ID at the current leader", r.GetRequestId(), rep.Lsn, AckName(ack), err))}
	}
	rep.Ack = ack
	if ack != r.Ack {
		rep.Message = fmt.Sprintf("answered under ack policy %v, this node's minimum (the request asked for %v)", AckName(ack), AckName(r.Ack))
	}
	return rep
}

// leading is Options.Leading's verdict: nil while this node leads.
func (s *Service) leading() error {
	if s.opts.Leading == nil {
		return nil
	}
	return s.opts.Leading()
}

// notLeading answers a Submit that ran nothing on a node that may no
// longer lead (invariant 7): NotLeader, the leader unknown, so that the
// caller looks for it with the same request ID.
func (s *Service) notLeading(rep *clientv1.SubmitReply, err error) *clientv1.SubmitReply {
	rep.Code, rep.Message = clientv1.Code_NOT_LEADER, notLeadingMessage(err)
	return rep
}

// notLeadingMessage is the text of every NotLeader a node answers when
// Options.Leading says its leadership may have ended.
func notLeadingMessage(err error) string {
	return message(fmt.Sprintf("this node's leadership may have ended (%v): nothing ran here; send the request, with the same request ID, to the current leader", err))
}

// run calls the handler; a panic is the handler's refusal, not the
// process's end.
func (s *Service) run(ctx context.Context, r Request) (events []wal.Event, outcome []byte, err error) {
	defer func() {
		if p := recover(); p != nil {
			s.log.Error("clientapi: the handler panicked", "request_id", r.RequestID, "principal", r.Principal, "panic", p)
			events, outcome, err = nil, nil, fmt.Errorf("%w: the handler panicked: %v", errRefused, p)
		}
	}()
	events, outcome, err = s.opts.Handler(ctx, r)
	if err != nil {
		return nil, nil, fmt.Errorf("%w by the handler: %w", errRefused, err)
	}
	return events, outcome, nil
}

// keepClaim extends c every Options.Heartbeat while its handler runs, and
// returns the func that stops it; once that returns, no extension runs.
// A timer, not a goroutine: almost every handler ends before the first
// beat.
func (s *Service) keepClaim(sh *leader.Shard, c *idempotency.Claim) (stop func()) {
	every := s.opts.Heartbeat
	if every == 0 {
		every = sh.Ledger().Lease() / 3
	}
	if every < 0 {
		return func() {}
	}
	var (
		mu      sync.Mutex
		stopped bool
		t       *time.Timer
	)
	beat := func() {
		mu.Lock()
		defer mu.Unlock()
		if stopped {
			return
		}
		if _, err := sh.Ledger().Extend(c, 0); err != nil {
			s.log.Warn("clientapi: extending a running request's claim", "request_id", c.Key, "principal", c.Scope, "err", err)
			return // the commit will say what became of the claim
		}
		t.Reset(every)
	}
	mu.Lock()
	t = time.AfterFunc(every, beat)
	mu.Unlock()
	return func() {
		mu.Lock()
		stopped = true
		t.Stop()
		mu.Unlock()
	}
}

// sameShard refuses events of a session another shard logs: a request's
// events and its outcome travel in one batch of one shard's log.
func (s *Service) sameShard(sh *leader.Shard, events []wal.Event) error {
	for i := range events {
		if id := events[i].Session; id != (session.ID{}) && s.l.For(id) != sh {
			return fmt.Errorf("%w: event %d is of session %s, which shard %d logs, not the request's shard %d",
				errRefused, i, id, s.l.For(id).ID(), sh.ID())
		}
	}
	return nil
}

// AckName is an ack policy's name: leader, one, majority or all.
func AckName(a clientv1.Ack) string {
	if n, ok := ackNames[a]; ok {
		return n
	}
	return fmt.Sprintf("ack(%d)", int32(a))
}

var ackNames = map[clientv1.Ack]string{clientv1.Ack_ACK_LEADER: "leader", clientv1.Ack_ACK_ONE: "one", clientv1.Ack_ACK_MAJORITY: "majority", clientv1.Ack_ACK_ALL: "all"}

// waitAck waits until the followers ack asks for hold lsn (AckLeader: the
// batch is in the leader's synced WAL already).
func (s *Service) waitAck(ctx context.Context, sh *leader.Shard, lsn uint64, ack clientv1.Ack) error {
	if ack == clientv1.Ack_ACK_LEADER {
		return nil
	}
	return sh.WaitAcked(ctx, lsn, leader.AckPolicy(ack))
}

// refuse answers a request that logged nothing of its own.
func (s *Service) refuse(rep *clientv1.SubmitReply, err error) *clientv1.SubmitReply {
	rep.Code = Decide(err)
	rep.Message = message(err.Error() + ": " + remedy(rep.Code))
	if rep.Code == clientv1.Code_UNAVAILABLE {
		s.log.Warn("clientapi: request not served", "err", err)
	}
	return rep
}

// unknown answers a request whose batch is logged but not acknowledged
// under its policy: the caller cannot know whether it will survive a
// failover (invariant 3).
func (s *Service) unknown(rep *clientv1.SubmitReply, r *clientv1.SubmitRequest, ack clientv1.Ack, lsn uint64, err error) *clientv1.SubmitReply {
	why := err.Error()
	if errors.Is(err, leader.ErrNoFollowers) || errors.Is(err, leader.ErrNotShipping) {
		why += " (this ack policy cannot be met until followers are registered; ack leader can)"
	}
	rep.Code = clientv1.Code_UNAVAILABLE
	rep.Message = message(fmt.Sprintf("request %q is logged at LSN %d but not acknowledged under ack policy %v: %s; its outcome is unknown: %s",
		r.GetRequestId(), lsn, AckName(ack), why, remedy(clientv1.Code_UNAVAILABLE)))
	s.log.Warn("clientapi: ack wait ended", "request_id", r.GetRequestId(), "lsn", lsn, "ack", AckName(ack), "err", err)
	return rep
}

// message cuts a reply's text to the wire's limit.
func message(m string) string {
	if len(m) > clientv1.MaxMessage {
		m = m[:clientv1.MaxMessage]
	}
	return m
}
