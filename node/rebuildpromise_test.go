package node

import (
	"context"
	"sync"
	"testing"

	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/snapshot"
)

// stuckSnapshots is a member's transport whose snapshot fetches never
// complete: a rebuild from the leader waits until it is stopped.
type stuckSnapshots struct {
	Transport
	once  sync.Once
	begun chan struct{}
}

// stuckTransports makes cl's members use their MemoryNet transport, or
// the stuckSnapshots the returned map holds for them when they start.
func stuckTransports(cl *cluster) map[string]*stuckSnapshots {
	stuck := map[string]*stuckSnapshots{}
	cl.transportFor = func(id string) (string, Transport) {
		addr := "mem:" + id
		if s := stuck[id]; s != nil {
			return addr, s
		}
		return addr, cl.net.For(addr)
	}
	return stuck
}

func (s *stuckSnapshots) Snapshots(string) snapshot.Source { return stuckSource{s} }

type stuckSource struct{ s *stuckSnapshots }

func (ss stuckSource) Begin(ctx context.Context, _ uint32) (snapshot.Manifest, error) {
	ss.s.once.Do(func() { close(ss.s.begun) })
	<-ctx.Done()
	return snapshot.Manifest{}, ctx.Err()
}

func (stuckSource) Read(context.Context, string, string, int64, []byte) (int, error) {
	return 0, snapshot.ErrClosed
}

func (stuckSource) End(context.Context, string) error { return nil }

// TestPromiseWhileRebuildPending: a member whose store the leader refuses
// for good (a new empty member, behind the leader's log) is rebuilding it
// when the leader stops; fencing the next term stops its serving, which
// cuts the rebuild short and leaves the shard down until it serves a
// leader again. It must promise all the same (its store on disk is whole),
// or with the leader gone the two others can never make the fencing
// quorum and nobody leads. Found by the election simulation.
func TestPromiseWhileRebuildPending(t *testing.T) {
	cl, mem, views := pausableCluster(t, "a", "b", "c")
	stuck := stuckTransports(cl)
	for _, id := range []string{"a", "b", "c"} {
		cl.start(id)
	}
	first, l := cl.waitLeader("")
	sessions := []session.ID{session.NewID(), session.NewID()}
	write(t, l, sessions, 0, 20)
	cl.stop(first)
	next, l2 := cl.waitLeader(first) // its log starts past LSN 1
	var fresh string
	for _, id := range []string{"a", "b", "c"} {
		if id != first && id != next {
			fresh = id
		}
	}
	// The third member comes back on an empty disk whose rebuild hangs.
	cl.stop(fresh)
	cl.dirs[fresh] = t.TempDir()
	stuck[fresh] = &stuckSnapshots{Transport: cl.net.For("mem:" + fresh), begun: make(chan struct{})}
	cl.start(fresh)
	<-stuck[fresh].begun
	cl.start(first) // rebuilds from next and follows it: it acknowledges the next writes
	write(t, l2, sessions, 20, 10)

	for _, ls := range views[next].pause() {
		mem.Expire(ls)
	}
	cl.waitLeader(next) // first or fresh, once both promised
}
