package replication

import (
	"errors"
	"fmt"
	"math"
)

// MaxEpoch is the highest leader epoch oncewal accepts anywhere: a leader's
// epoch, a promotion's, a store's committed one (invariant 5 of DESIGN:
// epochs only grow and never wrap). It is math.MaxInt64, not the u64 the
// wire and the stores carry, because the coordinator the deployment is
// moving to (etcd) hands out epochs from its revisions, which are int64: an
// epoch above MaxInt64 could never be compared with one the coordinator
// issues, while every epoch up to it can be issued either way. At one
// promotion a second it lasts for 292 billion years, so the bound costs
// nothing but turns a wrap — highest + 1 = 0, two leaders that share an
// epoch and cannot fence each other — into a refusal.
const MaxEpoch = math.MaxInt64

// ErrEpochExhausted: an epoch above MaxEpoch was asked for, or a store or
// WAL already holds MaxEpoch (or more, written by an older binary) so that
// no higher epoch is left for a promotion. Nothing was changed.
var ErrEpochExhausted = errors.New("replication: leader epoch out of range")

// CheckEpoch refuses an epoch above MaxEpoch with ErrEpochExhausted; what
// names the entry the epoch came from (a flag, an option).
func CheckEpoch(what string, epoch uint64) error {
	if epoch <= MaxEpoch {
		return nil
	}
	return fmt.Errorf("%w: %s %d is above the highest epoch %d (replication.MaxEpoch): give an epoch in 1..%d",
		ErrEpochExhausted, what, epoch, uint64(MaxEpoch), uint64(MaxEpoch))
}

// NextEpoch is the epoch a promotion takes over highest, the highest epoch
// seen: highest + 1, or ErrEpochExhausted when highest is already at or
// above MaxEpoch (it never wraps to 0). seenBy names where highest was seen.
func NextEpoch(highest uint64, seenBy string) (uint64, error) {
	if highest >= MaxEpoch {
		return 0, fmt.Errorf("%w: %s holds epoch %d, and no epoch above it is left (replication.MaxEpoch is %d): "+
			"this shard cannot be promoted again; start a new deployment from fresh directories",
			ErrEpochExhausted, seenBy, highest, uint64(MaxEpoch))
	}
	return highest + 1, nil
}
