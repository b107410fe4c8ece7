package node

import (
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
