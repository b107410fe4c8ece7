package sim

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"slices"
	"sort"
	"sync/atomic"
	"time"

	"github.com/oncewal/oncewal/leader"

	"github.com/oncewal/oncewal/follower"
	"github.com/oncewal/oncewal/idempotency"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/wal"
)

// Oracle is the expected follower state, computed without any of the
// followers' dedup machinery: a map per session, each distinct operation
// applied once.
type Oracle struct {
	state  map[session.ID]map[string][]byte
	closed map[session.ID]bool
	seen   map[idempotency.Key]bool
}

// NewOracle returns an empty oracle.
func NewOracle() *Oracle {
	return &Oracle{state: map[session.ID]map[string][]byte{}, closed: map[session.ID]bool{}, seen: map[idempotency.Key]bool{}}
}

// Apply applies one operation (the caller applies each distinct operation
// once: that is the point of an oracle).
func (o *Oracle) Apply(ev *wal.Event) {
	m := o.state[ev.Session]
	if m == nil {
		m = map[string][]byte{}
		o.state[ev.Session] = m
	}
	k := string(ev.Key)
	switch ev.Op {
	case wal.OpPut:
		m[k] = bytes.Clone(ev.Value)
	case wal.OpDelete:
		delete(m, k)
	case wal.OpAdd:
		var cur int64
		if v := m[k]; len(v) == 8 {
			cur = int64(binary.LittleEndian.Uint64(v))
		}
		m[k] = binary.LittleEndian.AppendUint64(nil, uint64(cur+ev.Delta))
	case wal.OpClose:
		o.closed[ev.Session] = true
	}
}

// Once applies ev as the operation identified by id, by the rule the
// followers must implement: an operation takes effect once, however often
// it is logged, and nothing takes effect in a session after its close. It
// reports whether ev took effect. Ledger records have no effect on the
// session state and are ignored.
func (o *Oracle) Once(id idempotency.Key, ev *wal.Event) bool {
	if ev.Op.IsLedger() || o.closed[ev.Session] || o.seen[id] {
		return false
	}
	o.seen[id] = true
	o.Apply(ev)
	return true
}

// Logged applies one event of a log by the rule of Once, identified by its
// idempotency key (stamped events all carry one).
func (o *Oracle) Logged(ev *wal.Event) bool { return o.Once(ev.IdemKey, ev) }

// Sessions returns every session the oracle has seen, sorted.
func (o *Oracle) Sessions() []session.ID {
	ids := make([]session.ID, 0, len(o.state))
	for id := range o.state {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return bytes.Compare(ids[i][:], ids[j][:]) < 0 })
	return ids
}

// Expect returns the expected state of one session.
func (o *Oracle) Expect(id session.ID) map[string][]byte { return o.state[id] }

// Closed reports whether the session was closed.
func (o *Oracle) Closed(id session.ID) bool { return o.closed[id] }

// StateReader is what Verify needs from a follower's state machine.
type StateReader interface {
	Keys(id session.ID) (map[string][]byte, error)
}

// Verify compares a follower's state with the oracle, session by session,
// and describes the first difference.
func (o *Oracle) Verify(st StateReader) error { return o.VerifyOnly(st, nil) }

// VerifyOnly is Verify restricted to the sessions keep accepts (all when
// keep is nil): a shard's store holds only the shard's sessions.
func (o *Oracle) VerifyOnly(st StateReader, keep func(session.ID) bool) error {
	for _, id := range o.Sessions() {
		if keep != nil && !keep(id) {
			continue
		}
		got, err := st.Keys(id)
		if err != nil {
			return fmt.Errorf("reading session %s: %w", id, err)
		}
		want := o.state[id]
		if len(got) != len(want) {
			return fmt.Errorf("session %s: %d keys, want %d (got %s, want %s)", id, len(got), len(want), fmtState(got), fmtState(want))
		}
		for k, wv := range want {
			if gv, ok := got[k]; !ok || !bytes.Equal(gv, wv) {
				return fmt.Errorf("session %s key %q: got %x (present %v), want %x", id, k, gv, ok, wv)
			}
		}
	}
	return nil
}

func fmtState(m map[string][]byte) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b bytes.Buffer
	for _, k := range keys {
		fmt.Fprintf(&b, "%s=%x ", k, m[k])
	}
	return b.String()
}

// RoutedState reads a sharded follower node's session state: each session
// from the shard the router assigns it, so a session applied on the wrong
// shard shows up as missing.
type RoutedState struct {
	Router leader.ShardRouter
	Node   *follower.Node
}

// Keys implements StateReader.
func (r RoutedState) Keys(id session.ID) (map[string][]byte, error) {
	var out map[string][]byte
	err := r.Node.Follower(r.Router.Shard(id), func(f *follower.Follower) error {
		var err error
		out, err = f.State().Keys(id)
		return err
	})
	return out, err
}

// Clock is a simulated wall clock in unix nanoseconds, for a leader's
// Options.Wall: it moves only when the simulation advances it, so a seeded
// run stamps the same times whatever the machine's speed.
type Clock struct{ ns atomic.Int64 }

// NewClock returns a clock reading start.
func NewClock(start time.Time) *Clock {
	c := &Clock{}
	c.ns.Store(start.UnixNano())
	return c
}

// Now reads the clock.
func (c *Clock) Now() int64 { return c.ns.Load() }

// Advance moves the clock by d.
func (c *Clock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

// Set moves the clock to ns.
func (c *Clock) Set(ns int64) { c.ns.Store(ns) }
