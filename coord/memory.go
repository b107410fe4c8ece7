package coord

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
)

// Memory is the Coordinator in process, for unit tests and the simulation:
// one Memory plays one etcd, shared by every node of a test. It keeps the
// package's invariants with one revision counter, as etcd does; Expire
// plays a session's lease ending. NewMemory makes one.
type Memory struct {
	mu       sync.Mutex
	rev      int64
	ttl      time.Duration
	closed   bool
	done     chan struct{} // closed by Close
	clusters map[string]*memCluster
}

type memCluster struct {
	queue   []*memLeadership // candidates by create revision; queue[0] leads
	data    map[string]memValue
	changed chan struct{} // closed and replaced at every change of queue or data
}

// memValue is a data key's value and its last write's revision, which
// Update compares as etcd compares ModRevision.
type memValue struct {
	value []byte
	mod   int64
}

// minMemoryTTL keeps Memory's renewals (every TTL/3) from spinning.
const minMemoryTTL = 3 * time.Millisecond

// NewMemory returns an empty in-process coordinator whose leases last
// DefaultLeaseTTL (SetTTL changes it).
func NewMemory() *Memory {
	return &Memory{ttl: DefaultLeaseTTL, done: make(chan struct{}), clusters: map[string]*memCluster{}}
}

// SetTTL sets the lease of the terms campaigned for from now on: each is
// renewed every ttl/3, and its Deadline is its last renewal plus ttl
// (invariant 7; one clock, so no margin). A ttl under minMemoryTTL is
// refused with ErrBadInput.
func (m *Memory) SetTTL(ttl time.Duration) error {
	if ttl < minMemoryTTL {
		return fmt.Errorf("%w: lease TTL %v: give at least %v", ErrBadInput, ttl, minMemoryTTL)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.ttl = ttl
	return nil
}

// LeaseTTL implements Coordinator.
func (m *Memory) LeaseTTL() time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.ttl
}

func (m *Memory) cluster(name string) *memCluster {
	cl := m.clusters[name]
	if cl == nil {
		cl = &memCluster{data: map[string]memValue{}, changed: make(chan struct{})}
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
	l := &memLeadership{m: m, cl: cl, name: cluster, leader: Leader{Candidate: me, Epoch: uint64(m.rev)},
		t: newTerm(time.Now().Add(m.ttl))}
	go l.renew(m.ttl)
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

// renew plays the session's keep-alive: every ttl/3 the lease is renewed
// to ttl from now. A term that ends otherwise (its deadline passed) is a
// lease that expired: its key goes as etcd would delete it.
func (l *memLeadership) renew(ttl time.Duration) {
	tick := time.NewTicker(ttl / 3)
	defer tick.Stop()
	for {
		select {
		case now := <-tick.C:
			l.t.extend(now.Add(ttl))
		case <-l.t.Done():
			l.m.mu.Lock()
			l.m.endLocked(l)
			l.m.mu.Unlock()
			return
		}
	}
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
	l.t.end()
	l.cl.queue = slices.DeleteFunc(l.cl.queue, func(x *memLeadership) bool { return x == l })
	m.rev++
	m.changedLocked(l.cl)
}

// Expire ends l's term as its lease ending would: its key is deleted, its
// Done closes, its Deadline passes, and the next candidate wins. l must
// come from m.
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
	ch := make(chan Leader)
	err := memFollow(m, ctx, cluster, ch, (*memCluster).leader, func(a, b Leader) bool { return a == b })
	if err != nil {
		return nil, err
	}
	return ch, nil
}

// Watch implements Coordinator.
func (m *Memory) Watch(ctx context.Context, cluster, prefix string) (<-chan map[string][]byte, error) {
	if err := checkCluster(cluster); err != nil {
		return nil, err
	}
	view := func(cl *memCluster) map[string][]byte {
		out := map[string][]byte{}
		for k, v := range cl.data {
			if strings.HasPrefix(k, prefix) {
				out[k] = bytes.Clone(v.value)
			}
		}
		return out
	}
	ch := make(chan map[string][]byte)
	if err := memFollow(m, ctx, cluster, ch, view, equalData); err != nil {
		return nil, err
	}
	return ch, nil
}

// memFollow reports view(cluster) to ch, first as it is, then whenever it
// differs from the last report (invariants 5 and 8); a slow reader gets
// the view as it is when it reads, since the view is taken again after
// every change.
func memFollow[T any](m *Memory, ctx context.Context, cluster string, ch chan<- T,
	view func(*memCluster) T, equal func(a, b T) bool) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return ErrClosed
	}
	cl := m.cluster(cluster)
	go func() {
		defer close(ch)
		var last T
		sent := false
		for {
			m.mu.Lock()
			cur, changed := view(cl), cl.changed
			m.mu.Unlock()
			if !sent || !equal(cur, last) {
				select {
				case ch <- cur:
					last, sent = cur, true
					continue // the view may have changed while it waited
				case <-changed:
					continue
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
	return nil
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
	return bytes.Clone(v.value), ok, nil
}

// Update implements Coordinator (invariant 9): fn runs without the lock,
// and its value is written only if the key's revision is still the one
// fn was given.
func (m *Memory) Update(ctx context.Context, cluster, key string, fn func([]byte, bool) ([]byte, error)) error {
	if err := checkUpdate(cluster, key, fn); err != nil {
		return err
	}
	for {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("coord: update %s of %s: %w", key, cluster, err)
		}
		m.mu.Lock()
		if m.closed {
			m.mu.Unlock()
			return ErrClosed
		}
		cl := m.cluster(cluster)
		old, ok := cl.data[key]
		m.mu.Unlock()
		v, err := fn(bytes.Clone(old.value), ok)
		if err != nil {
			return fmt.Errorf("coord: update %s of %s: %w", key, cluster, err)
		}
		m.mu.Lock()
		if m.closed {
			m.mu.Unlock()
			return ErrClosed
		}
		if cur, still := cl.data[key]; still != ok || cur.mod != old.mod {
			m.mu.Unlock()
			continue
		}
		if v != nil || ok {
			m.writeLocked(cl, []Op{{key: key, value: v, delete: v == nil}})
		}
		m.mu.Unlock()
		return nil
	}
}

// writeLocked applies ops at one new revision.
func (m *Memory) writeLocked(cl *memCluster, ops []Op) {
	m.rev++
	for _, op := range ops {
		if op.delete {
			delete(cl.data, op.key)
		} else {
			cl.data[op.key] = memValue{value: bytes.Clone(op.value), mod: m.rev}
		}
	}
	m.changedLocked(cl)
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
	t      *term
	ended  bool // guarded by m.mu
}

func (l *memLeadership) Leader() Leader        { return l.leader }
func (l *memLeadership) Epoch() uint64         { return l.leader.Epoch }
func (l *memLeadership) Done() <-chan struct{} { return l.t.Done() }
func (l *memLeadership) Deadline() time.Time   { return l.t.Deadline() }

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
	select {
	case <-l.t.Done():
		// Its deadline passed: the renewer deletes the key at once.
		l.m.endLocked(l)
	default:
	}
	if l.ended {
		return fmt.Errorf("%w: %s at epoch %d: its election key is gone", ErrLostLeadership, l.name, l.leader.Epoch)
	}
	l.m.writeLocked(l.cl, ops)
	return nil
}

// Resign implements Leadership.
func (l *memLeadership) Resign(context.Context) error {
	l.m.mu.Lock()
	l.m.endLocked(l)
	l.m.mu.Unlock()
	return nil
}
