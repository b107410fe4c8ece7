package sim

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/oncewal/oncewal/store"

	"github.com/oncewal/oncewal/follower"
	"github.com/oncewal/oncewal/snapshot"
	"github.com/oncewal/oncewal/wal"
)

// leaderDonors serves snapshots of the current leader's shard stores
// (leader.Donor, with its retention pin): the rebuild source of every
// follower with Options.Rebuild. The leader is replaced (restarts, the
// promotion) while followers fetch; the lock keeps a checkpoint from racing
// its store's close, and a snapshot of an earlier leader is unknown to the
// next one (the fetch then starts over).
type leaderDonors struct {
	mu     sync.RWMutex
	donors []*snapshot.Donor // nil while no leader is open
}

// source is the rebuild source of follower node: shard s's snapshots come
// from the current leader's donor of s.
func (ld *leaderDonors) source(node string) snapshot.Source {
	return snapshot.NewRouter(func(s uint32) snapshot.Source { return shardDonor{ld, s, node} })
}

// Test hooks, nil outside this package's tests: each holds a run at a moment
// a test chooses, to force an interleaving that goroutine timing makes rare.
var (
	// testSnapshotEnd is called when follower node's fetch of shard
	// releases its snapshot (Source.End): after a successful fetch that
	// happens once the snapshot is staged and verified, and the install
	// follows when the hook returns.
	testSnapshotEnd func(node string, shard uint32)
	// testCrashImage is called at the power failure of follower node:
	// before its links are cut and its filesystem image is taken (taken
	// false), and after the image was taken (taken true), while the node
	// still runs.
	testCrashImage func(node string, taken bool)
)

// open serves the stores of the leader r.lead opened.
func (r *run) openDonors() error {
	ld := &r.donors
	ld.mu.Lock()
	defer ld.mu.Unlock()
	for s := range uint32(r.cfg.Shards) {
		d, err := r.lead.l.Donor(s, &snapshot.DonorOptions{RateLimit: -1})
		if err != nil {
			for _, d := range ld.donors {
				_ = d.Close()
			}
			ld.donors = nil
			return fmt.Errorf("sim: %w", err)
		}
		ld.donors = append(ld.donors, d)
	}
	return nil
}

// closeDonors releases every snapshot of the leader that is stopping.
func (r *run) closeDonors() {
	ld := &r.donors
	ld.mu.Lock()
	defer ld.mu.Unlock()
	for _, d := range ld.donors {
		_ = d.Close()
	}
	ld.donors = nil
}

type shardDonor struct {
	ld    *leaderDonors
	shard uint32
	node  string // the follower fetching
}

func (d shardDonor) Begin(ctx context.Context, shard uint32) (snapshot.Manifest, error) {
	d.ld.mu.RLock()
	defer d.ld.mu.RUnlock()
	if d.ld.donors == nil {
		return snapshot.Manifest{}, fmt.Errorf("%w %d: the leader is down", snapshot.ErrNoDonor, shard)
	}
	return d.ld.donors[d.shard].Begin(ctx, shard)
}

func (d shardDonor) Read(ctx context.Context, id, name string, off int64, p []byte) (int, error) {
	d.ld.mu.RLock()
	defer d.ld.mu.RUnlock()
	if d.ld.donors == nil {
		return 0, fmt.Errorf("%w: %s (its leader stopped)", snapshot.ErrUnknownSnapshot, id)
	}
	return d.ld.donors[d.shard].Read(ctx, id, name, off, p)
}

func (d shardDonor) End(ctx context.Context, id string) error {
	if testSnapshotEnd != nil {
		testSnapshotEnd(d.node, d.shard)
	}
	d.ld.mu.RLock()
	defer d.ld.mu.RUnlock()
	if d.ld.donors == nil {
		return nil
	}
	return d.ld.donors[d.shard].End(ctx, id)
}

// segmentSize is the leader's WAL segment size.
func (r *run) segmentSize() int64 {
	if r.cfg.SegmentSize > 0 {
		return r.cfg.SegmentSize
	}
	return wal.DefaultSegmentSize
}

// transplant replaces dst's store of shard (dst is closed) with a snapshot
// of src's (src is paused): the follower rebuild path (follower.Rebuild)
// with another follower as the donor.
func (r *run) transplant(src, dst *node, shard uint32) error {
	o := r.followerOptions()
	o.Store.ID, o.Store.FS, o.Store.Shard = dst.id, dst.fs, shard
	err := src.n.Follower(shard, func(f *follower.Follower) error {
		d, err := f.Store().Donor(&snapshot.DonorOptions{
			FS: src.fs, Dir: src.fs.PathJoin(src.dir, fmt.Sprintf("snapshots-%d", shard)), RateLimit: -1})
		if err != nil {
			return err
		}
		_, _, err = follower.Rebuild(r.ctx, store.ShardDir(dst.dir, shard), &o, d, nil)
		if cerr := d.Close(); err == nil {
			err = cerr
		}
		if err == nil {
			err = src.fs.RemoveAll(src.fs.PathJoin(src.dir, fmt.Sprintf("snapshots-%d", shard)))
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("sim: rebuilding %s shard %d from %s: %w", dst.id, shard, src.id, err)
	}
	return nil
}

// join adds late joiner n once the client sent everything: it waits (up to
// 100 ms, while a log has more than a segment) for retention to delete the
// start of the leader's WAL of this epoch (a promoted leader's log starts
// where its store stood, so after a promotion it never starts at LSN 1
// anyway; Result.JoinsAfterRetention counts the joins it did), restarts
// the leader with n listed among its followers — how an operator adds a
// follower — and starts n on an empty store. Every shard whose log no
// longer starts at LSN 1 must refuse n as behind retention, and n rebuilds
// it from the leader's snapshot.
func (r *run) join(n *node) error {
	// dropped: retention deleted the start of a shard's log; wait: it
	// still can (a log of one segment keeps it for good).
	dropped := func() (dropped, wait bool) {
		for s := range uint32(r.cfg.Shards) {
			sh, _ := r.lead.l.Shard(s)
			st := sh.Stats().Retention
			if r.cfg.Skip(s) {
				continue
			}
			dropped = dropped || st.FirstLSN > r.logStart[s]
			wait = wait || st.RetainedBytes > r.segmentSize()
		}
		return dropped, wait && !dropped
	}
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for deadline := time.Now().Add(100 * time.Millisecond); time.Now().Before(deadline); {
		if _, wait := dropped(); !wait {
			break
		}
		select {
		case <-r.ctx.Done():
			return r.ctx.Err()
		case <-tick.C:
		}
	}
	if d, _ := dropped(); d {
		r.res.JoinsAfterRetention++
	}
	if err := r.stopLeader(); err != nil {
		return err
	}
	r.lead.shipTo = append(r.lead.shipTo, n.idx)
	if err := r.openLeader(0); err != nil {
		return err
	}
	r.ensureShardResults(n)
	var first []uint64
	for s := range uint32(r.cfg.Shards) {
		sh, _ := r.lead.l.Shard(s)
		first = append(first, sh.Stats().Retention.FirstLSN)
		if first[s] > 1 && !r.cfg.Skip(s) {
			r.markRefused(n, s, "behind retention")
		}
	}
	r.res.LateJoins++
	r.trace("follower %s joins late; the leader's logs start at %v", n.id, first)
	return r.startNode(n)
}
