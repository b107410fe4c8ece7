package coord

import (
	"context"
	"fmt"
	"slices"
	"sync"
)

// Memory is the Coordinator in process, for unit tests and the simulation:
// one Memory plays one etcd, shared by every node of a test. It keeps the
// package's invariants with one revision counter, as etcd does; Expire
// plays a session's lease ending. NewMemory makes one.
type Memory struct {
	mu       sync.Mutex
	rev      int64
	closed   bool
	done     chan struct{} // closed by Close
	clusters map[string]*memCluster
}

type memCluster struct {
	queue   []*memLeadership // candidates by create revision; queue[0] leads
	data    map[string][]byte
	changed chan struct{} // closed and replaced at every change of queue
}

// NewMemory returns an empty in-process coordinator.
func NewMemory() *Memory {
	return &Memory{done: make(chan struct{}), clusters: map[string]*memCluster{}}
}

func (m *Memory) cluster(name string) *memCluster {
	cl := m.clusters[name]
	if cl == nil {
		cl = &memCluster{data: map[string][]byte{}, changed: make(chan struct{})}
		m.clusters[name] = cl
	}
	return cl
}

func (cl *memCluster) leader() Leader {
	if len(cl.queue) == 0 {
		return Leader{}
	}
	return cl.queue[0].leader
}

// Campaign implements Coordinator.
func (m *Memory) Campaign(ctx context.Context, cluster string, me Candidate) (Leadership, error) {
	if err := checkCampaign(cluster, me); err != nil {
		return nil, err
	}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil, ErrClosed
	}
	cl := m.cluster(cluster)
	m.rev++
	l := &memLeadership{m: m, cl: cl, name: cluster, leader: Leader{Candidate: me, Epoch: uint64(m.rev)}, done: make(chan struct{})}
	cl.queue = append(cl.queue, l)
	m.changedLocked(cl)
	for cl.queue[0] != l {
		changed := cl.changed
		m.mu.Unlock()
		select {
		case <-changed:
		case <-ctx.Done():
			m.mu.Lock()
			m.endLocked(l)
			m.mu.Unlock()
			return nil, fmt.Errorf("coord: campaign %s: %w", cluster, ctx.Err())
		}
		m.mu.Lock()
		if m.closed {
			m.mu.Unlock()
			return nil, ErrClosed
		}
		if l.ended {
			m.mu.Unlock()
			return nil, fmt.Errorf("%w: the session's lease ended while campaigning for %s", ErrLostLeadership, cluster)
		}
	}
	m.mu.Unlock()
	return l, nil
}

// changedLocked wakes every waiter on cl.
func (m *Memory) changedLocked(cl *memCluster) {
	close(cl.changed)
	cl.changed = make(chan struct{})
}

// endLocked deletes l's key, as a resign or the end of its lease does.
func (m *Memory) endLocked(l *memLeadership) {
	if l.ended {
		return
	}
	l.ended = true
	close(l.done)
	l.cl.queue = slices.DeleteFunc(l.cl.queue, func(x *memLeadership) bool { return x == l })
	m.rev++
	m.changedLocked(l.cl)
}

// Expire ends l's term as its lease ending would: its key is deleted, its
// Done closes and the next candidate wins. l must come from m.
func (m *Memory) Expire(l Leadership) {
	ml, ok := l.(*memLeadership)
	if !ok || ml.m != m {
		return
	}
	m.mu.Lock()
	m.endLocked(ml)
	m.mu.Unlock()
}

// Observe implements Coordinator.
func (m *Memory) Observe(ctx context.Context, cluster string) (<-chan Leader, error) {
	if err := checkCluster(cluster); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, ErrClosed
	}
	cl := m.cluster(cluster)
	ch := make(chan Leader)
	go func() {
		defer close(ch)
		var last Leader
		sent := false
		for {
			m.mu.Lock()
			cur, changed := cl.leader(), cl.changed
			m.mu.Unlock()
			if !sent || cur != last {
				select {
				case ch <- cur:
					last, sent = cur, true
				case <-ctx.Done():
					return
				case <-m.done:
					return
				}
			}
			select {
			case <-changed:
			case <-ctx.Done():
				return
			case <-m.done:
				return
			}
		}
	}()
	return ch, nil
}

// Get implements Coordinator.
func (m *Memory) Get(_ context.Context, cluster, key string) ([]byte, bool, error) {
	if err := checkCluster(cluster); err != nil {
		return nil, false, err
	}
	if err := checkOps([]Op{{key: key}}); err != nil {
		return nil, false, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, false, ErrClosed
	}
	v, ok := m.cluster(cluster).data[key]
	return slices.Clone(v), ok, nil
}

// Close implements Coordinator: every term ends.
func (m *Memory) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return ErrClosed
	}
	m.closed = true
	for _, cl := range m.clusters {
		for len(cl.queue) > 0 {
			m.endLocked(cl.queue[0])
		}
	}
	close(m.done)
	return nil
}

type memLeadership struct {
	m      *Memory
	cl     *memCluster
	name   string
	leader Leader
	done   chan struct{}
	ended  bool // guarded by m.mu
}

func (l *memLeadership) Leader() Leader        { return l.leader }
func (l *memLeadership) Epoch() uint64         { return l.leader.Epoch }
func (l *memLeadership) Done() <-chan struct{} { return l.done }

// Guarded implements Leadership: the term's key exists iff it has not
// ended, and it leads from the moment Campaign returned it.
func (l *memLeadership) Guarded(_ context.Context, ops ...Op) error {
	if err := checkOps(ops); err != nil {
		return err
	}
	l.m.mu.Lock()
	defer l.m.mu.Unlock()
	if l.m.closed {
		return ErrClosed
	}
	if l.ended {
		return fmt.Errorf("%w: %s at epoch %d: its election key is gone", ErrLostLeadership, l.name, l.leader.Epoch)
	}
	for _, op := range ops {
		if op.delete {
			delete(l.cl.data, op.key)
		} else {
			l.cl.data[op.key] = slices.Clone(op.value)
		}
	}
	l.m.rev++
	return nil
}

// Resign implements Leadership.
func (l *memLeadership) Resign(context.Context) error {
	l.m.mu.Lock()
	l.m.endLocked(l)
	l.m.mu.Unlock()
	return nil
}
