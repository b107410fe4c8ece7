package follower

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/store"
)

// Promise persists, in the follower's store, that it refuses every batch
// of an epoch below epoch from now on, and returns the store's position
// then, final for every older epoch (store.Store.Promise): how the winner
// of an election fences the deposed leader's followers and learns where
// each stands. Serve, still connected to the deposed leader, stops at its
// next batch and redials (the refusal is counted as stale_epoch). A
// closed or retired Follower answers ErrClosed.
func (f *Follower) Promise(epoch uint64) (replication.Ack, error) {
	release, ok := f.life.Hold()
	if !ok {
		return replication.Ack{}, ErrClosed
	}
	defer release()
	return f.st.Promise(epoch)
}

// PromiseError is Node.Promise's error when some shards did not promise:
// each with why (store.ErrClosed or ErrClosed for a closed node or a
// store being reopened, the store's failure for a shard that is down,
// store.ErrStalled, ...). errors.Is looks through every shard's error.
type PromiseError struct {
	Epoch  uint64
	Failed map[uint32]error
}

func (e *PromiseError) Error() string {
	var b strings.Builder
	shards := slices.Sorted(maps.Keys(e.Failed))
	fmt.Fprintf(&b, "follower: shards %v did not promise epoch %d (the fencing leader cannot count them as fenced; ask them again once they serve):", shards, e.Epoch)
	for _, s := range shards {
		fmt.Fprintf(&b, " shard %d: %v;", s, e.Failed[s])
	}
	return strings.TrimSuffix(b.String(), ";")
}

func (e *PromiseError) Unwrap() []error {
	errs := make([]error, 0, len(e.Failed))
	for _, s := range slices.Sorted(maps.Keys(e.Failed)) {
		errs = append(errs, e.Failed[s])
	}
	return errs
}

// Promise promises epoch in every shard's store (Follower.Promise), the
// shards in parallel, and returns the position of each shard that
// promised. A shard that did not — its store down (failed, being reopened
// or rebuilt) or closed, or the write failed — is missing from the map and
// named in the error, a *PromiseError: the fencing leader must not count
// it as fenced, and a shard that comes back up later holds no promise
// until it is asked again. An epoch no leader can have
// (store.ErrBadPromise) is refused for the whole node before any store is
// touched.
func (n *Node) Promise(epoch uint64) (map[uint32]replication.Ack, error) {
	if err := store.CheckPromiseEpoch(epoch); err != nil {
		return nil, err
	}
	acks := make(map[uint32]replication.Ack, len(n.shards))
	failed := map[uint32]error{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, ns := range n.shards {
		wg.Go(func() {
			var ack replication.Ack
			err := n.Follower(ns.shard, func(f *Follower) (err error) {
				ack, err = f.Promise(epoch)
				return err
			})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				failed[ns.shard] = err
			} else {
				ack.Shard = ns.shard
				acks[ns.shard] = ack
			}
		})
	}
	wg.Wait()
	if len(failed) > 0 {
		return acks, &PromiseError{Epoch: epoch, Failed: failed}
	}
	return acks, nil
}
