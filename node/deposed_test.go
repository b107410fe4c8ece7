package node

import (
	"context"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/oncewal/oncewal/leader"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/store"
	"github.com/oncewal/oncewal/wal"
)

// TestDeposedReplicaReportsItsLog: a leader killed by a power failure
// keeps its synced log, while its store (which applies the log behind it)
// may keep much less. What it reports to a fencing winner is the log's
// end, which it acknowledged and which its store catches up from if it
// leads again — not the store's position, with which a fencing quorum
// could miss acknowledged writes. Found by the election simulation.
func TestDeposedReplicaReportsItsLog(t *testing.T) {
	mem := vfs.NewCrashableMem()
	dir := "/replica"
	l, err := leader.Open(dir, &leader.Options{Shards: 1, FS: mem, Logger: quiet, Store: store.Options{Logger: quiet}})
	if err != nil {
		t.Fatal(err)
	}
	sid := session.NewID()
	var last wal.Header
	for i := range 20 {
		if last, err = l.Append(wal.Event{Op: wal.OpPut, Session: sid, Key: []byte{byte(i)}, Value: []byte("v")}); err != nil {
			t.Fatal(err)
		}
	}
	crashed := mem.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 0})
	_ = l.Close()
	pos, unknown := leaderReplicaPositions(crashed, dir, 1)
	if len(unknown) > 0 || len(pos) != 1 {
		t.Fatalf("positions %v, unknown %v", pos, unknown)
	}
	info, err := store.PeekStore(crashed, store.ShardDir(dir, 0))
	if err != nil {
		t.Fatal(err)
	}
	if pos[0].AppliedLSN != last.LastLSN() || pos[0].Epoch != last.Epoch {
		t.Errorf("the deposed replica reports LSN %d epoch %d; its log ends at LSN %d epoch %d (its store at %d)",
			pos[0].AppliedLSN, pos[0].Epoch, last.LastLSN(), last.Epoch, info.Applied)
	}
	t.Logf("log end %d, store %d after the power failure", last.LastLSN(), info.Applied)
}

// TestMovedAsideReportsItsReplica: a deposed leader that moved its replica
// aside to follow the new leader holds, until its new store is rebuilt,
// nothing of what it acknowledged in its new store. Asked to promise a
// later term meanwhile it restores the replica it moved aside and reports
// that — not the empty store's position, which would let a fencing quorum
// without the other holders of those writes promote a member missing them.
// Found by the election simulation (reporting the shard unknown instead
// left no quorum at all once the leader it rebuilt from died too).
func TestMovedAsideReportsItsReplica(t *testing.T) {
	cl, mem, views := pausableCluster(t, "a", "b", "c")
	stuck := stuckTransports(cl)
	for _, id := range []string{"a", "b", "c"} {
		cl.start(id)
	}
	first, l := cl.waitLeader("")
	write(t, l, []session.ID{session.NewID()}, 0, 20)
	cl.stop(first)
	next, _ := cl.waitLeader(first)
	nextEpoch := cl.status(next).Epoch
	// The deposed leader comes back, moves its replica aside and hangs
	// rebuilding it.
	stuck[first] = &stuckSnapshots{Transport: cl.net.For("mem:" + first), begun: make(chan struct{})}
	cl.start(first)
	<-stuck[first].begun
	for _, ls := range views[next].pause() {
		mem.Expire(ls)
	}
	ctx := context.Background()
	waitFor(t, first+" to report to a term after "+next+"'s", func() bool {
		b, ok, err := mem.Get(ctx, testCluster, reportPrefix+first)
		if err != nil || !ok {
			return false
		}
		r, err := decodeJSON[report](reportPrefix+first, b)
		if err != nil || r.Epoch <= nextEpoch {
			return false
		}
		if !r.Deposed || len(r.Unknown) > 0 || len(r.Positions) != 1 || r.Positions[0].AppliedLSN < 20 {
			t.Fatalf("%s, its replica moved aside and not rebuilt, reported %+v (unknown %v, deposed %v), want the replica it led (20 writes)",
				first, r.Positions, r.Unknown, r.Deposed)
		}
		return true
	})
}
