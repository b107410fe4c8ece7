package node

import (
	"github.com/cockroachdb/pebble/v2/vfs"
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
