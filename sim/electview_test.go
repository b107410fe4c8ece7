package sim

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/oncewal/oncewal/coord"
)

// viewState is what a member's view of the coordinator lets through.
type viewState int

const (
	viewUp viewState = iota
	// viewPaused: the process is stopped (SIGSTOP). It makes no call (each
	// blocks until it runs again), hears nothing, and believes what it
	// believed: its leaderships' Done stays open and their Deadline ahead,
	// although its lease ran out (the nemesis expires it).
	viewPaused
	// viewCut: the member cannot reach etcd. Every call fails with
	// coord.ErrUnavailable, it hears nothing, and its lease runs out (the
	// nemesis expires it); its terms end as etcd's would (Done, Deadline).
	viewCut
	// viewDead: the process died; as cut, for good.
	viewDead
)

// memberView is one member's view of the cluster's coordinator, which the
// nemesis pauses, cuts or kills. A coord.Memory renews every lease by
// itself, so what a member cut off or stopped would lose — its lease — the
// nemesis takes with expire, and a campaign that wins while the member
// cannot renew is expired at once.
type memberView struct {
	coord.Coordinator
	mem *coord.Memory

	mu      sync.Mutex
	state   viewState
	changed chan struct{} // closed and replaced at every change of state
	held    []coord.Leadership
}

func newMemberView(mem *coord.Memory) *memberView {
	return &memberView{Coordinator: mem, mem: mem, changed: make(chan struct{})}
}

func (v *memberView) now() (viewState, <-chan struct{}) {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.state, v.changed
}

func (v *memberView) set(s viewState) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.state == viewDead || v.state == s {
		return
	}
	v.state = s
	close(v.changed)
	v.changed = make(chan struct{})
}

// expire ends every term the member holds, as its lease running out while
// it cannot renew it does.
func (v *memberView) expire() {
	v.mu.Lock()
	held := v.held
	v.held = nil
	v.mu.Unlock()
	for _, ls := range held {
		v.mem.Expire(ls)
	}
}

// gate waits while the member is paused and refuses a call it cannot make.
func (v *memberView) gate(ctx context.Context) error {
	for {
		s, changed := v.now()
		switch s {
		case viewUp:
			return nil
		case viewCut, viewDead:
			return fmt.Errorf("sim: member cut from the coordinator: %w", coord.ErrUnavailable)
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (v *memberView) Campaign(ctx context.Context, cluster string, me coord.Candidate) (coord.Leadership, error) {
	if err := v.gate(ctx); err != nil {
		return nil, err
	}
	ls, err := v.Coordinator.Campaign(ctx, cluster, me)
	if err != nil {
		return nil, err
	}
	v.mu.Lock()
	up := v.state == viewUp
	if up {
		v.held = append(v.held, ls)
	}
	v.mu.Unlock()
	if !up {
		// Won while it could not renew: the lease is gone by now.
		v.mem.Expire(ls)
		if err := v.gate(ctx); err != nil {
			return nil, err
		}
		return nil, fmt.Errorf("sim: won while unreachable: %w", coord.ErrLostLeadership)
	}
	vl := &viewLeadership{Leadership: ls, v: v, done: make(chan struct{})}
	go vl.watchDone()
	return vl, nil
}

func (v *memberView) Observe(ctx context.Context, cluster string) (<-chan coord.Leader, error) {
	if err := v.gate(ctx); err != nil {
		return nil, err
	}
	return v.Coordinator.Observe(ctx, cluster)
}

func (v *memberView) Get(ctx context.Context, cluster, key string) ([]byte, bool, error) {
	if err := v.gate(ctx); err != nil {
		return nil, false, err
	}
	return v.Coordinator.Get(ctx, cluster, key)
}

func (v *memberView) Update(ctx context.Context, cluster, key string, fn func([]byte, bool) ([]byte, error)) error {
	if err := v.gate(ctx); err != nil {
		return err
	}
	return v.Coordinator.Update(ctx, cluster, key, fn)
}

// Watch delivers the latest state only while the member is up: what
// changed meanwhile arrives, as its latest state, when it is up again.
func (v *memberView) Watch(ctx context.Context, cluster, prefix string) (<-chan map[string][]byte, error) {
	if err := v.gate(ctx); err != nil {
		return nil, err
	}
	in, err := v.Coordinator.Watch(ctx, cluster, prefix)
	if err != nil {
		return nil, err
	}
	out := make(chan map[string][]byte)
	go func() {
		defer close(out)
		var latest map[string][]byte
		pending := false
		for {
			s, changed := v.now()
			var send chan map[string][]byte
			if s == viewUp && pending {
				send = out
			}
			select {
			case m, ok := <-in:
				if !ok {
					return
				}
				latest, pending = m, true
			case send <- latest:
				pending = false
			case <-changed:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out, nil
}

// Close leaves the shared coordinator open: the run closes it.
func (v *memberView) Close() error { return nil }

// viewLeadership is a term seen through a member's view: while the member
// is paused its Done stays open and its Deadline ahead (what a stopped
// process last knew); its writes wait or fail as the view's calls do.
type viewLeadership struct {
	coord.Leadership
	v    *memberView
	done chan struct{}
}

func (l *viewLeadership) watchDone() {
	<-l.Leadership.Done()
	for {
		s, changed := l.v.now()
		if s != viewPaused {
			close(l.done)
			return
		}
		<-changed
	}
}

func (l *viewLeadership) Done() <-chan struct{} { return l.done }

func (l *viewLeadership) Deadline() time.Time {
	if s, _ := l.v.now(); s == viewPaused {
		return time.Now().Add(time.Hour)
	}
	return l.Leadership.Deadline()
}

func (l *viewLeadership) Guarded(ctx context.Context, ops ...coord.Op) error {
	if err := l.v.gate(ctx); err != nil {
		return err
	}
	return l.Leadership.Guarded(ctx, ops...)
}

func (l *viewLeadership) Resign(ctx context.Context) error {
	if err := l.v.gate(ctx); err != nil {
		return err
	}
	return l.Leadership.Resign(ctx)
}
