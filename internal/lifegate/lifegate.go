package lifegate

import (
	"context"
	"sync"
)

// Gate is a lifecycle gate; New makes one.
type Gate struct {
	ctx    context.Context // ended by Close
	cancel context.CancelFunc
	// mu is held shared by holds and by a run's entry, exclusively by
	// Close to set closed: after that no hold is in flight and no run
	// can enter unseen by runs.Wait.
	mu     sync.RWMutex
	closed bool
	runs   sync.WaitGroup
}

// New returns an open Gate.
func New() *Gate {
	g := &Gate{}
	g.ctx, g.cancel = context.WithCancel(context.Background())
	return g
}

// Hold lets a short use of the owner's resources through: Close waits
// until release is called. It reports false after Close began.
func (g *Gate) Hold() (release func(), ok bool) {
	g.mu.RLock()
	if g.closed {
		g.mu.RUnlock()
		return nil, false
	}
	return g.mu.RUnlock, true
}

// Enter lets a long call in: ctx ends when parent ends or Close begins,
// and Close waits until done is called. It reports false after Close
// began.
func (g *Gate) Enter(parent context.Context) (ctx context.Context, done func(), ok bool) {
	g.mu.RLock()
	if g.closed {
		g.mu.RUnlock()
		return nil, nil, false
	}
	g.runs.Add(1)
	g.mu.RUnlock()
	ctx, stop := context.WithCancel(parent)
	unlink := context.AfterFunc(g.ctx, stop)
	return ctx, func() {
		unlink()
		stop()
		g.runs.Done()
	}, true
}

// Context ends when Close begins: for waits that need no Enter (nothing
// to close under them) but must end with the owner.
func (g *Gate) Context() context.Context { return g.ctx }

// Close ends every run's context, waits for the holds in flight, refuses
// new holds and runs, and waits for the runs to return. It reports whether
// this call closed the gate (false: it was closed already; it still waits).
func (g *Gate) Close() bool {
	g.cancel()
	g.mu.Lock()
	first := !g.closed
	g.closed = true
	g.mu.Unlock()
	g.runs.Wait()
	return first
}
