package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/oncewal/oncewal/leader"
	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/replication/inprocess"
	"github.com/oncewal/oncewal/snapshot"
	"github.com/oncewal/oncewal/store"
)

// Transport connects a node to the other members: the endpoint it serves at
// its address — as the leader of a term, or as a follower that tells clients
// where the leader is — and its links to the leader. It is the node's one
// boundary with the network: Memory in process, GRPC over the network.
type Transport interface {
	// Lead opens the endpoint for a term this node leads.
	Lead(shards int) (LeaderEndpoint, error)
	// Follow opens the endpoint while this node follows: a client is told
	// where the leader is, as where reports it now, and may read at a
	// MinLSN from the node's stores (clientapi.Replica); a peer that won an
	// election and is behind on a shard fetches it from snaps.
	Follow(where func() (addr string, epoch uint64), snaps snapshot.Source, reads ReplicaStores) (io.Closer, error)
	// Dialer reaches the leader at addr.
	Dialer(addr string) replication.Dialer
	// Snapshots is where a store the leader at addr refuses for good
	// rebuilds from.
	Snapshots(addr string) snapshot.Source
}

// ReplicaStores are the stores a following node serves client reads at a
// MinLSN from (clientapi.Replica).
type ReplicaStores struct {
	// Shards is the cluster's shard count.
	Shards int
	// Store returns shard's current store (the follower may reopen it).
	Store func(shard uint32) (*store.Store, error)
}

// LeaderEndpoint is a leading node's endpoint.
type LeaderEndpoint interface {
	// Listener is what leader.Open ships shard through; Accept is first
	// called after Serve.
	Listener(shard uint32) replication.Listener
	// Serve starts serving l: its followers' streams, its snapshots and its
	// clients, under c.
	Serve(l *leader.Leader, c ServeConfig) error
	Close() error
}

// ServeConfig is how a leader's endpoint answers clients.
type ServeConfig struct {
	// Ack is the cluster's policy: no client write is answered before it
	// holds (clientapi.Options.MinAck).
	Ack leader.AckPolicy
	// Leading reports whether the term may still be held; a client is
	// answered only while it returns nil (clientapi.Options.Leading).
	Leading func() error
}

// MemoryNet is the members' network in process (tests, the simulation):
// every node's Transport is For(its address), and each follower link is a
// replication/inprocess transport with the net's faults, seeded in order.
type MemoryNet struct {
	faults inprocess.FaultOptions
	mu     sync.Mutex
	seed   uint64
	eps    map[string]*memEndpoint
	peers  map[string]snapshot.Source // following members' snapshots
	cut    map[cutKey]bool
}

type cutKey struct {
	from  string
	shard uint32
}

// NewMemoryNet returns a network whose links inject faults, the n-th link
// seeded with seed + n.
func NewMemoryNet(faults inprocess.FaultOptions, seed uint64) *MemoryNet {
	return &MemoryNet{faults: faults, seed: seed, eps: map[string]*memEndpoint{}, peers: map[string]snapshot.Source{}, cut: map[cutKey]bool{}}
}

// For returns the Transport of the node at addr.
func (m *MemoryNet) For(addr string) Transport { return memTransport{m, addr} }

// Disconnect breaks every link to the leader at addr, as a network blip
// would; it returns the number of connections broken.
func (m *MemoryNet) Disconnect(addr string) int {
	m.mu.Lock()
	ep := m.eps[addr]
	m.mu.Unlock()
	if ep == nil {
		return 0
	}
	n := 0
	for _, t := range ep.linksNow() {
		n += t.Disconnect()
	}
	return n
}

// Cut stops (cut) or lets again the member at from reach any leader for
// shard: its dials fail and its live links of shard break.
func (m *MemoryNet) Cut(from string, shard uint32, cut bool) {
	m.mu.Lock()
	m.cut[cutKey{from, shard}] = cut
	var links []*inprocess.Transport
	if cut {
		for _, ep := range m.eps {
			ep.mu.Lock()
			for _, l := range ep.byFrom[cutKey{from, shard}] {
				links = append(links, l)
			}
			ep.mu.Unlock()
		}
	}
	m.mu.Unlock()
	for _, l := range links {
		l.Disconnect()
	}
}

type memTransport struct {
	m    *MemoryNet
	addr string
}

type memEndpoint struct {
	m      *MemoryNet
	addr   string
	queues []chan *inprocess.Transport
	done   chan struct{}
	once   sync.Once
	mu     sync.Mutex
	links  []*inprocess.Transport
	byFrom map[cutKey][]*inprocess.Transport
	donors []*snapshot.Donor
	leader *leader.Leader
}

func (t memTransport) Lead(shards int) (LeaderEndpoint, error) {
	ep := &memEndpoint{m: t.m, addr: t.addr, queues: make([]chan *inprocess.Transport, shards), done: make(chan struct{}), byFrom: map[cutKey][]*inprocess.Transport{}}
	for s := range ep.queues {
		ep.queues[s] = make(chan *inprocess.Transport)
	}
	t.m.mu.Lock()
	defer t.m.mu.Unlock()
	if old := t.m.eps[t.addr]; old != nil {
		return nil, fmt.Errorf("node: memory net: %s is already served", t.addr)
	}
	t.m.eps[t.addr] = ep
	return ep, nil
}

type closerFunc func() error

func (f closerFunc) Close() error { return f() }

// Follow serves the member's snapshots; clients in process ask nodes
// directly.
func (t memTransport) Follow(_ func() (string, uint64), snaps snapshot.Source, _ ReplicaStores) (io.Closer, error) {
	t.m.mu.Lock()
	defer t.m.mu.Unlock()
	t.m.peers[t.addr] = snaps
	return closerFunc(func() error {
		t.m.mu.Lock()
		defer t.m.mu.Unlock()
		if t.m.peers[t.addr] == snaps {
			delete(t.m.peers, t.addr)
		}
		return nil
	}), nil
}

func (t memTransport) Dialer(addr string) replication.Dialer { return memDialer{t.m, t.addr, addr} }

func (t memTransport) Snapshots(addr string) snapshot.Source { return memSource{t.m, addr} }

func (ep *memEndpoint) Listener(shard uint32) replication.Listener {
	return memListener{ep, shard}
}

func (ep *memEndpoint) Serve(l *leader.Leader, _ ServeConfig) error {
	donors := make([]*snapshot.Donor, l.Shards())
	for s := range donors {
		d, err := l.Donor(uint32(s), nil)
		if err != nil {
			for _, d := range donors[:s] {
				_ = d.Close()
			}
			return err
		}
		donors[s] = d
	}
	ep.mu.Lock()
	ep.donors, ep.leader = donors, l
	ep.mu.Unlock()
	return nil
}

func (ep *memEndpoint) linksNow() []*inprocess.Transport {
	ep.mu.Lock()
	defer ep.mu.Unlock()
	return append([]*inprocess.Transport(nil), ep.links...)
}

func (ep *memEndpoint) Close() error {
	ep.once.Do(func() {
		ep.m.mu.Lock()
		if ep.m.eps[ep.addr] == ep {
			delete(ep.m.eps, ep.addr)
		}
		ep.m.mu.Unlock()
		close(ep.done)
		ep.mu.Lock()
		links, donors := ep.links, ep.donors
		ep.links, ep.donors = nil, nil
		ep.mu.Unlock()
		for _, t := range links {
			_ = t.Close()
		}
		for _, d := range donors {
			_ = d.Close()
		}
	})
	return nil
}

type memListener struct {
	ep    *memEndpoint
	shard uint32
}

// acceptWait bounds the wait for a dialer that handed its link over and
// then gave up before dialing it.
const acceptWait = time.Second

func (l memListener) Accept(ctx context.Context) (replication.LeaderConn, replication.Ack, error) {
	for {
		select {
		case t := <-l.ep.queues[l.shard]:
			actx, cancel := context.WithTimeout(ctx, acceptWait)
			c, h, err := t.Accept(actx)
			cancel()
			if err == nil {
				return c, h, nil
			}
			if ctx.Err() != nil {
				return nil, replication.Ack{}, ctx.Err()
			}
		case <-l.ep.done:
			return nil, replication.Ack{}, fmt.Errorf("node: memory net: %s: %w", l.ep.addr, replication.ErrClosed)
		case <-ctx.Done():
			return nil, replication.Ack{}, ctx.Err()
		}
	}
}

type memDialer struct {
	m          *MemoryNet
	from, addr string
}

func (d memDialer) Dial(ctx context.Context, hello replication.Ack) (replication.FollowerConn, error) {
	d.m.mu.Lock()
	ep := d.m.eps[d.addr]
	var t *inprocess.Transport
	if d.m.cut[cutKey{d.from, hello.Shard}] {
		d.m.mu.Unlock()
		return nil, fmt.Errorf("node: memory net: %s cut from shard %d: %w", d.from, hello.Shard, replication.ErrDisconnected)
	}
	if ep != nil && int(hello.Shard) < len(ep.queues) {
		t = inprocess.New(d.m.faults, d.m.seed)
		d.m.seed++
	}
	d.m.mu.Unlock()
	if t == nil {
		return nil, fmt.Errorf("node: memory net: nobody leads shard %d at %s: %w", hello.Shard, d.addr, replication.ErrDisconnected)
	}
	ep.mu.Lock()
	ep.links = append(ep.links, t)
	k := cutKey{d.from, hello.Shard}
	ep.byFrom[k] = append(ep.byFrom[k], t)
	ep.mu.Unlock()
	select {
	case ep.queues[hello.Shard] <- t:
	case <-ep.done:
		return nil, fmt.Errorf("node: memory net: %s closed: %w", d.addr, replication.ErrDisconnected)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return t.Dial(ctx, hello)
}

type memSource struct {
	m    *MemoryNet
	addr string
}

func (s memSource) donor(shard uint32) (*snapshot.Donor, error) {
	s.m.mu.Lock()
	ep := s.m.eps[s.addr]
	s.m.mu.Unlock()
	if ep != nil {
		ep.mu.Lock()
		defer ep.mu.Unlock()
		if int(shard) < len(ep.donors) {
			return ep.donors[shard], nil
		}
	}
	return nil, fmt.Errorf("node: memory net: no leader serves snapshots of shard %d at %s: %w", shard, s.addr, snapshot.ErrClosed)
}

func (s memSource) peer() snapshot.Source {
	s.m.mu.Lock()
	defer s.m.mu.Unlock()
	if s.m.eps[s.addr] != nil {
		return nil
	}
	return s.m.peers[s.addr]
}

func (s memSource) Begin(ctx context.Context, shard uint32) (snapshot.Manifest, error) {
	if p := s.peer(); p != nil {
		return p.Begin(ctx, shard)
	}
	d, err := s.donor(shard)
	if err != nil {
		return snapshot.Manifest{}, err
	}
	return d.Begin(ctx, shard)
}

// Read and End find the snapshot by its ID in every donor of the leader at
// addr: an ID names its shard's donor only.
func (s memSource) Read(ctx context.Context, id, name string, off int64, p []byte) (int, error) {
	if peer := s.peer(); peer != nil {
		return peer.Read(ctx, id, name, off, p)
	}
	ds, err := s.donors()
	if err != nil {
		return 0, err
	}
	for _, d := range ds {
		n, err := d.Read(ctx, id, name, off, p)
		if err == nil || !errors.Is(err, snapshot.ErrUnknownSnapshot) {
			return n, err
		}
	}
	return 0, fmt.Errorf("node: memory net: snapshot %s at %s: %w", id, s.addr, snapshot.ErrUnknownSnapshot)
}

func (s memSource) End(ctx context.Context, id string) error {
	if peer := s.peer(); peer != nil {
		return peer.End(ctx, id)
	}
	ds, err := s.donors()
	if err != nil {
		return err
	}
	for _, d := range ds {
		_ = d.End(ctx, id) // a donor that does not hold id ignores it
	}
	return nil
}

func (s memSource) donors() ([]*snapshot.Donor, error) {
	s.m.mu.Lock()
	ep := s.m.eps[s.addr]
	s.m.mu.Unlock()
	if ep == nil {
		return nil, fmt.Errorf("node: memory net: no leader at %s: %w", s.addr, snapshot.ErrClosed)
	}
	ep.mu.Lock()
	defer ep.mu.Unlock()
	return append([]*snapshot.Donor(nil), ep.donors...), nil
}
