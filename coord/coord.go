package coord

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
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
	// Get reads a key of cluster's data space (written by Guarded or
	// Update).
	Get(ctx context.Context, cluster, key string) (value []byte, ok bool, err error)
	// Watch reports the data keys of cluster under prefix (relative to
	// the data space, as Get's; "" is all of them) with their values,
	// first as they are now, then at each change (invariant 8); the
	// channel closes when ctx ends or the coordinator closes. The maps
	// are the reader's own.
	Watch(ctx context.Context, cluster, prefix string) (<-chan map[string][]byte, error)
	// Update is a read-modify-write of one data key that no leadership
	// guards (invariant 9): fn gets the key's value (ok false if absent)
	// and returns the new one, nil to delete it (an empty, non-nil value
	// is stored); fn runs again if the key changed meanwhile, so it must
	// have no other effect. An error of fn aborts the update and is
	// returned wrapped.
	Update(ctx context.Context, cluster, key string, fn func(old []byte, ok bool) (value []byte, err error)) error
	// LeaseTTL is the lease a leadership lives on: a leader that dies is
	// replaced about one LeaseTTL later (invariant 7).
	LeaseTTL() time.Duration
	// Close ends every leadership it holds (their keys deleted, so others
	// win without waiting for a TTL), every observation and every watch.
	Close() error
}

// Leadership is one term of leadership of one cluster.
type Leadership interface {
	// Leader is this term: the candidate and its epoch.
	Leader() Leader
	// Epoch is this term's epoch (invariant 1).
	Epoch() uint64
	// Done closes when the leadership may be lost (invariant 4), at the
	// latest when Deadline passes (invariant 7).
	Done() <-chan struct{}
	// Deadline is the instant, on this process's monotonic clock, before
	// which no other candidate can have been granted the election key
	// (invariant 7): a leader stops acting as one (acknowledging writes,
	// answering reads as leader) once time.Now() reaches it. It only
	// moves forward while the lease is renewed; once Done has closed it
	// is no later than the moment Done closed. Compare it with time.Now()
	// only: it is no wall-clock time to send or store.
	Deadline() time.Time
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

func checkUpdate(cluster, key string, fn func([]byte, bool) ([]byte, error)) error {
	if err := checkCluster(cluster); err != nil {
		return err
	}
	if err := checkOps([]Op{{key: key}}); err != nil {
		return err
	}
	if fn == nil {
		return fmt.Errorf("%w: update of %q with a nil function: give the function that makes the new value", ErrBadInput, key)
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
