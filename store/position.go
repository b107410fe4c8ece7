package store

import (
	"cmp"

	"github.com/oncewal/oncewal/replication"

	"github.com/cockroachdb/pebble/v2"
)

// ReadPosition reads what a store would state in its hello — its highest
// committed epoch, applied LSN and the identity of the batch ending there
// (Ack.Epoch, AppliedLSN, LastBatch; Shard and FollowerID are not stored) —
// from db, e.g. a store opened read-only to choose the follower to promote.
// ok is false when db holds no oncewal metadata.
func ReadPosition(db pebble.Reader) (pos replication.Ack, ok bool, err error) {
	applied, epoch, ok, err := ReadMeta(db)
	if err != nil || !ok {
		return replication.Ack{}, false, err
	}
	_, last, err := ReadLastBatch(db)
	if err != nil {
		return replication.Ack{}, false, err
	}
	return replication.Ack{Epoch: epoch, AppliedLSN: applied, LastBatch: last}, true, nil
}

// ComparePositions orders two followers of one shard by how far their
// histories go, as Raft compares logs: first by the epoch of the last batch
// each applied, then by applied LSN. It returns -1 when a is behind b, +1
// when a is ahead, 0 when neither is. A later epoch wins over more LSNs:
// a follower that applied a deposed leader's batches beyond the point where
// the next epoch's log started holds a history nobody continues. Where the
// last batch is unknown (a store that predates the record; nothing applied)
// the committed epoch stands in for it.
//
// The follower to promote after a leader's death is one that no other
// survivor is ahead of: it holds every LSN a majority acknowledged
// (AckMajority), and every follower behind it can continue from its log.
func ComparePositions(a, b replication.Ack) int {
	return cmp.Or(cmp.Compare(lastEpoch(a), lastEpoch(b)), cmp.Compare(a.AppliedLSN, b.AppliedLSN))
}

func lastEpoch(a replication.Ack) uint64 {
	switch {
	case a.AppliedLSN == 0:
		return 0
	case a.LastBatch.IsZero():
		return a.Epoch
	}
	return a.LastBatch.Epoch
}
