package leader

import (
	"fmt"

	"github.com/oncewal/oncewal/replication"
)

// LeaderEpoch is the epoch a leader serves at: asked, or when asked is 0
// the higher of stored (the epoch its store has committed) and logged (the
// epoch of its WAL's last batch, the authority: a store rebuilt from the
// log knows none), 1 when both are 0. It is refused below either
// (replication.ErrStaleEpoch) and above replication.MaxEpoch
// (replication.ErrEpochExhausted). walDir names the log in the errors.
func LeaderEpoch(asked, stored, logged uint64, walDir string) (uint64, error) {
	epoch := asked
	if epoch == 0 {
		epoch = max(stored, logged, 1)
		if epoch > replication.MaxEpoch {
			return 0, fmt.Errorf("%w: the store or the WAL in %s holds epoch %d, above the highest epoch %d (replication.MaxEpoch), "+
				"as a binary that let epochs wrap left it; no leader can serve it: start a new deployment from fresh directories",
				replication.ErrEpochExhausted, walDir, epoch, uint64(replication.MaxEpoch))
		}
	}
	if err := replication.CheckEpoch("leader epoch", epoch); err != nil {
		return 0, err
	}
	if epoch < stored {
		return 0, fmt.Errorf("%w: leader epoch %d, store has committed epoch %d", replication.ErrStaleEpoch, epoch, stored)
	}
	if epoch < logged {
		return 0, fmt.Errorf("%w: leader epoch %d is below epoch %d of the last batch of the WAL in %s: "+
			"give no epoch (--epoch 0) to continue at the log's, or one above it to raise it", replication.ErrStaleEpoch, epoch, logged, walDir)
	}
	return epoch, nil
}

// CheckPromise refuses serving at epoch over a store that promised a higher
// epoch to a fencing leader (store.Store.Promise; promise 0: none) with
// replication.ErrStaleEpoch: the followers that made that promise refuse
// every batch below it, and a leader must never serve below a promise its
// own store made. Serving at the promised epoch is the normal case — the
// winner of the election its followers promised is promoted at it. where
// names the store in the error.
func CheckPromise(epoch, promise uint64, where string) error {
	if epoch >= promise {
		return nil
	}
	return fmt.Errorf("%w: leader epoch %d is below epoch %d, which %s promised to a fencing leader during a failover: "+
		"its followers refuse every batch below that epoch; promote at epoch %d or above (leader.Options.Epoch, oncewal promote --epoch)",
		replication.ErrStaleEpoch, epoch, promise, where, promise)
}
