package replication

import "errors"

// Refusal reasons: why a follower's store refused a batch. They travel in the
// follower's answer (a refused Ack, a transport's refusal) as much as a
// receiver returns them. Each refusal leaves the store exactly as it was;
// the ack that goes with it tells the shipper to resend from the follower's
// applied position.
var (
	// ErrWrongShard: the batch belongs to a shard this receiver does not serve.
	ErrWrongShard = errors.New("replication: batch for wrong shard")
	// ErrStaleEpoch: the batch comes from a leader epoch lower than the highest
	// this follower has committed, or than the one its store promised to a
	// fencing leader during a failover (store.Store.Promise). It fences a
	// deposed leader.
	ErrStaleEpoch = errors.New("replication: batch from stale leader epoch")
	// ErrSeqGap: an event's SeqNo is above its session's HWM+1; events are
	// missing, so the whole batch is refused and nothing past the hole applies.
	ErrSeqGap = errors.New("replication: session SeqNo gap")
	// ErrOutOfOrder: the batch starts beyond the applied position + 1; an earlier
	// batch has not arrived (dropped or reordered in transit).
	ErrOutOfOrder = errors.New("replication: batch ahead of applied position")
	// ErrDiverged: a batch from a newer epoch overlaps LSNs this follower
	// already applied under an older epoch. A promoted leader rewrites the
	// log from its own applied position, so the follower holds entries of a
	// deposed leader that the new history does not have: it must be rebuilt
	// from the new leader (or a snapshot), never patched by skipping.
	ErrDiverged = errors.New("replication: follower history diverged from the leader's")
	// ErrBehindRetention: the follower needs LSNs the leader's log no longer
	// holds (deleted by retention, or before a promoted leader's first LSN),
	// or its position cannot be verified against what the log holds. It must
	// be rebuilt from a snapshot.
	ErrBehindRetention = errors.New("replication: follower behind the leader's retained log")
	// ErrUnknownFollower: a hello whose FollowerID is not registered (or is
	// empty) at the leader, or a method given an unregistered ID.
	ErrUnknownFollower = errors.New("replication: unknown follower")
	// ErrIdentityMismatch: the follower's authenticated identity may not
	// claim its hello's follower ID — its certificate names another
	// follower, names a client (which may not follow, nor fetch a
	// snapshot), or names no identity at all. Only the holder of the
	// certificate issued for an ID may ack as that ID, so a quorum of acks
	// is a quorum of the followers it names.
	ErrIdentityMismatch = errors.New("replication: certificate does not name this follower")
)
