package coord

import (
	"sync"
	"time"
)

// term is what both implementations keep of one leadership's life: its
// Deadline and its Done, tied together as invariant 7 states. A timer
// ends the term when the deadline passes without a renewal; end makes
// the deadline no later than the moment the term ended.
type term struct {
	mu       sync.Mutex
	deadline time.Time // carries a monotonic reading: compare with time.Now only
	ended    bool
	done     chan struct{}
	timer    *time.Timer
}

func newTerm(deadline time.Time) *term {
	t := &term{deadline: deadline, done: make(chan struct{})}
	// Under the lock: a deadline already past fires the timer at once, and
	// expire must not read t.timer before it is set.
	t.mu.Lock()
	t.timer = time.AfterFunc(time.Until(deadline), t.expire)
	t.mu.Unlock()
	return t
}

// expire is the timer's: a renewal may have moved the deadline since the
// timer was set, so it re-arms rather than ends when the deadline is ahead.
func (t *term) expire() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ended {
		return
	}
	if d := time.Until(t.deadline); d > 0 {
		t.timer.Reset(d)
		return
	}
	t.endLocked()
}

// extend moves the deadline to d if that is later; an ended term stays
// ended (a renewal answered after the deadline passed may have come after
// another candidate was granted the key).
func (t *term) extend(d time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ended || !d.After(t.deadline) {
		return
	}
	t.deadline = d
	t.timer.Reset(time.Until(d))
}

// end closes Done and pulls the deadline back to now if it was later.
func (t *term) end() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.endLocked()
}

func (t *term) endLocked() {
	if t.ended {
		return
	}
	t.ended = true
	t.timer.Stop()
	if now := time.Now(); t.deadline.After(now) {
		t.deadline = now
	}
	close(t.done)
}

func (t *term) Deadline() time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.deadline
}

func (t *term) Done() <-chan struct{} { return t.done }
