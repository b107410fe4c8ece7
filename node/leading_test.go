package node

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncewal/oncewal/coord"
)

// lapsing is a member's view of the coordinator whose leaderships' Deadline
// the test can move into the past while Done stays open: the moment a
// process resumed after a pause past its lease lives in, before its timers
// fire and Run steps down.
type lapsing struct {
	coord.Coordinator
	lapsed atomic.Bool
}

func (c *lapsing) Campaign(ctx context.Context, cluster string, me coord.Candidate) (coord.Leadership, error) {
	ls, err := c.Coordinator.Campaign(ctx, cluster, me)
	if err != nil {
		return nil, err
	}
	return lapsingLeadership{ls, c}, nil
}

type lapsingLeadership struct {
	coord.Leadership
	c *lapsing
}

func (l lapsingLeadership) Deadline() time.Time {
	if l.c.lapsed.Load() {
		return time.Now().Add(-time.Second)
	}
	return l.Leadership.Deadline()
}

// TestLeaderRefusedOnceItsDeadlinePassed: Node.Leader (what /readyz and
// the CLI's status read) answers ErrNotLeader with coord.ErrLostLeadership
// from the moment the leadership's deadline passes, not only once Run has
// stepped down. It answered the leader — /readyz 200 "leading" — to a
// process resumed after a pause past its lease (the nemesis's SIGSTOP), so
// the cluster looked whole while that member was in fact deposed.
func TestLeaderRefusedOnceItsDeadlinePassed(t *testing.T) {
	mem := coord.NewMemory()
	t.Cleanup(func() { _ = mem.Close() })
	view := &lapsing{Coordinator: mem}
	cl := newCluster(t, mem, 1, "a")
	cl.coordFor = func(string) coord.Coordinator { return view }
	cl.start("a")
	cl.waitLeader("")
	cl.mu.Lock()
	n := cl.nodes["a"].n
	cl.mu.Unlock()
	view.lapsed.Store(true)
	_, err := n.Leader()
	if !errors.Is(err, ErrNotLeader) || !errors.Is(err, coord.ErrLostLeadership) {
		t.Fatalf("Leader() after the deadline passed: %v, want ErrNotLeader and coord.ErrLostLeadership", err)
	}
}
