package replication

import "errors"

// ErrStaging: composing a batch's Pebble batch failed — a read of the store
// (an HWM) or a write into the uncommitted batch (HWM flush, session GC,
// window journal, metadata). The batch is refused and nothing was
// committed; unlike ErrStoreFailed, which only a failed commit sets and which
// sticks until the follower is reopened, the receiver stays usable and the
// next delivery is tried afresh.
var ErrStaging = errors.New("replication: staging the batch failed")
