package node

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/oncewal/oncewal/coord"
	"github.com/oncewal/oncewal/follower"
	"github.com/oncewal/oncewal/internal/badopts"
	"github.com/oncewal/oncewal/leader"
	"github.com/oncewal/oncewal/replication"
)

// ErrBadOptions is what Options.Validate wraps, with every problem.
var ErrBadOptions = errors.New("node: bad options")

// DefaultFenceTimeout bounds a winner's wait for its fencing quorum before it
// resigns and campaigns again (a member that stopped answering lets another
// try); the default lease TTL's length, so a failover that needs a second
// term still ends within about two TTLs.
const DefaultFenceTimeout = coord.DefaultLeaseTTL

// Options configures a Node. Zero fields take the defaults in their comments;
// Open validates the result and reports every problem at once.
type Options struct {
	// Coordinator elects the cluster's leader and keeps its records
	// (required). The node does not close it.
	Coordinator coord.Coordinator
	// Cluster names the cluster in the coordinator (required; no '/').
	Cluster string
	// ID is this member's stable ID (required): its followers' hello ID,
	// its candidate ID and its key in members (replication.ValidFollowerID,
	// not empty).
	ID string
	// Dir is the node's directory (required): its NODE file, its replica
	// (the shards' stores, and the WAL while it leads) and the last deposed
	// replica.
	Dir string
	// Shards is the cluster's shard count. Default 1. Every member must
	// give the same; the stores refuse another (store.ErrShardCount).
	Shards int
	// Addr is where the other members and clients reach this node
	// (required): published with each term it wins.
	Addr string
	// Transport connects the node to the others (required): Memory in
	// process, GRPC over the network.
	Transport Transport
	// Ack is the cluster's acknowledgement policy: every client write is
	// answered only once it holds, and a winner's fencing quorum is computed
	// from it (invariant 2). Default leader.AckMajority; the leader alone
	// (0) is not a policy a failover can keep.
	Ack leader.AckPolicy
	// FenceTimeout bounds a winner's wait for its fencing quorum. Default
	// DefaultFenceTimeout.
	FenceTimeout time.Duration
	// Leader is the template of the leader the node opens when it wins
	// (Shards, Epoch, Promote, Followers, Listener and FS are the node's).
	// Its Store options must equal Follower's (the same receive path).
	Leader leader.Options
	// Follower is the template of the follower node the node runs while it
	// follows (its store ID, FS, rebuild source and shard count are the
	// node's; Follower.Follower.Rebuild defaults to RebuildAuto).
	Follower follower.NodeOptions
	// FS holds Dir. Default vfs.Default.
	FS vfs.FS
	// Logger gets a line per term, fence, promotion and step-down. Default
	// slog.Default().
	Logger *slog.Logger
}

// EnsureDefaults fills the zero fields with their defaults, and returns o.
func (o *Options) EnsureDefaults() *Options {
	if o.Shards == 0 {
		o.Shards = 1
	}
	if o.Ack == 0 {
		o.Ack = leader.AckMajority
	}
	if o.FenceTimeout == 0 {
		o.FenceTimeout = DefaultFenceTimeout
	}
	if o.FS == nil {
		o.FS = vfs.Default
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// Validate reports every problem of o, joined and wrapping ErrBadOptions.
func (o *Options) Validate() error {
	var problems []error
	if o.Coordinator == nil {
		problems = append(problems, errors.New("no Coordinator: give one (coord.NewEtcd)"))
	}
	if o.Cluster == "" {
		problems = append(problems, errors.New("no Cluster: name the cluster"))
	}
	if o.ID == "" {
		problems = append(problems, errors.New("no ID: give this member's ID"))
	} else if err := replication.ValidFollowerID(o.ID); err != nil {
		problems = append(problems, fmt.Errorf("ID: %w", err))
	}
	if o.Dir == "" {
		problems = append(problems, errors.New("no Dir: give the node's directory"))
	}
	if o.Shards < 1 || o.Shards > replication.MaxShards {
		problems = append(problems, fmt.Errorf("Shards %d: give 1..%d", o.Shards, replication.MaxShards))
	}
	if o.Addr == "" {
		problems = append(problems, errors.New("no Addr: give the address other members and clients reach this node at"))
	}
	if o.Transport == nil {
		problems = append(problems, errors.New("no Transport: give one (node.NewMemory, node.NewGRPC)"))
	}
	switch o.Ack {
	case leader.AckOne, leader.AckMajority, leader.AckAll:
	default:
		problems = append(problems, fmt.Errorf("Ack %v: give one, majority or all (a failover cannot keep what the leader alone acknowledged)", o.Ack))
	}
	if o.FenceTimeout <= 0 {
		problems = append(problems, fmt.Errorf("FenceTimeout %v: give a positive duration", o.FenceTimeout))
	}
	ls, fs := o.Leader.Store, o.Follower.Follower.Store
	if ls.WindowCapacity != fs.WindowCapacity || ls.RetentionHorizon != fs.RetentionHorizon {
		problems = append(problems, fmt.Errorf("Leader.Store (window %d, horizon %v) and Follower.Follower.Store (window %d, horizon %v) differ: a member leads and follows the same stores, give both the same",
			ls.WindowCapacity, ls.RetentionHorizon, fs.WindowCapacity, fs.RetentionHorizon))
	}
	return badopts.Wrap(ErrBadOptions, "Options", problems)
}
