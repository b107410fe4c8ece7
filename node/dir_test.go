package node

import (
	"errors"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/oncewal/oncewal/coord"
)

// TestOpenDirSurvivesPowerFailure: the directory Open creates survives a
// power failure right after it (a crash image keeping synced writes only),
// NODE file and all, so the member's identity and whatever it later
// acknowledges are not lost with a directory entry nobody synced; another
// member is then refused the directory. Found by the election simulation:
// a leader killed this way came back empty and a fencing quorum without
// its follower promoted a member missing acknowledged writes.
func TestOpenDirSurvivesPowerFailure(t *testing.T) {
	c := coord.NewMemory()
	t.Cleanup(func() { _ = c.Close() })
	cl := newCluster(t, c, 1, "a", "b")
	mem := vfs.NewCrashableMem()
	o := cl.options("a")
	o.FS, o.Dir = mem, "/data/a"
	n, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	clone := mem.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 0})
	_ = n.Close()
	if _, err := clone.Stat("/data/a/" + nodeFileName); err != nil {
		t.Fatalf("the NODE file did not survive a power failure after Open: %v", err)
	}
	ob := cl.options("b")
	ob.FS, ob.Dir = clone, "/data/a"
	if _, err := Open(ob); !errors.Is(err, ErrForeignDir) {
		t.Errorf("b opening a's directory after the power failure: %v, want ErrForeignDir", err)
	}
}
