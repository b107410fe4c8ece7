package node

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/oncewal/oncewal/coord"
	"github.com/oncewal/oncewal/leader"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/wal"
)

// pausable is one member's view of the coordinator that a test can pause:
// while paused the member hears nothing from it — its leaderships' Done
// stays open and their Deadline far ahead, its watches deliver nothing — as
// a process stopped (SIGSTOP) past its lease, whose key etcd deleted
// meanwhile, still believes it leads when it runs again.
type pausable struct {
	coord.Coordinator
	mu     sync.Mutex
	paused bool
	held   []coord.Leadership
}

// pausableCluster is a one-shard cluster of ids on a coord.Memory, each
// member seeing it through a pausable view of its own.
func pausableCluster(t *testing.T, ids ...string) (*cluster, *coord.Memory, map[string]*pausable) {
	t.Helper()
	mem := coord.NewMemory()
	t.Cleanup(func() { _ = mem.Close() })
	views := map[string]*pausable{}
	for _, id := range ids {
		views[id] = &pausable{Coordinator: mem}
	}
	cl := newCluster(t, mem, 1, ids...)
	cl.coordFor = func(id string) coord.Coordinator { return views[id] }
	return cl, mem, views
}

func (p *pausable) isPaused() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.paused
}

func (p *pausable) Campaign(ctx context.Context, cluster string, me coord.Candidate) (coord.Leadership, error) {
	ls, err := p.Coordinator.Campaign(ctx, cluster, me)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	p.held = append(p.held, ls)
	p.mu.Unlock()
	done := make(chan struct{})
	go func() {
		<-ls.Done()
		if !p.isPaused() {
			close(done)
		}
	}()
	return pausedLeadership{ls, p, done}, nil
}

func (p *pausable) Watch(ctx context.Context, cluster, prefix string) (<-chan map[string][]byte, error) {
	in, err := p.Coordinator.Watch(ctx, cluster, prefix)
	if err != nil {
		return nil, err
	}
	out := make(chan map[string][]byte)
	go func() {
		defer close(out)
		for m := range in {
			if p.isPaused() {
				continue
			}
			select {
			case out <- m:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out, nil
}

func (p *pausable) pause() []coord.Leadership {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.paused = true
	return p.held
}

type pausedLeadership struct {
	coord.Leadership
	p    *pausable
	done chan struct{}
}

func (l pausedLeadership) Done() <-chan struct{} { return l.done }

func (l pausedLeadership) Deadline() time.Time {
	if l.p.isPaused() {
		return time.Now().Add(time.Hour)
	}
	return l.Leadership.Deadline()
}

// TestDeposedLeaderAcknowledgesNothing: the leader is paused past its
// lease (its election key expires while it believes it leads); another
// member wins, fences and leads. The deposed leader, still running, appends
// and waits for a majority: its followers promised the new epoch, so no
// ack comes (invariant 2), and the new leader's history holds none of it.
func TestDeposedLeaderAcknowledgesNothing(t *testing.T) {
	cl, mem, views := pausableCluster(t, "a", "b", "c")
	for _, id := range []string{"a", "b", "c"} {
		cl.start(id)
	}
	old, zombie := cl.waitLeader("")
	sid := session.NewID()
	write(t, zombie, []session.ID{sid}, 0, 20)
	for _, ls := range views[old].pause() {
		mem.Expire(ls) // the lease ends while the leader is paused
	}
	next, l2 := cl.waitLeader(old)
	sh2, _ := l2.Shard(0)
	start := sh2.NextLSN()

	// The zombie writes on: nothing it logs from now on may be acknowledged.
	if _, err := zombie.Append(wal.Event{Op: wal.OpPut, Session: sid, Key: []byte("zombie"), Value: []byte("x")}); err != nil {
		t.Fatalf("the deposed leader's append: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	err := zombie.WaitAcked(ctx, leader.AckMajority)
	if err == nil {
		t.Fatalf("the deposed leader %s had a write acknowledged by a majority after %s was elected", old, next)
	}
	if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, leader.ErrAckTimeout) && !errors.Is(err, leader.ErrQuorumLost) {
		t.Logf("the deposed leader's wait ended with %v", err)
	}
	if got := sh2.NextLSN(); got != start {
		t.Errorf("the new leader's log moved from %d to %d without a write", start, got)
	}
}
