package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/oncewal/oncewal/coord"
)

// faultView is one member's coordinator as the auto-failover demo's faults
// leave it. While deaf (the member killed or paused) it hears nothing: its
// watches deliver nothing, its leaderships' Done stays open and their
// Deadline far ahead (a stopped process checks no clock), its resignations
// and guarded writes are lost; and its lease is no longer renewed
// (cutLease), so it ends a TTL after its last renewal, as a dead process's
// does — etcd is never told. Once it hears again, its watches deliver the
// latest state and a term that ended meanwhile reports Done.
type faultView struct {
	coord.Coordinator
	// cutLease stops the renewals of the leases the member holds (cut
	// true) or lets them through again.
	cutLease func(held []coord.Leadership, cut bool)

	mu   sync.Mutex
	deaf bool
	wake chan struct{} // closed and replaced when the member hears again
	held []coord.Leadership
}

func newFaultView(c coord.Coordinator, cutLease func([]coord.Leadership, bool)) *faultView {
	return &faultView{Coordinator: c, cutLease: cutLease, wake: make(chan struct{})}
}

// errDeaf is what a deaf member's writes to the coordinator answer: they
// never arrive.
var errDeaf = fmt.Errorf("%w: the demo cut this member off", coord.ErrUnavailable)

func (v *faultView) state() (bool, chan struct{}) {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.deaf, v.wake
}

// silence makes the member deaf and stops its leases' renewals.
func (v *faultView) silence() {
	v.mu.Lock()
	v.deaf = true
	held := v.held
	v.mu.Unlock()
	v.cutLease(held, true)
}

// hear lets the member hear (and be heard) again.
func (v *faultView) hear() {
	v.mu.Lock()
	held := v.held
	v.deaf = false
	close(v.wake)
	v.wake = make(chan struct{})
	v.mu.Unlock()
	v.cutLease(held, false)
}

// Campaign implements coord.Coordinator.
func (v *faultView) Campaign(ctx context.Context, cluster string, me coord.Candidate) (coord.Leadership, error) {
	ls, err := v.Coordinator.Campaign(ctx, cluster, me)
	if err != nil {
		return nil, err
	}
	v.mu.Lock()
	v.held = append(v.held, ls)
	v.mu.Unlock()
	done := make(chan struct{})
	go func() {
		<-ls.Done()
		for {
			deaf, wake := v.state()
			if !deaf {
				close(done)
				return
			}
			<-wake
		}
	}()
	return viewLeadership{Leadership: ls, v: v, done: done}, nil
}

// Watch implements coord.Coordinator: while deaf the latest state is held
// back, and delivered when the member hears again.
func (v *faultView) Watch(ctx context.Context, cluster, prefix string) (<-chan map[string][]byte, error) {
	in, err := v.Coordinator.Watch(ctx, cluster, prefix)
	if err != nil {
		return nil, err
	}
	out := make(chan map[string][]byte)
	go func() {
		defer close(out)
		var pending map[string][]byte
		for {
			deaf, wake := v.state()
			var send chan<- map[string][]byte
			var woken <-chan struct{}
			if deaf {
				woken = wake
			} else if pending != nil {
				send = out
			}
			select {
			case m, ok := <-in:
				if !ok {
					return
				}
				pending = m
			case send <- pending:
				pending = nil
			case <-woken:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out, nil
}

// Update implements coord.Coordinator: a deaf member's writes are lost.
func (v *faultView) Update(ctx context.Context, cluster, key string, fn func([]byte, bool) ([]byte, error)) error {
	if deaf, _ := v.state(); deaf {
		return errDeaf
	}
	return v.Coordinator.Update(ctx, cluster, key, fn)
}

type viewLeadership struct {
	coord.Leadership
	v    *faultView
	done chan struct{}
}

func (l viewLeadership) Done() <-chan struct{} { return l.done }

func (l viewLeadership) Deadline() time.Time {
	if deaf, _ := l.v.state(); deaf {
		return time.Now().Add(time.Hour)
	}
	return l.Leadership.Deadline()
}

func (l viewLeadership) Guarded(ctx context.Context, ops ...coord.Op) error {
	if deaf, _ := l.v.state(); deaf {
		return errDeaf
	}
	return l.Leadership.Guarded(ctx, ops...)
}

func (l viewLeadership) Resign(ctx context.Context) error {
	if deaf, _ := l.v.state(); deaf {
		return errDeaf
	}
	return l.Leadership.Resign(ctx)
}

// expireAtDeadline is cutLease on coord.Memory: a lease no longer renewed
// ends at its deadline (its last renewal plus the TTL).
func expireAtDeadline(m *coord.Memory) func([]coord.Leadership, bool) {
	return func(held []coord.Leadership, cut bool) {
		if !cut {
			return
		}
		for _, ls := range held {
			time.AfterFunc(time.Until(ls.Deadline()), func() { m.Expire(ls) })
		}
	}
}

// etcdRelay is a TCP relay between one member's etcd client and one etcd
// endpoint. Cutting it plays a member etcd no longer hears from: its lease
// renewals and its resignation never arrive, so etcd expires its lease a TTL
// after the last renewal, as a dead process's.
type etcdRelay struct {
	lis    net.Listener
	target string

	mu    sync.Mutex
	cut   bool
	conns map[net.Conn]struct{}
}

// relayTarget is the host:port of an etcd endpoint (http://HOST:PORT or
// HOST:PORT).
func relayTarget(endpoint string) (string, error) {
	if !strings.Contains(endpoint, "://") {
		endpoint = "http://" + endpoint
	}
	u, err := url.Parse(endpoint)
	switch {
	case err != nil:
		return "", fmt.Errorf("etcd endpoint %q: %w", endpoint, err)
	case u.Scheme != "http":
		return "", fmt.Errorf("etcd endpoint %q: the demo speaks plaintext to etcd: give http://HOST:PORT", endpoint)
	case u.Port() == "":
		return "", fmt.Errorf("etcd endpoint %q: give HOST:PORT", endpoint)
	}
	return u.Host, nil
}

func newEtcdRelay(target string) (*etcdRelay, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &etcdRelay{lis: lis, target: target, conns: map[net.Conn]struct{}{}}
	go r.accept()
	return r, nil
}

// URL is the endpoint the member's etcd client is given.
func (r *etcdRelay) URL() string { return "http://" + r.lis.Addr().String() }

func (r *etcdRelay) accept() {
	for {
		c, err := r.lis.Accept()
		if err != nil {
			return
		}
		go r.relay(c)
	}
}

// track adds c to the live connections, or closes it if the relay is cut.
func (r *etcdRelay) track(c net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cut {
		_ = c.Close()
		return false
	}
	r.conns[c] = struct{}{}
	return true
}

func (r *etcdRelay) untrack(c net.Conn) {
	r.mu.Lock()
	delete(r.conns, c)
	r.mu.Unlock()
	_ = c.Close()
}

func (r *etcdRelay) relay(c net.Conn) {
	if !r.track(c) {
		return
	}
	defer r.untrack(c)
	up, err := net.DialTimeout("tcp", r.target, 5*time.Second)
	if err != nil {
		return
	}
	if !r.track(up) {
		return
	}
	defer r.untrack(up)
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		done <- struct{}{}
	}
	go pipe(up, c)
	go pipe(c, up)
	<-done
}

// setCut cuts the relay (every connection closed, new ones refused) or
// lets connections through again.
func (r *etcdRelay) setCut(cut bool) {
	r.mu.Lock()
	r.cut = cut
	var live []net.Conn
	if cut {
		for c := range r.conns {
			live = append(live, c)
		}
	}
	r.mu.Unlock()
	for _, c := range live {
		_ = c.Close()
	}
}

// Close cuts the relay for good.
func (r *etcdRelay) Close() {
	r.setCut(true)
	_ = r.lis.Close()
}
