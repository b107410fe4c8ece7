package sim

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/oncewal/oncewal/idempotency"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/wal"
)

// WorkloadOptions shapes a generated client workload.
type WorkloadOptions struct {
	Seed uint64
	// Sessions is the number of sessions open at any time. Default 8.
	Sessions int
	// Requests is the number of client requests after the sessions' opens
	// (retries, closes and late requests included). Default 500.
	Requests int
	// KeysPerSession is the number of distinct state keys per session.
	// Default 4.
	KeysPerSession int
	// BatchSize bounds the requests a client sends in one batch (each
	// batch draws its size from 1..BatchSize). Default 32.
	BatchSize int
	// RetryRate is the chance that a request is the retry of an earlier
	// client-keyed request whose answer the client did not see: the same
	// operation under the same request ID (so the same
	// idempotency.ClientKey). The leader logs it under a fresh SeqNo and
	// the followers' window discards it.
	RetryRate float64
	// CloseRate is the chance per request that a session closes (a new one
	// opens in its place).
	CloseRate float64
	// LateRate is the chance per request that the client writes to a
	// session it already closed (it missed the close). The leader refuses
	// it (session.ErrSessionClosed); such a request is sent alone, as a
	// refusal refuses its whole batch.
	LateRate float64
	// RetryDistance bounds how many client-keyed requests back a retry may
	// reach; the followers' window must hold at least this many keys.
	// Default 64.
	RetryDistance int
	// Start is the wall clock of the first request; the clock advances by
	// up to 3 ms per batch (Clock). Default 2026-01-01.
	Start time.Time
}

// EnsureDefaults fills unset fields with their documented defaults.
func (c *WorkloadOptions) EnsureDefaults() *WorkloadOptions {
	if c.Sessions <= 0 {
		c.Sessions = 8
	}
	if c.Requests <= 0 {
		c.Requests = 500
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
	return c
}

// Validate reports every rate outside 0..1 in one error wrapping
// ErrBadOptions.
func (c *WorkloadOptions) Validate() error { return badOptions("WorkloadOptions", c.problems()) }

func (c *WorkloadOptions) problems() []error {
	return rateProblems(rate{"RetryRate", c.RetryRate}, rate{"CloseRate", c.CloseRate}, rate{"LateRate", c.LateRate})
}

// rate is a named chance.
type rate struct {
	name string
	p    float64
}

// rateProblems names every chance outside 0..1 (NaN too).
func rateProblems(rates ...rate) []error {
	var errs []error
	for _, r := range rates {
		if !(r.p >= 0 && r.p <= 1) {
			errs = append(errs, fmt.Errorf("%s %v is outside 0..1", r.name, r.p))
		}
	}
	return errs
}

// Request is one client request: an operation the client sends to the
// leader, unstamped (no SeqNo, no time; the leader stamps it, see package
// leader).
type Request struct {
	// ID is the client's request ID. A retry carries its original's ID.
	ID uint64
	// Retry: a resend of request ID, whose answer the client did not see.
	Retry bool
	// Late: sent to a session the client had closed.
	Late bool
	// Event is the operation: Op, Session, Key, Value, Delta. A
	// client-keyed request carries its idempotency.ClientKey (HasIdemKey);
	// the others get the leader's derived key.
	Event wal.Event
}

// Key is the request's identity for the oracle: the key its ID names. A
// retry has its original's.
func (r *Request) Key() idempotency.Key { return requestKey(r.ID) }

func requestKey(id uint64) idempotency.Key {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], id)
	return idempotency.ClientKey(b[:])
}

// Workload is a generated sequence of client batches.
type Workload struct {
	Options WorkloadOptions
	Batches [][]Request
	// What the generator put in it: requests (opens and closes included),
	// distinct requests, retries and late requests.
	Requests, Distinct, Retries, Late int
}

// GenerateWorkload builds a deterministic client workload from cfg.Seed:
// sessions open, put/add/delete keys, retry requests whose answers they
// "lost", close (a new session replaces a closed one) and, now and then,
// write late to a closed session. About half of the data requests carry a
// client key (idempotency.ClientKey of the request ID), which their retries
// reuse; the rest are keyed by the leader.
func GenerateWorkload(cfg WorkloadOptions) *Workload {
	cfg.EnsureDefaults() // its rates are checked by Validate, which Run calls
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x6f6e636577616c))
	w := &Workload{Options: cfg}
	var nextID uint64
	var live, closed []session.ID
	var keyed []Request // client-keyed requests, for retries
	closedSet := map[session.ID]bool{}
	var batch []Request
	size := 1 + rng.IntN(cfg.BatchSize)

	flush := func() {
		if len(batch) > 0 {
			w.Batches = append(w.Batches, batch)
			batch, size = nil, 1+rng.IntN(cfg.BatchSize)
		}
	}
	emit := func(r Request) {
		w.Requests++
		if r.Retry {
			w.Retries++
		} else {
			w.Distinct++
		}
		if r.Late {
			// Alone: the leader refuses the whole batch of a late request.
			flush()
			w.Late++
			w.Batches = append(w.Batches, []Request{r})
			return
		}
		batch = append(batch, r)
		if len(batch) >= size {
			flush()
		}
	}
	request := func(ev wal.Event) Request {
		nextID++
		return Request{ID: nextID, Event: ev}
	}
	open := func() session.ID {
		var id session.ID
		binary.LittleEndian.PutUint64(id[:8], rng.Uint64())
		binary.LittleEndian.PutUint64(id[8:], rng.Uint64())
		emit(request(wal.Event{Op: wal.OpOpen, Session: id}))
		return id
	}
	for range cfg.Sessions {
		live = append(live, open())
	}
	for n := 0; n < cfg.Requests; n++ {
		r := rng.Float64()
		if r < cfg.RetryRate && len(keyed) > 0 {
			orig := keyed[len(keyed)-1-rng.IntN(min(len(keyed), cfg.RetryDistance))]
			if !closedSet[orig.Event.Session] { // a closed session's client gets an error instead
				orig.Retry = true
				emit(orig)
				continue
			}
		}
		if r := rng.Float64(); r < cfg.LateRate && len(closed) > 0 {
			id := closed[rng.IntN(len(closed))]
			req := request(wal.Event{Op: wal.OpPut, Session: id, Key: []byte("late"), Value: []byte("x")})
			req.Late = true
			emit(req)
			continue
		}
		i := rng.IntN(len(live))
		id := live[i]
		if rng.Float64() < cfg.CloseRate {
			emit(request(wal.Event{Op: wal.OpClose, Session: id}))
			closedSet[id] = true
			closed = append(closed, id)
			live[i] = open()
			continue
		}
		ev := wal.Event{Session: id, Key: fmt.Appendf(nil, "k%d", rng.IntN(cfg.KeysPerSession))}
		switch op := rng.IntN(10); {
		case op < 4:
			ev.Op, ev.Delta = wal.OpAdd, int64(rng.IntN(2001)-1000)
		case op < 8:
			ev.Op, ev.Value = wal.OpPut, fmt.Appendf(nil, "v%d", rng.Uint32())
		default:
			ev.Op = wal.OpDelete
		}
		req := request(ev)
		if rng.IntN(2) == 0 {
			req.Event.HasIdemKey, req.Event.IdemKey = true, req.Key()
			keyed = append(keyed, req)
		}
		emit(req)
	}
	flush()
	return w
}
