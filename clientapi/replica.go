package clientapi

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"google.golang.org/grpc"

	"github.com/oncewal/oncewal/internal/badopts"
	"github.com/oncewal/oncewal/kv"
	"github.com/oncewal/oncewal/kvroute"
	clientv1 "github.com/oncewal/oncewal/proto/oncewal/client/v1"
	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/replication/grpctransport"
	"github.com/oncewal/oncewal/store"
)

// ReplicaOptions configures Replica.
type ReplicaOptions struct {
	// Shards is the deployment's shard count, which routes a key to its
	// shard (kvroute) as the leader does. Required.
	Shards int
	// Insecure takes a caller's name from the gRPC metadata
	// oncewal-principal when it has no certificate, as Options.Insecure:
	// loopback tests only.
	Insecure bool
	// ReadWait bounds how long a read whose MinLSN a shard has not applied
	// yet waits for it before answering BEHIND. Default DefaultReadWait.
	ReadWait time.Duration
	// Logger gets a line per read a store could not serve. Default
	// slog.Default().
	Logger *slog.Logger
}

// EnsureDefaults fills unset fields with their documented defaults and
// returns o.
func (o *ReplicaOptions) EnsureDefaults() *ReplicaOptions {
	if o.ReadWait == 0 {
		o.ReadWait = DefaultReadWait
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// Validate reports every invalid field wrapping ErrBadOptions.
func (o *ReplicaOptions) Validate() error {
	if o == nil {
		return fmt.Errorf("%w: nil ReplicaOptions", ErrBadOptions)
	}
	var errs []error
	if o.Shards < 1 || o.Shards > replication.MaxShards {
		errs = append(errs, fmt.Errorf("Shards %d: give the deployment's shard count, 1..%d", o.Shards, replication.MaxShards))
	}
	if o.ReadWait < 0 {
		errs = append(errs, fmt.Errorf("ReadWait %v is negative", o.ReadWait))
	}
	return badopts.Wrap(ErrBadOptions, "ReplicaOptions", errs)
}

// Replica is the client service of a replica that does not lead (a
// follower): it serves Get and Range at a MinLSN from the replica's own
// stores (the package doc, "Replica reads"), and answers everything else
// as NotLeader does — a read without MinLSN (linearizable: the leader's),
// Txn, Submit, Status and OpenSession are NOT_LEADER with the leader's
// address and epoch as where reports them. stores returns the current
// store of a shard this replica holds, or an error (a shard it does not
// hold, a store being reopened): it is called for every read and must be
// safe for concurrent use; a store closed under a read answers
// UNAVAILABLE.
func Replica(where func() (leader string, epoch uint64), stores func(shard uint32) (*store.Store, error), opts *ReplicaOptions) (grpctransport.Service, error) {
	var o ReplicaOptions
	if opts != nil {
		o = *opts
	}
	if err := o.EnsureDefaults().Validate(); err != nil {
		return grpctransport.Service{}, err
	}
	if where == nil || stores == nil {
		return grpctransport.Service{}, fmt.Errorf("%w: Replica needs where and stores", ErrBadOptions)
	}
	rs := replicaServer{notLeader: notLeader{where: where}, stores: stores, o: o}
	return grpctransport.Service{
		Name:       clientv1.Client_ServiceDesc.ServiceName,
		MaxRequest: clientv1.MaxRequest,
		Register:   func(r grpc.ServiceRegistrar) { clientv1.RegisterClientServer(r, rs) },
	}, nil
}

// linearizableMessage answers a read without MinLSN on a replica.
const linearizableMessage = "this node does not lead: a read without a minimum LSN is linearizable and only the leader serves it; " +
	"send it to the leader, or give the LSN your write answered as its minimum to read here"

// replicaServer serves reads at a MinLSN; notLeader answers the rest.
type replicaServer struct {
	notLeader
	stores func(uint32) (*store.Store, error)
	o      ReplicaOptions
}

func (rs replicaServer) Get(ctx context.Context, r *clientv1.GetRequest) (*clientv1.GetReply, error) {
	who, err := principal(ctx, rs.o.Insecure)
	if err != nil {
		return nil, err
	}
	addr, epoch := rs.where()
	key := r.GetKey()
	shard := kvroute.Shard(key, rs.o.Shards)
	rep := &clientv1.GetReply{Shard: shard, Epoch: epoch}
	minLSN := minLSNs(r.GetMinLsn())[shard]
	if minLSN == 0 {
		rep.Code, rep.Leader, rep.Message = clientv1.Code_NOT_LEADER, addr, linearizableMessage
		return rep, nil
	}
	if err := kv.CheckRead(who, key, false, 0); err != nil {
		rep.Code, rep.Message = clientv1.Code_REFUSED, message(err.Error()+": "+remedy(clientv1.Code_REFUSED))
		return rep, nil
	}
	var (
		row   kv.Row
		found bool
	)
	rd, snapEpoch := rs.read(ctx, shard, minLSN, addr, epoch, func(x *store.KVSnap) (err error) {
		row, found, err = x.Get(who, key)
		return err
	})
	rep.Code, rep.Lsn, rep.Leader, rep.Message = rd.code, rd.lsn, rd.leader, rd.message
	if rd.code == clientv1.Code_OK {
		rep.Epoch = snapEpoch
		if found {
			rep.Found, rep.Kv = true, &clientv1.KeyValue{Key: key, Value: row.Value, Version: row.Version, ModLsn: row.ModLSN}
		}
	}
	return rep, nil
}

func (rs replicaServer) Range(ctx context.Context, r *clientv1.RangeRequest) (*clientv1.RangeReply, error) {
	who, err := principal(ctx, rs.o.Insecure)
	if err != nil {
		return nil, err
	}
	addr, epoch := rs.where()
	mins := minLSNs(r.GetMinLsn())
	for _, shard := range rangeShards(r.GetPrefix(), rs.o.Shards) {
		if mins[shard] == 0 {
			return &clientv1.RangeReply{Code: clientv1.Code_NOT_LEADER, Leader: addr, Epoch: epoch, Message: message(fmt.Sprintf(
				"shard %d has no minimum LSN in the read: %s", shard, linearizableMessage))}, nil
		}
	}
	return rangeRead(who, r, rs.o.Shards, func(shard uint32, minLSN uint64, fn func(*store.KVSnap) error) (readResult, uint64) {
		rd, snapEpoch := rs.read(ctx, shard, minLSN, addr, epoch, fn)
		if rd.code != clientv1.Code_OK {
			return rd, epoch
		}
		return rd, snapEpoch
	}), nil
}

// read runs fn on one snapshot of shard's store once it has applied minLSN
// (waiting up to ReadWait: BEHIND after it, naming the leader at addr),
// and returns the result and the epoch of the state read. A snapshot of
// an epoch below the leader's (epoch, as where says) has applied nothing
// of the leader's term: it may hold a tail of an older term the leader
// does not have (a diverged replica not rebuilt yet), so it answers BEHIND
// at once rather than anything it read.
func (rs replicaServer) read(ctx context.Context, shard uint32, minLSN uint64, addr string, epoch uint64, fn func(*store.KVSnap) error) (readResult, uint64) {
	if _, err := rs.stores(shard); err != nil {
		return readResult{code: clientv1.Code_NOT_LEADER, leader: addr, message: message(fmt.Sprintf(
			"this replica cannot read shard %d (%v): send the read to the leader", shard, err))}, 0
	}
	applied := func() uint64 {
		st, err := rs.stores(shard)
		if err != nil {
			return 0
		}
		a, _ := st.Position()
		return a
	}
	if err := waitApplied(ctx, applied, shard, minLSN, rs.o.ReadWait); err != nil {
		rd := notCaughtUp(err, applied())
		rd.leader = addr
		return rd, 0
	}
	st, err := rs.stores(shard)
	if err != nil {
		return readResult{code: clientv1.Code_UNAVAILABLE, leader: addr, message: message(fmt.Sprintf(
			"shard %d's store: %v: %s", shard, err, remedy(clientv1.Code_UNAVAILABLE)))}, 0
	}
	var lsn, snapEpoch uint64
	rd := snapRead(st, func(x *store.KVSnap) error {
		lsn, snapEpoch = x.AppliedLSN(), x.Epoch()
		if snapEpoch < epoch {
			return nil // answered BEHIND below: fn's rows are not for this term
		}
		return fn(x)
	})
	if rd.code != clientv1.Code_OK {
		if rd.code == clientv1.Code_UNAVAILABLE {
			rs.o.Logger.Warn("clientapi: a replica read not served", "shard", shard, "err", rd.message)
		}
		rd.leader = addr
		return rd, 0
	}
	if snapEpoch < epoch {
		return readResult{code: clientv1.Code_BEHIND, lsn: lsn, leader: addr, message: message(fmt.Sprintf(
			"%v: shard %d has applied LSN %d of epoch %d but nothing yet of the leader's epoch %d: read from another replica or the leader",
			errBehind, shard, lsn, snapEpoch, epoch))}, 0
	}
	return readResult{code: clientv1.Code_OK, lsn: lsn}, snapEpoch
}
