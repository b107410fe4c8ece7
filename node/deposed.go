package node

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/oncewal/oncewal/follower"
	"github.com/oncewal/oncewal/leader"
	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/store"
	"github.com/oncewal/oncewal/wal"
)

// leaderReplicaPositions reads the positions of a leader replica's stopped
// stores (one it led: the replica, or the one moved aside). The log, not
// the store, is what the leader acknowledged: it counts itself once a batch
// is synced there, and its store applies the log behind it (a power failure
// can leave it far behind). Leading again, the store catches up from the
// log, so the replica holds the log's end.
func leaderReplicaPositions(fs vfs.FS, dir string, shards int) (pos []replication.Ack, unknown []uint32) {
	for s := range uint32(shards) {
		info, err := store.PeekStore(fs, store.ShardDir(dir, s))
		if err != nil {
			unknown = append(unknown, s)
			continue
		}
		p := replication.Ack{Shard: s, Epoch: info.Epoch, AppliedLSN: info.Applied}
		lg, err := wal.InspectFS(fs, fs.PathJoin(dir, leader.WALDirName), s)
		if err != nil {
			unknown = append(unknown, s)
			continue
		}
		if lg.NextLSN > 0 && lg.NextLSN-1 > p.AppliedLSN {
			p.AppliedLSN, p.Epoch = lg.NextLSN-1, max(p.Epoch, lg.LastEpoch)
		}
		pos = append(pos, p)
	}
	return pos, unknown
}

// behindDeposed moves to unknown every shard whose store is behind the
// replica the node moved aside (DeposedDirName) and has applied nothing of
// a later epoch than it: a store that replaced the deposed one and is not
// yet rebuilt. The deposed replica counted towards acknowledgements (the
// leader counts itself) that the node no longer holds: reporting the new
// store would let a fencing quorum miss them (invariant 2). Such a shard
// is left out until its store catches up — rebuilt from, or applying
// batches of, a leader whose epoch is above the deposed one's, which holds
// everything acknowledged before it.
func (n *Node) behindDeposed(pos []replication.Ack, unknown []uint32) ([]replication.Ack, []uint32) {
	dir := n.o.FS.PathJoin(n.o.Dir, DeposedDirName)
	if _, err := n.o.FS.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return pos, unknown
	}
	dep, _ := leaderReplicaPositions(n.o.FS, dir, n.o.Shards)
	out := pos[:0:0]
	for _, p := range pos {
		i := slices.IndexFunc(dep, func(d replication.Ack) bool { return d.Shard == p.Shard })
		if i >= 0 && p.Epoch <= dep[i].Epoch && store.ComparePositions(p, dep[i]) < 0 {
			unknown = append(unknown, p.Shard)
			continue
		}
		out = append(out, p)
	}
	slices.Sort(unknown)
	return out, unknown
}

// rebuildBehind rebuilds from t's leader every shard whose store is behind
// the first LSN t writes: the leader's log may hold the batches in between
// (a leader that led this replica before keeps its log), all of older
// epochs, which the store's promise refuses once it promised any later
// term (this one, or one that ended while fencing) — the link would end at
// each, for ever. A leader promoted from a follower's store has no such
// batches and refuses the store as behind its log anyway. A snapshot of the
// leader's store continues its history instead.
func (n *Node) rebuildBehind(ctx context.Context, t term) error {
	var behind []uint32
	for s := range uint32(n.o.Shards) {
		if int(s) >= len(t.Starts) {
			break
		}
		_ = n.fol.Follower(s, func(f *follower.Follower) error {
			applied, _ := f.Position()
			if applied+1 < t.Starts[s] {
				behind = append(behind, s)
			}
			return nil
		})
	}
	if len(behind) == 0 {
		return nil
	}
	n.stopServing()
	if err := n.fol.Close(); err != nil {
		n.log.Warn("node: closing the follower to rebuild", "err", err)
	}
	n.fol = nil
	defer func() {
		if err := n.openFollower(); err == nil && n.peers != nil {
			n.peers.setFollower(n.fol)
		}
	}()
	cctx, cancel := context.WithTimeout(ctx, n.o.FenceTimeout)
	defer cancel()
	for _, s := range behind {
		m, _, err := n.rebuildShard(cctx, s, t.Addr)
		if err != nil {
			return fmt.Errorf("shard %d from %s: %w", s, t.ID, err)
		}
		n.log.Info("node: rebuilt a shard behind the leader's term (its log's older batches are below the promise)",
			"shard", s, "leader", t.ID, "term", t.Term, "applied_lsn", m.Cut.AppliedLSN, "epoch", m.Cut.Epoch)
	}
	return nil
}

// restoreDeposed moves the replica the node moved aside back into place
// when the stores that replaced it hold nothing it lacks: none is of a
// later epoch, and one is behind it (not yet rebuilt). The moved-aside
// replica still holds what the node acknowledged while it led; reporting it
// keeps a fencing quorum able to hear those writes, where leaving its
// shards unknown could leave no quorum at all once the leader it was
// rebuilding from is gone too. It is moved aside again when the node next
// follows.
func (n *Node) restoreDeposed() error {
	dep := n.o.FS.PathJoin(n.o.Dir, DeposedDirName)
	if _, err := n.o.FS.Stat(dep); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if layout, _, err := store.DirLayout(n.o.FS, n.replica); err != nil || layout == store.LayoutLeader {
		return err
	}
	if layout, _, err := store.DirLayout(n.o.FS, dep); err != nil || layout != store.LayoutLeader {
		return err
	}
	if err := n.openFollower(); err != nil {
		return err
	}
	dpos, _ := leaderReplicaPositions(n.o.FS, dep, n.o.Shards)
	behind := false
	for _, d := range dpos {
		applied, epoch, err := n.fol.Position(d.Shard)
		if err != nil {
			behind = true
			continue
		}
		p := replication.Ack{Shard: d.Shard, Epoch: epoch, AppliedLSN: applied}
		if p.Epoch > d.Epoch {
			return nil // rebuilt from a later leader: the replica aside is history
		}
		behind = behind || store.ComparePositions(p, d) < 0
	}
	if !behind {
		return nil
	}
	n.stopFollowing()
	if err := n.discard(n.replica); err != nil {
		return err
	}
	if err := n.o.FS.Rename(dep, n.replica); err != nil {
		return err
	}
	if err := syncDir(n.o.FS, n.o.Dir); err != nil {
		return err
	}
	n.log.Warn("node: restored the replica it led: the stores replacing it were not rebuilt yet", "replica", n.replica)
	return nil
}
