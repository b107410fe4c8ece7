package coord

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// ErrClosed is what a Coordinator (and its leaderships) answer after Close.
var ErrClosed = errors.New("coord: coordinator closed (open a new one)")

// ErrLostLeadership is what a Leadership answers once its election key is
// gone (resigned, lease revoked or expired, coordinator closed): it is not
// the leader any more, and must stop acting as one and campaign again
// (invariant 2).
var ErrLostLeadership = errors.New("coord: not the leader any more (stop acting as leader, campaign again)")

// ErrUnavailable wraps a failure to reach the coordination engine (etcd):
// nothing is known to have been written; retry when it answers again.
var ErrUnavailable = errors.New("coord: etcd unavailable (check the endpoints and that etcd has a quorum, then retry)")

// ErrBadInput is what a call answers for a bad cluster name, candidate or
// key (invariant 6); nothing is written.
var ErrBadInput = errors.New("coord: bad input")

// Candidate is the value a node campaigns with: who it is and where its
// followers and clients reach it.
type Candidate struct {
	ID   string `json:"id"`
	Addr string `json:"addr"`
}

// Leader is a cluster's leader as observed: the zero Leader means none.
type Leader struct {
	Candidate
	// Epoch is the leader's election key create revision (invariant 1).
	Epoch uint64
}

// Op is one write of a guarded transaction; Put and Delete make them.
type Op struct {
	key    string
	value  []byte
	delete bool
}

// Put sets key (relative to the cluster's data space) to value.
func Put(key string, value []byte) Op { return Op{key: key, value: value} }

// Delete removes key (relative to the cluster's data space).
func Delete(key string) Op { return Op{key: key, delete: true} }

// Coordinator elects one leader per cluster. Its methods are safe for
// concurrent use; a node uses one Coordinator for all its campaigns.
type Coordinator interface {
	// Campaign blocks until me leads cluster, ctx ends, or the coordinator
	// closes. The Leadership returned was confirmed (invariant 3).
	Campaign(ctx context.Context, cluster string, me Candidate) (Leadership, error)
	// Observe reports cluster's leader, first as it is now, then at each
	// change (invariant 5); the channel closes when ctx ends or the
	// coordinator closes.
	Observe(ctx context.Context, cluster string) (<-chan Leader, error)
	// Get reads a key of cluster's data space (written by Guarded).
	Get(ctx context.Context, cluster, key string) (value []byte, ok bool, err error)
	// Close ends every leadership it holds (their keys deleted, so others
	// win without waiting for a TTL) and every observation.
	Close() error
}

// Leadership is one term of leadership of one cluster.
type Leadership interface {
	// Leader is this term: the candidate and its epoch.
	Leader() Leader
	// Epoch is this term's epoch (invariant 1).
	Epoch() uint64
	// Done closes when the leadership may be lost (invariant 4).
	Done() <-chan struct{}
	// Guarded applies ops atomically only if this term still holds the
	// election key (invariant 2); with no ops it confirms leadership.
	// It fails with ErrLostLeadership when the term is over.
	Guarded(ctx context.Context, ops ...Op) error
	// Resign ends the term, deleting its key so that the next candidate
	// wins at once. Resigning twice is harmless.
	Resign(ctx context.Context) error
}

// checkCluster refuses a cluster name that would escape its key space.
func checkCluster(cluster string) error {
	if cluster == "" || strings.ContainsAny(cluster, "/\x00") {
		return fmt.Errorf("%w: cluster name %q: give a non-empty name without '/'", ErrBadInput, cluster)
	}
	return nil
}

func checkCampaign(cluster string, me Candidate) error {
	if err := checkCluster(cluster); err != nil {
		return err
	}
	if me.ID == "" {
		return fmt.Errorf("%w: candidate with an empty ID: give the node's ID", ErrBadInput)
	}
	return nil
}

func checkOps(ops []Op) error {
	for _, op := range ops {
		if op.key == "" {
			return fmt.Errorf("%w: an op with an empty key: name the key to write", ErrBadInput)
		}
	}
	return nil
}
