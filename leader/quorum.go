package leader

import (
	"errors"
	"fmt"
	"time"
)

// Errors of the acknowledgement policies (invariant 4).
var (
	// ErrAckTimeout: WaitAcked did not see its policy's share of the
	// followers acknowledge the LSN within Options.AckTimeout. The batch is
	// in the leader's synced WAL, so its fate is unknown, not lost: the
	// message says how many followers acknowledged it and how many are
	// connected, what the policy needs, and what to check.
	ErrAckTimeout = errors.New("leader: acknowledgement timed out")
	// ErrQuorumLost: fewer followers are connected than a policy needs
	// (Quorum), so WaitAcked under it cannot succeed until enough
	// reconnect.
	ErrQuorumLost = errors.New("leader: quorum lost")
)

// checkFollowers is the advice both errors end with.
const checkFollowers = "check that the followers run and reach this leader (their logs, this leader's per-follower stats and /metrics; a stopped follower's position: oncewal inspect DIR); majority still works with one of two followers down"

// ackTimeout is ErrAckTimeout for lsn of shard s after waiting d.
func (s *Shard) ackTimeout(lsn uint64, policy AckPolicy, d time.Duration) error {
	n, connected, acked := s.ship.fan.replicas(lsn)
	return fmt.Errorf("%w: shard %d: LSN %d acknowledged by %d of %d followers (%d connected) within %v, %v needs %d; the batch is logged, its outcome unknown: %s",
		ErrAckTimeout, s.id, lsn, acked, n, connected, d, policy, policy.Need(n), checkFollowers)
}

// Quorum reports whether enough of the shard's registered followers are
// connected to meet policy: nil, or ErrQuorumLost naming how many are
// connected and how many policy needs. It is a readiness signal, not a
// promise: a connected follower may still be slow to acknowledge
// (WaitAcked's AckTimeout bounds that). With no registered follower no
// policy can be met: ErrNoFollowers.
func (s *Shard) Quorum(policy AckPolicy) error {
	if s.ship == nil {
		return ErrNotShipping
	}
	if policy < AckOne || policy > AckAll {
		return fmt.Errorf("%w: %v", ErrBadAckPolicy, policy)
	}
	n, connected, _ := s.ship.fan.replicas(0)
	if n == 0 {
		return fmt.Errorf("shard %d: %w", s.id, ErrNoFollowers)
	}
	if need := policy.Need(n); connected < need {
		return fmt.Errorf("%w: shard %d: %d of %d followers connected, %v needs %d: %s",
			ErrQuorumLost, s.id, connected, n, policy, need, checkFollowers)
	}
	return nil
}

// Quorum is Shard.Quorum over every shard: nil when each meets policy,
// else every shard's error joined.
func (l *Leader) Quorum(policy AckPolicy) error {
	var errs []error
	for _, s := range l.shards {
		errs = append(errs, s.Quorum(policy))
	}
	return errors.Join(errs...)
}
