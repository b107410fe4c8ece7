package testutil

import (
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// ProxyFaults are the faults the TCP proxy injects, per chunk forwarded
// (a chunk is one Read of up to ChunkSize bytes, in either direction).
type ProxyFaults struct {
	Reset    float64       // abort both sides with RST (SO_LINGER 0) before forwarding the chunk
	Drop     float64       // close both sides (FIN) before forwarding the chunk
	Stall    float64       // pause this direction for up to MaxStall before forwarding
	MaxStall time.Duration // default 20ms
	Refuse   float64       // per accepted connection: close it at once
	Chunk    int           // default 4096
}

// FaultProxy is a TCP proxy on 127.0.0.1 between a client and a server (a
// follower and its leader, a client and a node) that breaks connections
// mid-stream. Fault decisions come from one seeded PCG
// stream in the order chunks are forwarded (the order depends on timing;
// the decision sequence does not).
type FaultProxy struct {
	lis    net.Listener
	faults ProxyFaults

	mu     sync.Mutex
	target string
	rng    *rand.Rand
	conns  map[net.Conn]struct{}
	closed bool
	quit   chan struct{}
	wg     sync.WaitGroup

	accepted, resets, drops, stalls, refused atomic.Uint64
}

// ProxyStats count what a FaultProxy did.
type ProxyStats struct{ Accepted, Resets, Drops, Stalls, Refused uint64 }

// Stats returns the counts so far.
func (p *FaultProxy) Stats() ProxyStats {
	return ProxyStats{p.accepted.Load(), p.resets.Load(), p.drops.Load(), p.stalls.Load(), p.refused.Load()}
}

// NewFaultProxy starts a proxy to target; Close stops it.
func NewFaultProxy(t testing.TB, target string, seed uint64, f ProxyFaults) *FaultProxy {
	t.Helper()
	if f.MaxStall <= 0 {
		f.MaxStall = 20 * time.Millisecond
	}
	if f.Chunk <= 0 {
		f.Chunk = 4096
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &FaultProxy{lis: lis, faults: f, target: target, rng: rand.New(rand.NewPCG(seed, 0x70726f7879)),
		conns: make(map[net.Conn]struct{}), quit: make(chan struct{})}
	p.wg.Add(1)
	go p.acceptLoop()
	return p
}

// Addr is the address clients dial instead of the target.
func (p *FaultProxy) Addr() string { return p.lis.Addr().String() }

func (p *FaultProxy) float() float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.rng.Float64()
}

// Break aborts every live connection (RST), as a network failure would.
func (p *FaultProxy) Break() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for c := range p.conns {
		abort(c)
		n++
	}
	return n
}

func abort(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

// Close stops the proxy and aborts every connection.
func (p *FaultProxy) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	close(p.quit)
	for c := range p.conns {
		abort(c)
	}
	p.mu.Unlock()
	p.lis.Close()
	p.wg.Wait()
}

func (p *FaultProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *FaultProxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

func (p *FaultProxy) acceptLoop() {
	defer p.wg.Done()
	for {
		c, err := p.lis.Accept()
		if err != nil {
			return
		}
		p.accepted.Add(1)
		if p.float() < p.faults.Refuse {
			p.refused.Add(1)
			abort(c)
			continue
		}
		p.mu.Lock()
		target := p.target
		p.mu.Unlock()
		up, err := net.DialTimeout("tcp", target, time.Second)
		if err != nil {
			c.Close()
			continue
		}
		if !p.track(c) || !p.track(up) {
			c.Close()
			up.Close()
			continue
		}
		var once sync.Once
		kill := func(rst bool) {
			once.Do(func() {
				if rst {
					abort(c)
					abort(up)
				} else {
					c.Close()
					up.Close()
				}
				p.untrack(c)
				p.untrack(up)
			})
		}
		p.wg.Add(2)
		go p.pipe(c, up, kill)
		go p.pipe(up, c, kill)
	}
}

func (p *FaultProxy) pipe(src, dst net.Conn, kill func(bool)) {
	defer p.wg.Done()
	buf := make([]byte, p.faults.Chunk)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			switch r := p.float(); {
			case r < p.faults.Reset:
				p.resets.Add(1)
				kill(true)
				return
			case r < p.faults.Reset+p.faults.Drop:
				p.drops.Add(1)
				kill(false)
				return
			case r < p.faults.Reset+p.faults.Drop+p.faults.Stall:
				p.stalls.Add(1)
				d := time.Duration(p.float() * float64(p.faults.MaxStall))
				select {
				case <-time.After(d):
				case <-p.quit:
				}
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				kill(false)
				return
			}
		}
		if err != nil {
			kill(!errors.Is(err, io.EOF))
			return
		}
	}
}
