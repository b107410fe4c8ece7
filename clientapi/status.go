package clientapi

import (
	"fmt"

	"github.com/oncewal/oncewal/idempotency"
	"github.com/oncewal/oncewal/leader"
	clientv1 "github.com/oncewal/oncewal/proto/oncewal/client/v1"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/wal"
)

// Status answers what the ledger of the shard of r's session holds for the
// caller's request ID now: Replay (completed, with its outcome), Failed,
// InFlight or Unknown (nothing, or past its replay window) — or NotLeader
// if Options.Leading says this node may no longer lead (invariant 7): its
// ledger may then lack what the new leader has run.
func (s *Service) Status(who string, r *clientv1.StatusRequest) *clientv1.StatusReply {
	sh := s.l.For(sessionID(r.GetSession()))
	rep := s.status(who, sh, r)
	if err := s.leading(); err != nil {
		return &clientv1.StatusReply{Code: clientv1.Code_NOT_LEADER, Epoch: rep.Epoch, Message: notLeadingMessage(err)}
	}
	return rep
}

func (s *Service) status(who string, sh *leader.Shard, r *clientv1.StatusRequest) *clientv1.StatusReply {
	rep := &clientv1.StatusReply{Epoch: sh.Epoch()}
	e, found, err := sh.Ledger().Lookup(who, r.RequestId)
	if err != nil {
		rep.Code = Decide(err)
		rep.Message = message(err.Error() + ": " + remedy(rep.Code))
		return rep
	}
	if !found {
		rep.Code = clientv1.Code_UNKNOWN
		return rep
	}
	rep.Time, rep.Expires = e.Time, e.Expires
	switch e.State {
	case idempotency.StateCompleted:
		rep.Code, rep.Outcome = clientv1.Code_REPLAY, e.Outcome
	case idempotency.StateFailed:
		if rej, ok := decodeRejection(e.Outcome); ok {
			rep.Code, rep.Rejection = clientv1.Code_REJECTED, rej
		} else {
			rep.Code, rep.Outcome = clientv1.Code_FAILED, e.Outcome
		}
	case idempotency.StateInFlight:
		rep.Code = clientv1.Code_IN_FLIGHT
	default: // a live entry is never a release tombstone
		rep.Code = clientv1.Code_UNKNOWN
	}
	return rep
}

// maxDraws bounds the session IDs OpenSession draws per shard for one in
// the shard asked for: each draw lands there with probability 1/shards, so 64
// draws per shard all miss with probability below e^-64.
const maxDraws = 64

// OpenSession logs the opening of a new random session in shard r.Shard —
// or with r.Near set, in the shard of r.Near (invariant 5) — and answers
// it with its shard, the cluster's shard count, the retention horizon,
// after which an idle session expires, and the epoch;
// or NotLeader if Options.Leading says this node may no longer lead, asked
// before the session is logged and again before it is answered (invariant
// 7: a session logged in between is never used, and expires idle).
func (s *Service) OpenSession(r *clientv1.OpenSessionRequest) *clientv1.OpenSessionReply {
	if err := s.leading(); err != nil {
		return &clientv1.OpenSessionReply{Code: clientv1.Code_NOT_LEADER, Epoch: s.l.For(sessionID(r.GetNear())).Epoch(), Message: notLeadingMessage(err)}
	}
	rep := s.openSession(r)
	if err := s.leading(); err != nil {
		return &clientv1.OpenSessionReply{Code: clientv1.Code_NOT_LEADER, Epoch: rep.Epoch, Message: notLeadingMessage(err)}
	}
	return rep
}

func (s *Service) openSession(r *clientv1.OpenSessionRequest) *clientv1.OpenSessionReply {
	id := session.NewID()
	want, err := s.l.Shard(r.GetShard())
	if err != nil {
		return &clientv1.OpenSessionReply{Code: clientv1.Code_REFUSED, Epoch: s.l.For(id).Epoch(), Shards: uint32(s.l.Shards()),
			Message: message(fmt.Sprintf("%v: this cluster has shards 0 to %d", err, s.l.Shards()-1))}
	}
	if len(r.GetNear()) > 0 {
		want = s.l.For(sessionID(r.GetNear()))
	}
	for i := 0; s.l.For(id) != want; i++ {
		if i == maxDraws*s.l.Shards() {
			return &clientv1.OpenSessionReply{Code: clientv1.Code_UNAVAILABLE, Epoch: want.Epoch(),
				Message: fmt.Sprintf("no session ID of shard %d in %d draws; retry", want.ID(), i)}
		}
		id = session.NewID()
	}
	sh := s.l.For(id)
	rep := &clientv1.OpenSessionReply{Epoch: sh.Epoch()}
	if _, err := sh.Append(wal.Event{Op: wal.OpOpen, Session: id}); err != nil {
		rep.Code = Decide(err)
		if rep.Code == clientv1.Code_SESSION_EXPIRED { // a drawn ID is new; never expected
			rep.Code = clientv1.Code_UNAVAILABLE
		}
		rep.Message = message(err.Error() + ": retry")
		return rep
	}
	rep.Code, rep.Session, rep.Horizon = clientv1.Code_OK, id[:], int64(sh.Store().Options().RetentionHorizon)
	rep.Shard, rep.Shards = sh.ID(), uint32(s.l.Shards())
	return rep
}
