package clientapi

import (
	"context"
	"fmt"

	"github.com/oncewal/oncewal/idempotency"
	"github.com/oncewal/oncewal/internal/clientwire"
	"github.com/oncewal/oncewal/leader"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/wal"
)

func (s *Service) statusFrame(ctx context.Context, in []byte) ([]byte, error) {
	var r clientwire.StatusRequest
	who, err := s.admit(ctx, in, &r)
	if err != nil {
		return nil, err
	}
	rep := s.Status(who, &r)
	s.stats.status.add(rep.Code)
	return rep.Marshal(), nil
}

// Status answers what the ledger of the shard of r's session holds for the
// caller's request ID now: Replay (completed, with its outcome), Failed,
// InFlight or Unknown (nothing, or past its replay window) — or NotLeader
// if Options.Leading says this node may no longer lead (invariant 7): its
// ledger may then lack what the new leader has run.
func (s *Service) Status(who string, r *clientwire.StatusRequest) clientwire.StatusReply {
	sh := s.l.For(session.ID(r.Session))
	rep := s.status(who, sh, r)
	if err := s.leading(); err != nil {
		return clientwire.StatusReply{Code: clientwire.NotLeader, Epoch: rep.Epoch, Message: notLeadingMessage(err)}
	}
	return rep
}

func (s *Service) status(who string, sh *leader.Shard, r *clientwire.StatusRequest) clientwire.StatusReply {
	rep := clientwire.StatusReply{Epoch: sh.Epoch()}
	e, found, err := sh.Ledger().Lookup(who, r.RequestID)
	if err != nil {
		rep.Code = Decide(err)
		rep.Message = message(err.Error() + ": " + remedy(rep.Code))
		return rep
	}
	if !found {
		rep.Code = clientwire.Unknown
		return rep
	}
	rep.Time, rep.Expires = e.Time, e.Expires
	switch e.State {
	case idempotency.StateCompleted:
		rep.Code, rep.Outcome = clientwire.Replay, e.Outcome
	case idempotency.StateFailed:
		rep.Code, rep.Outcome = clientwire.Failed, e.Outcome
	case idempotency.StateInFlight:
		rep.Code = clientwire.InFlight
	default: // a live entry is never a release tombstone
		rep.Code = clientwire.Unknown
	}
	return rep
}

func (s *Service) openSessionFrame(ctx context.Context, in []byte) ([]byte, error) {
	var r clientwire.OpenSessionRequest
	if _, err := s.admit(ctx, in, &r); err != nil {
		return nil, err
	}
	rep := s.OpenSession(&r)
	s.stats.open.add(rep.Code)
	return rep.Marshal(), nil
}

// maxDraws bounds the session IDs OpenSession draws per shard for one in
// Near's shard: each draw lands there with probability 1/shards, so 64
// draws per shard all miss with probability below e^-64.
const maxDraws = 64

// OpenSession logs the opening of a new random session — with r.HasNear,
// one in the shard of r.Near (invariant 5) — and answers it with the
// retention horizon, after which an idle session expires, and the epoch;
// or NotLeader if Options.Leading says this node may no longer lead, asked
// before the session is logged and again before it is answered (invariant
// 7: a session logged in between is never used, and expires idle).
func (s *Service) OpenSession(r *clientwire.OpenSessionRequest) clientwire.OpenSessionReply {
	if err := s.leading(); err != nil {
		return clientwire.OpenSessionReply{Code: clientwire.NotLeader, Epoch: s.l.For(session.ID(r.Near)).Epoch(), Message: notLeadingMessage(err)}
	}
	rep := s.openSession(r)
	if err := s.leading(); err != nil {
		return clientwire.OpenSessionReply{Code: clientwire.NotLeader, Epoch: rep.Epoch, Message: notLeadingMessage(err)}
	}
	return rep
}

func (s *Service) openSession(r *clientwire.OpenSessionRequest) clientwire.OpenSessionReply {
	id := session.NewID()
	if r.HasNear {
		want := s.l.For(session.ID(r.Near))
		for i := 0; s.l.For(id) != want; i++ {
			if i == maxDraws*s.l.Shards() {
				return clientwire.OpenSessionReply{Code: clientwire.Unavailable, Epoch: want.Epoch(),
					Message: fmt.Sprintf("no session ID of shard %d in %d draws; retry", want.ID(), i)}
			}
			id = session.NewID()
		}
	}
	sh := s.l.For(id)
	rep := clientwire.OpenSessionReply{Epoch: sh.Epoch()}
	if _, err := sh.Append(wal.Event{Op: wal.OpOpen, Session: id}); err != nil {
		rep.Code = Decide(err)
		if rep.Code == clientwire.SessionExpired { // a drawn ID is new; never expected
			rep.Code = clientwire.Unavailable
		}
		rep.Message = message(err.Error() + ": retry")
		return rep
	}
	rep.Code, rep.Session, rep.Horizon = clientwire.OK, id, int64(sh.Store().Options().RetentionHorizon)
	return rep
}
