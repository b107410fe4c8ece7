package grpctransport

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// proxyFaults are the faults the TCP proxy injects, per chunk forwarded
// (a chunk is one Read of up to ChunkSize bytes, in either direction).
type proxyFaults struct {
	Reset    float64       // abort both sides with RST (SO_LINGER 0) before forwarding the chunk
	Drop     float64       // close both sides (FIN) before forwarding the chunk
	Stall    float64       // pause this direction for up to MaxStall before forwarding
	MaxStall time.Duration // default 20ms
	Refuse   float64       // per accepted connection: close it at once
	Chunk    int           // default 4096
}

// faultProxy is a TCP proxy on 127.0.0.1 between follower and leader that
// breaks connections mid-stream. Fault decisions come from one seeded PCG
// stream in the order chunks are forwarded (the order depends on timing;
// the decision sequence does not).
type faultProxy struct {
	lis    net.Listener
	faults proxyFaults

	mu     sync.Mutex
	target string
	rng    *rand.Rand
	conns  map[net.Conn]struct{}
	closed bool
	quit   chan struct{}
	wg     sync.WaitGroup

	accepted, resets, drops, stalls, refused atomic.Uint64
}

func newFaultProxy(t testing.TB, target string, seed uint64, f proxyFaults) *faultProxy {
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
	p := &faultProxy{lis: lis, faults: f, target: target, rng: rand.New(rand.NewPCG(seed, 0x70726f7879)),
		conns: make(map[net.Conn]struct{}), quit: make(chan struct{})}
	p.wg.Add(1)
	go p.acceptLoop()
	return p
}

func (p *faultProxy) Addr() string { return p.lis.Addr().String() }

func (p *faultProxy) float() float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.rng.Float64()
}

// Break aborts every live connection (RST), as a network failure would.
func (p *faultProxy) Break() int {
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

func (p *faultProxy) Close() {
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

func (p *faultProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *faultProxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

func (p *faultProxy) acceptLoop() {
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

func (p *faultProxy) pipe(src, dst net.Conn, kill func(bool)) {
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

// logRecorder is a slog handler that keeps every record's message and
// attributes as one line, for tests that assert a log line was written.
type logRecorder struct {
	mu    *sync.Mutex
	lines *[]string
	attrs []slog.Attr
}

func newLogRecorder() (*slog.Logger, *logRecorder) {
	r := &logRecorder{mu: new(sync.Mutex), lines: new([]string)}
	return slog.New(r), r
}

func (r *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *logRecorder) Handle(_ context.Context, rec slog.Record) error {
	var b strings.Builder
	b.WriteString(rec.Level.String() + " " + rec.Message)
	for _, a := range r.attrs {
		b.WriteString(" " + a.String())
	}
	rec.Attrs(func(a slog.Attr) bool { b.WriteString(" " + a.String()); return true })
	r.mu.Lock()
	*r.lines = append(*r.lines, b.String())
	r.mu.Unlock()
	return nil
}
func (r *logRecorder) WithAttrs(as []slog.Attr) slog.Handler {
	c := *r
	c.attrs = append(append([]slog.Attr(nil), r.attrs...), as...)
	return &c
}
func (r *logRecorder) WithGroup(string) slog.Handler { return r }

func (r *logRecorder) Lines() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), *r.lines...)
}

// find returns the first line containing every part.
func (r *logRecorder) find(parts ...string) (string, bool) {
	for _, l := range r.Lines() {
		ok := true
		for _, p := range parts {
			if !strings.Contains(l, p) {
				ok = false
				break
			}
		}
		if ok {
			return l, true
		}
	}
	return "", false
}

// waitFor polls cond until it holds or ctx ends.
func waitFor(t testing.TB, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s", what)
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// checkGoroutines fails the test if goroutines of gRPC or this package are
// still running a few seconds after the test's cleanups closed everything.
func checkGoroutines(t *testing.T) {
	t.Helper()
	t.Cleanup(func() {
		var last []string
		deadline := time.Now().Add(5 * time.Second)
		for {
			last = leaked()
			if len(last) == 0 {
				return
			}
			if time.Now().After(deadline) {
				t.Errorf("%d goroutines outlived Close:\n%s", len(last), strings.Join(last, "\n\n"))
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
}

func leaked() []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "checkGoroutines") || strings.Contains(g, "leaked()") {
			continue
		}
		if strings.Contains(g, "google.golang.org/grpc") || strings.Contains(g, "replication/grpctransport.") ||
			strings.Contains(g, "oncewal/follower.") || strings.Contains(g, "oncewal/replication.") {
			out = append(out, g)
		}
	}
	return out
}
