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
	return principal(ctx, s.opts.Insecure)
}

// principal names the caller of ctx as every client service of this
// package does, the leader's and a replica's: its client certificate's
// name (oncewal://client/NAME); another role's certificate is
// PermissionDenied, none Unauthenticated — unless insecure (a plaintext
// server: loopback tests only), where a caller without a certificate is
// named by the PrincipalMetadata metadata.
func principal(ctx context.Context, insecure bool) (string, error) {
	id, err := grpctransport.PeerIdentity(ctx)
	if err != nil && insecure {
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

func (g grpcService) Txn(ctx context.Context, r *clientv1.TxnRequest) (*clientv1.TxnReply, error) {
	who, err := g.s.admit(ctx, checkSession("session", r.GetSession(), false))
	if err != nil {
		return nil, err
	}
	rep := g.s.Txn(ctx, who, r)
	g.s.stats.txn.add(rep.Code)
	return rep, nil
}

func (g grpcService) Get(ctx context.Context, r *clientv1.GetRequest) (*clientv1.GetReply, error) {
	who, err := g.s.admit(ctx, nil)
	if err != nil {
		return nil, err
	}
	rep := g.s.Get(ctx, who, r)
	g.s.stats.get.add(rep.Code)
	return rep, nil
}

func (g grpcService) Range(ctx context.Context, r *clientv1.RangeRequest) (*clientv1.RangeReply, error) {
	who, err := g.s.admit(ctx, nil)
	if err != nil {
		return nil, err
	}
	rep := g.s.Range(ctx, who, r)
	g.s.stats.rng.add(rep.Code)
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
	a := s.once(ctx, sh, request{who: who, sid: sid, id: r.GetRequestId(), action: r.GetAction(), ack: r.GetAck(), fingerprint: r.GetPayload()},
		func() error { return checkSubmit(r) },
		func(c *idempotency.Claim) (wal.Header, []byte, error) {
			stopBeat := s.keepClaim(sh, c)
			events, outcome, err := s.run(ctx, Request{Principal: who, Session: sid, RequestID: r.GetRequestId(), Action: r.GetAction(), Payload: r.GetPayload()})
			stopBeat()
			if err == nil {
				err = s.sameShard(sh, events)
			}
			if err != nil {
				return wal.Header{}, nil, err
			}
			h, err := sh.Commit(c, outcome, events...)
			return h, outcome, err
		})
	return &clientv1.SubmitReply{Code: a.code, Lsn: a.lsn, Epoch: a.epoch, Outcome: a.outcome, Message: a.message, Ack: a.ack, Rejection: a.rejection}
}

// request is what the service runs once: its caller, session, ID, action,
// ack policy and the bytes a retry must repeat (the ledger's fingerprint).
type request struct {
	who, id, action string
	sid             session.ID
	ack             clientv1.Ack
	fingerprint     []byte
}

// answer is the service's answer to a request, whatever its method.
type answer struct {
	code      clientv1.Code
	lsn       uint64
	epoch     uint64
	outcome   []byte
	rejection *clientv1.Rejection
	message   string
	ack       clientv1.Ack
}

// once runs request q on shard sh (the package doc, "Submit"): check
// refuses it before anything is claimed; the claim replays a completed
// request or its recorded rejection, or lets commit run it and log its
// events and outcome in one batch; a rejection commit returns is recorded
// (Fail), any other error releases the claim; the answer waits for the
// ack policy and for Options.Leading.
func (s *Service) once(ctx context.Context, sh *leader.Shard, q request, check func() error,
	commit func(*idempotency.Claim) (wal.Header, []byte, error)) answer {
	a := answer{epoch: sh.Epoch()}
	if err := check(); err != nil {
		return s.refused(a, err)
	}
	// A node that may have lost its leadership runs nothing (invariant 7).
	if err := s.leading(); err != nil {
		a.code, a.message = clientv1.Code_NOT_LEADER, notLeadingMessage(err)
		return a
	}
	ack := max(q.ack, s.opts.MinAck) // invariant 2: never weaker than MinAck
	c, err := sh.Claim(ctx, q.sid, q.who, q.id, q.fingerprint, idempotency.ClaimOptions{Wait: true, Action: q.action})
	if err != nil {
		return s.refused(a, err)
	}
	switch c.Status {
	case idempotency.Replay:
		if c.CachedFailure {
			if rej, ok := decodeRejection(c.Outcome); ok {
				return s.rejected(ctx, sh, q, ack, a, rej)
			}
			// An embedder's Fail on the same ledger, replayed as the
			// refusal it was.
			a.code, a.outcome = clientv1.Code_REFUSED, c.Outcome
			a.message = fmt.Sprintf("request %q failed earlier and its failure is recorded until WAL time %d", q.id, c.Expires)
			return a
		}
		// The ledger shows an outcome only once its batch is applied, so
		// the applied LSN now covers it (invariant 2).
		lsn, _ := sh.Position()
		if err := s.waitAck(ctx, sh, lsn, ack); err != nil {
			return s.unknown(a, q, ack, lsn, err)
		}
		a.code, a.lsn, a.outcome = clientv1.Code_REPLAY, lsn, c.Outcome
		return s.answered(a, q, ack)
	case idempotency.InFlight: // a waiting claim never answers it
		a.code, a.message = clientv1.Code_IN_FLIGHT, fmt.Sprintf("request %q is running; retry with the same request ID", q.id)
		return a
	}
	h, outcome, err := commit(c)
	if err != nil {
		if rej, ok := rejectionOf(err); ok {
			// Recorded under the request ID for as long as a completed
			// request would be: a retry answers the same rejection.
			ferr := sh.Ledger().Fail(c, encodeRejection(rej), sh.Ledger().ReplayWindow())
			if ferr == nil {
				return s.rejected(ctx, sh, q, ack, a, rej)
			}
			err = fmt.Errorf("%w (recording the rejection failed: %w)", err, ferr)
		}
		// Nothing was logged (a commit is atomic): free the ID so a retry
		// runs again (invariant 4). A failed log cannot release; the
		// claim then ends with its lease.
		if rerr := sh.Ledger().Release(c); rerr != nil {
			s.log.Warn("clientapi: releasing a claim after a failed request", "request_id", q.id, "principal", q.who, "err", rerr)
		}
		return s.refused(a, err)
	}
	if err := s.waitAck(ctx, sh, h.LastLSN(), ack); err != nil {
		return s.unknown(a, q, ack, h.LastLSN(), err)
	}
	a.code, a.lsn, a.outcome = clientv1.Code_OK, h.LastLSN(), outcome
	return s.answered(a, q, ack)
}

// rejected answers a request whose rejection is recorded, once the record
// is durable under ack: it is an answer as final as an outcome.
func (s *Service) rejected(ctx context.Context, sh *leader.Shard, q request, ack clientv1.Ack, a answer, rej *clientv1.Rejection) answer {
	lsn, _ := sh.Position()
	if err := s.waitAck(ctx, sh, lsn, ack); err != nil {
		return s.unknown(a, q, ack, lsn, err)
	}
	a.code, a.lsn, a.rejection = clientv1.Code_REJECTED, lsn, rej
	a.message = message(fmt.Sprintf("request %q was rejected (%s: %s); the rejection is recorded: a retry with the same request ID answers it again", q.id, rej.GetCode(), rej.GetDetail()))
	return s.answered(a, q, ack)
}

// answered gives a, an answer durable under ack, if this node still leads
// (invariants 2 and 7), saying so when ack is stronger than the request
// asked for; else the outcome is unknown to the caller.
func (s *Service) answered(a answer, q request, ack clientv1.Ack) answer {
	if err := s.leading(); err != nil {
		s.log.Warn("clientapi: a request's answer withheld: this node's leadership may have ended", "request_id", q.id, "lsn", a.lsn, "err", err)
		return answer{code: clientv1.Code_UNAVAILABLE, epoch: a.epoch, message: message(fmt.Sprintf(
			"request %q is logged at LSN %d and acknowledged under ack policy %v, but this node's leadership may have ended (%v): "+
				"its outcome is unknown: retry with the same request ID at the current leader", q.id, a.lsn, AckName(ack), err))}
	}
	a.ack = ack
	if ack != q.ack && a.message == "" {
		a.message = fmt.Sprintf("answered under ack policy %v, this node's minimum (the request asked for %v)", AckName(ack), AckName(q.ack))
	}
	return a
}

// checkSubmit refuses a request whose fields are out of the service's
// limits (clientv1's), before anything is claimed.
func checkSubmit(r *clientv1.SubmitRequest) error {
	errs := checkRequest(r.GetSession(), r.GetAck(), r.GetAction())
	if n := len(r.GetPayload()); n > clientv1.MaxPayload {
		errs = append(errs, fmt.Errorf("payload of %d bytes, limit %d", n, clientv1.MaxPayload))
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %w", errRefused, errors.Join(errs...))
	}
	return nil
}

// checkRequest reports what every request that runs checks before it is
// claimed: its session ID, its ack policy and its action's size.
func checkRequest(session []byte, ack clientv1.Ack, action string) []error {
	var errs []error
	if err := checkSession("session", session, false); err != nil {
		errs = append(errs, err)
	}
	if !validAck(ack) {
		errs = append(errs, fmt.Errorf("ack policy %d is not 0 (leader), 1 (one), 2 (majority) or 3 (all)", ack))
	}
	if n := len(action); n > clientv1.MaxAction {
		errs = append(errs, fmt.Errorf("action of %d bytes, limit %d", n, clientv1.MaxAction))
	}
	return errs
}

// validAck says whether a is an ack policy.
func validAck(a clientv1.Ack) bool { return a >= clientv1.Ack_ACK_LEADER && a <= clientv1.Ack_ACK_ALL }

// leading is Options.Leading's verdict: nil while this node leads.
func (s *Service) leading() error {
	if s.opts.Leading == nil {
		return nil
	}
	return s.opts.Leading()
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

// refused answers a request that logged nothing of its own.
func (s *Service) refused(a answer, err error) answer {
	a.code = Decide(err)
	a.message = message(err.Error() + ": " + remedy(a.code))
	if a.code == clientv1.Code_UNAVAILABLE {
		s.log.Warn("clientapi: request not served", "err", err)
	}
	return a
}

// unknown answers a request whose batch is logged but not acknowledged
// under its policy: the caller cannot know whether it will survive a
// failover (invariant 3).
func (s *Service) unknown(a answer, q request, ack clientv1.Ack, lsn uint64, err error) answer {
	why := err.Error()
	if errors.Is(err, leader.ErrNoFollowers) || errors.Is(err, leader.ErrNotShipping) {
		why += " (this ack policy cannot be met until followers are registered; ack leader can)"
	}
	a.code = clientv1.Code_UNAVAILABLE
	a.message = message(fmt.Sprintf("request %q is logged at LSN %d but not acknowledged under ack policy %v: %s; its outcome is unknown: %s",
		q.id, lsn, AckName(ack), why, remedy(clientv1.Code_UNAVAILABLE)))
	s.log.Warn("clientapi: ack wait ended", "request_id", q.id, "lsn", lsn, "ack", AckName(ack), "err", err)
	return a
}

// message makes a reply's text fit the wire: valid UTF-8 (a handler's
// error may hold any bytes), at most clientv1.MaxMessage bytes.
func message(m string) string { return cut(m, clientv1.MaxMessage) }
