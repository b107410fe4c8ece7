package testutil

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"sort"
	"time"

	"github.com/oncewal/oncewal/idempotency"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/wal"
)

// WorkloadConfig shapes a generated leader workload.
type WorkloadConfig struct {
	Seed           uint64
	Sessions       int     // concurrent sessions; default 8
	Events         int     // logical operations (excluding re-appends); default 500
	KeysPerSession int     // distinct state keys per session; default 4
	BatchSize      int     // max events per leader batch; default 32
	DupRate        float64 // chance an append re-logs an earlier event verbatim (same session, SeqNo, key)
	RetryRate      float64 // chance an op is re-logged under a fresh SeqNo with the same client key
	CloseRate      float64 // chance per op that a session closes (and a new one opens in its place)
	// RetryDistance bounds how many keyed events back a retry may reach; the
	// follower's window must hold at least this many keys. Default 64.
	RetryDistance int
	Start         time.Time // WAL clock of the first event; default 2026-01-01
}

func (c *WorkloadConfig) ensureDefaults() {
	if c.Sessions <= 0 {
		c.Sessions = 8
	}
	if c.Events <= 0 {
		c.Events = 500
	}
	if c.KeysPerSession <= 0 {
		c.KeysPerSession = 4
	}
	if c.BatchSize <= 0 {
		c.BatchSize = 32
	}
	if c.RetryDistance <= 0 {
		c.RetryDistance = 64
	}
	if c.Start.IsZero() {
		c.Start = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	}
}

// Workload is a generated leader log and the oracle that applies each distinct
// operation exactly once.
type Workload struct {
	Batches [][]wal.Event // what the leader appends, batch by batch
	Oracle  *Oracle
	// Counts of what the generator put in the log.
	Logged, Distinct, Reappends, Retries, LateWrites int
}

// GenerateWorkload builds a deterministic workload from cfg.Seed. Events carry
// idempotency keys: fresh operations get DeriveKey(session, SeqNo, op bytes);
// about half carry a client-style key instead, which retries reuse under a
// fresh SeqNo so only the window can recognise them.
func GenerateWorkload(cfg WorkloadConfig) *Workload {
	cfg.ensureDefaults()
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x6f6e636577616c))
	w := &Workload{Oracle: NewOracle()}
	clock := cfg.Start.UnixNano()
	seq := session.NewSequencer()

	newID := func() session.ID {
		var id session.ID
		binary.LittleEndian.PutUint64(id[:8], rng.Uint64())
		binary.LittleEndian.PutUint64(id[8:], rng.Uint64())
		return id
	}
	var live []session.ID
	var closed []session.ID
	var logged []wal.Event // every event appended, for verbatim re-appends
	var keyed []wal.Event  // ops with client keys that took effect, for retries
	var batch []wal.Event
	var opBuf []byte

	emit := func(ev wal.Event) {
		batch = append(batch, ev)
		logged = append(logged, ev)
		w.Logged++
		if len(batch) >= 1+rng.IntN(cfg.BatchSize) {
			w.Batches = append(w.Batches, batch)
			batch = nil
		}
	}
	tick := func() int64 {
		clock += int64(rng.IntN(3_000_000)) // up to 3 ms between events
		return clock
	}
	open := func() session.ID {
		id := newID()
		ev := wal.Event{Op: wal.OpOpen, Session: id, Seq: seq.Next(id), Time: tick()}
		ev.HasIdemKey, ev.IdemKey = true, idempotency.DeriveKey(id, ev.Seq, ev.AppendOpBytes(opBuf[:0]))
		w.Oracle.open(id)
		w.Distinct++
		emit(ev)
		return id
	}
	for range cfg.Sessions {
		live = append(live, open())
	}

	for n := 0; n < cfg.Events; n++ {
		r := rng.Float64()
		switch {
		case r < cfg.DupRate && len(logged) > 0:
			// A verbatim re-append: same session, SeqNo and key.
			back := min(len(logged), 256)
			ev := logged[len(logged)-1-rng.IntN(back)]
			ev.Time = tick()
			w.Reappends++
			emit(ev)
			continue
		case r < cfg.DupRate+cfg.RetryRate && len(keyed) > 0:
			// A client retry: the same operation and client key, a fresh
			// SeqNo; the original took effect, so this one must not.
			back := min(len(keyed), cfg.RetryDistance)
			orig := keyed[len(keyed)-1-rng.IntN(back)]
			if w.Oracle.closed[orig.Session] {
				break // the session is gone; a real client would get an error
			}
			ev := orig
			ev.Seq = seq.Next(ev.Session)
			ev.Time = tick()
			w.Retries++
			emit(ev)
			continue
		}
		i := rng.IntN(len(live))
		id := live[i]
		if rng.Float64() < cfg.CloseRate {
			ev := wal.Event{Op: wal.OpClose, Session: id, Seq: seq.Next(id), Time: tick()}
			ev.HasIdemKey, ev.IdemKey = true, idempotency.DeriveKey(id, ev.Seq, ev.AppendOpBytes(opBuf[:0]))
			w.Oracle.closed[id] = true
			w.Distinct++
			emit(ev)
			closed = append(closed, id)
			live[i] = open()
			continue
		}
		if len(closed) > 0 && rng.IntN(50) == 0 {
			// A late write to a closed session (the client missed the
			// close): logged with the next SeqNo, never applied.
			id := closed[rng.IntN(len(closed))]
			ev := wal.Event{Op: wal.OpPut, Session: id, Seq: seq.Next(id), Time: tick(), Key: []byte("late"), Value: []byte("x")}
			w.LateWrites++
			emit(ev)
			continue
		}
		key := []byte(fmt.Sprintf("k%d", rng.IntN(cfg.KeysPerSession)))
		ev := wal.Event{Session: id, Seq: seq.Next(id), Time: tick(), Key: key}
		switch op := rng.IntN(10); {
		case op < 4:
			ev.Op = wal.OpAdd
			ev.Delta = int64(rng.IntN(2001) - 1000)
		case op < 8:
			ev.Op = wal.OpPut
			ev.Value = []byte(fmt.Sprintf("v%d", rng.Uint32()))
		default:
			ev.Op = wal.OpDelete
		}
		ev.HasIdemKey = true
		if rng.IntN(2) == 0 {
			// Client-style key: random, reused by retries.
			binary.LittleEndian.PutUint64(ev.IdemKey[:8], rng.Uint64())
			binary.LittleEndian.PutUint64(ev.IdemKey[8:], rng.Uint64())
			keyed = append(keyed, ev)
		} else {
			ev.IdemKey = idempotency.DeriveKey(id, ev.Seq, ev.AppendOpBytes(opBuf[:0]))
		}
		w.Oracle.apply(&ev)
		w.Distinct++
		emit(ev)
	}
	if len(batch) > 0 {
		w.Batches = append(w.Batches, batch)
	}
	return w
}

// Oracle is the expected follower state: every distinct operation applied
// exactly once, computed without any dedup machinery.
type Oracle struct {
	state  map[session.ID]map[string][]byte
	closed map[session.ID]bool
}

// NewOracle returns an empty oracle.
func NewOracle() *Oracle {
	return &Oracle{state: map[session.ID]map[string][]byte{}, closed: map[session.ID]bool{}}
}

func (o *Oracle) open(id session.ID) {
	if o.state[id] == nil {
		o.state[id] = map[string][]byte{}
	}
}

func (o *Oracle) apply(ev *wal.Event) {
	o.open(ev.Session)
	m := o.state[ev.Session]
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
		v := make([]byte, 8)
		binary.LittleEndian.PutUint64(v, uint64(cur+ev.Delta))
		m[k] = v
	}
}

// Apply applies one operation to the oracle (the caller applies each distinct
// operation once: that is the point of an oracle).
func (o *Oracle) Apply(ev *wal.Event) {
	o.apply(ev)
	if ev.Op == wal.OpClose {
		o.closed[ev.Session] = true
	}
}

// Sessions returns every session the workload opened, sorted.
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

// Closed reports whether the workload closed the session.
func (o *Oracle) Closed(id session.ID) bool { return o.closed[id] }

// StateReader is what Verify needs from a follower's state machine.
type StateReader interface {
	Keys(id session.ID) (map[string][]byte, error)
}

// Verify compares a follower's state with the oracle, session by session, and
// describes the first difference.
func (o *Oracle) Verify(st StateReader) error {
	for _, id := range o.Sessions() {
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
	sort.Strings(keys)
	var b bytes.Buffer
	for _, k := range keys {
		fmt.Fprintf(&b, "%s=%x ", k, m[k])
	}
	return b.String()
}
