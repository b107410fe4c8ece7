package clientapi

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	clientv1 "github.com/oncewal/oncewal/proto/oncewal/client/v1"
	"github.com/oncewal/oncewal/replication/grpctransport"
)

// NotLeader is the client service of a node that does not lead (a
// follower): every well-formed call answers NOT_LEADER with the leader's
// address and epoch as where reports them now ("" and 0: unknown), and
// runs nothing (invariant 6). It looks at no identity: it tells only where
// the leader is, which the node's own configuration says.
func NotLeader(where func() (leader string, epoch uint64)) grpctransport.Service {
	return grpctransport.Service{
		Name:       clientv1.Client_ServiceDesc.ServiceName,
		MaxRequest: clientv1.MaxRequest,
		Register:   func(r grpc.ServiceRegistrar) { clientv1.RegisterClientServer(r, notLeader{where: where}) },
	}
}

const notLeaderMessage = "this node does not lead: send the request to the leader"

type notLeader struct {
	clientv1.UnimplementedClientServer
	where func() (string, uint64)
}

func (n notLeader) Submit(_ context.Context, r *clientv1.SubmitRequest) (*clientv1.SubmitReply, error) {
	if err := checkSession("session", r.GetSession(), false); err != nil {
		return nil, status.Error(codes.InvalidArgument, "clientapi: "+err.Error())
	}
	addr, epoch := n.where()
	return &clientv1.SubmitReply{Code: clientv1.Code_NOT_LEADER, Leader: addr, Epoch: epoch, Message: notLeaderMessage}, nil
}

func (n notLeader) Status(_ context.Context, r *clientv1.StatusRequest) (*clientv1.StatusReply, error) {
	if err := checkSession("session", r.GetSession(), false); err != nil {
		return nil, status.Error(codes.InvalidArgument, "clientapi: "+err.Error())
	}
	addr, epoch := n.where()
	return &clientv1.StatusReply{Code: clientv1.Code_NOT_LEADER, Leader: addr, Epoch: epoch, Message: notLeaderMessage}, nil
}

func (n notLeader) OpenSession(_ context.Context, r *clientv1.OpenSessionRequest) (*clientv1.OpenSessionReply, error) {
	if err := checkSession("near", r.GetNear(), true); err != nil {
		return nil, status.Error(codes.InvalidArgument, "clientapi: "+err.Error())
	}
	addr, epoch := n.where()
	return &clientv1.OpenSessionReply{Code: clientv1.Code_NOT_LEADER, Leader: addr, Epoch: epoch, Message: notLeaderMessage}, nil
}

func (n notLeader) Txn(_ context.Context, r *clientv1.TxnRequest) (*clientv1.TxnReply, error) {
	if err := checkSession("session", r.GetSession(), false); err != nil {
		return nil, status.Error(codes.InvalidArgument, "clientapi: "+err.Error())
	}
	addr, epoch := n.where()
	return &clientv1.TxnReply{Code: clientv1.Code_NOT_LEADER, Leader: addr, Epoch: epoch, Message: notLeaderMessage}, nil
}

func (n notLeader) Get(context.Context, *clientv1.GetRequest) (*clientv1.GetReply, error) {
	addr, epoch := n.where()
	return &clientv1.GetReply{Code: clientv1.Code_NOT_LEADER, Leader: addr, Epoch: epoch, Message: notLeaderMessage}, nil
}

func (n notLeader) Range(context.Context, *clientv1.RangeRequest) (*clientv1.RangeReply, error) {
	addr, epoch := n.where()
	return &clientv1.RangeReply{Code: clientv1.Code_NOT_LEADER, Leader: addr, Epoch: epoch, Message: notLeaderMessage}, nil
}
