package clientapi

import (
	"context"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/oncewal/oncewal/internal/clientwire"
	"github.com/oncewal/oncewal/replication/grpctransport"
)

// NotLeader is the client service of a node that does not lead (a
// follower): every call that decodes answers NotLeader with the leader's
// address and epoch as where reports them now ("" and 0: unknown), and
// runs nothing (invariant 6). It looks at no identity: it tells only where
// the leader is, which the node's own configuration says.
func NotLeader(where func() (leader string, epoch uint64)) grpctransport.UnaryService {
	const msg = "this node does not lead: send the request to the leader"
	decoded := func(in []byte, m interface{ Unmarshal([]byte) error }) error {
		if err := m.Unmarshal(in); err != nil {
			return status.Error(codes.InvalidArgument, err.Error())
		}
		return nil
	}
	return grpctransport.UnaryService{
		Name:       clientwire.Service,
		MaxRequest: clientwire.MaxFrame,
		Methods: map[string]grpctransport.UnaryHandler{
			"Submit": func(_ context.Context, in []byte) ([]byte, error) {
				if err := decoded(in, &clientwire.SubmitRequest{}); err != nil {
					return nil, err
				}
				addr, epoch := where()
				return (&clientwire.SubmitReply{Code: clientwire.NotLeader, Leader: addr, Epoch: epoch, Message: msg}).Marshal(), nil
			},
			"Status": func(_ context.Context, in []byte) ([]byte, error) {
				if err := decoded(in, &clientwire.StatusRequest{}); err != nil {
					return nil, err
				}
				addr, epoch := where()
				return (&clientwire.StatusReply{Code: clientwire.NotLeader, Leader: addr, Epoch: epoch, Message: msg}).Marshal(), nil
			},
			"OpenSession": func(_ context.Context, in []byte) ([]byte, error) {
				if err := decoded(in, &clientwire.OpenSessionRequest{}); err != nil {
					return nil, err
				}
				addr, epoch := where()
				return (&clientwire.OpenSessionReply{Code: clientwire.NotLeader, Leader: addr, Epoch: epoch, Message: msg}).Marshal(), nil
			},
		},
	}
}
