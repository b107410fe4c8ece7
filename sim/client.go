package sim

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/oncewal/oncewal/leader"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/wal"
)

// Accepted is a request the leader logged.
type Accepted struct {
	LSN   uint64 // its event's LSN in its shard's log
	Epoch uint64 // the epoch of the leader that logged it
	Req   Request
}

// Client sends a workload's batches to a leader, one batch at a time, and
// records what the leader accepted: the history every follower must end up
// applying, each distinct request once. It is not safe for concurrent use.
type Client struct {
	w            *Workload
	clock        *Clock
	rng          *rand.Rand
	next         int
	split        [][]Request
	accepted     [][]Accepted // per shard, in LSN order
	shardAppends []int
	// Refused counts requests the leader refused, by reason: late writes
	// to closed sessions (session.ErrSessionClosed) and, after a clock
	// step, expired sessions (replication.ErrSessionExpired).
	RefusedClosed, RefusedExpired int
	// Appends counts the leader appends the client made.
	Appends int
}

// NewClient returns a client that sends w to a leader of shards shards,
// advancing clock by up to 3 ms before each batch (the clock is the
// leader's Options.Wall; the steps come from the workload's seed).
func NewClient(w *Workload, shards int, clock *Clock) *Client {
	return &Client{w: w, clock: clock, rng: rand.New(rand.NewPCG(w.Options.Seed, 0x636c6f636b)),
		split: make([][]Request, shards), accepted: make([][]Accepted, shards), shardAppends: make([]int, shards)}
}

// Done reports whether every batch was sent.
func (c *Client) Done() bool { return c.next >= len(c.w.Batches) }

// Sent is the number of batches sent.
func (c *Client) Sent() int { return c.next }

// Send sends the next batch to l: its requests grouped by shard (the
// leader appends a batch to one shard's log), one append per shard. A
// refusal a client must expect (a closed or expired session: the whole
// shard batch is refused, nothing logged) is counted; any other error is
// returned and ends the run (what earlier shards logged stays recorded).
// It returns the headers of the
// appends, indexed by shard (zero where the shard got nothing).
func (c *Client) Send(l *leader.Leader) ([]wal.Header, error) {
	if c.Done() {
		return nil, errors.New("sim: client has sent its whole workload")
	}
	batch := c.w.Batches[c.next]
	router := l.Router()
	for s := range c.split {
		c.split[s] = c.split[s][:0]
	}
	for _, r := range batch {
		s := router.Shard(r.Event.Session)
		c.split[s] = append(c.split[s], r)
	}
	c.clock.Advance(time.Duration(1 + c.rng.Int64N(int64(3*time.Millisecond))))
	hs := make([]wal.Header, len(c.split))
	var evs []wal.Event
	for s, part := range c.split {
		if len(part) == 0 {
			continue
		}
		evs = evs[:0]
		for _, r := range part {
			evs = append(evs, r.Event)
		}
		sh, err := l.Shard(uint32(s))
		if err != nil {
			return nil, err
		}
		h, err := sh.Append(evs...)
		switch {
		case errors.Is(err, session.ErrSessionClosed):
			c.RefusedClosed += len(part)
			continue
		case errors.Is(err, leader.ErrSessionExpired):
			c.RefusedExpired += len(part)
			continue
		case err != nil:
			return hs, fmt.Errorf("sim: append to shard %d: %w", s, err)
		}
		c.Appends++
		c.shardAppends[s]++
		hs[s] = h
		for i, r := range part {
			c.accepted[s] = append(c.accepted[s], Accepted{LSN: h.FirstLSN + uint64(i), Epoch: h.Epoch, Req: r})
		}
	}
	c.next++
	return hs, nil
}

// Accepted returns what shard's leaders logged, in LSN order.
func (c *Client) Accepted(shard uint32) []Accepted { return c.accepted[shard] }

// LastLSN is the last LSN the leaders logged on shard (0: none).
func (c *Client) LastLSN(shard uint32) uint64 {
	if a := c.accepted[shard]; len(a) > 0 {
		return a[len(a)-1].LSN
	}
	return 0
}

// Truncate forgets what shard's log held beyond lsn: a promotion continues
// the history of the promoted store, which ends at lsn, and the deposed
// leader's later entries are not part of it.
func (c *Client) Truncate(shard uint32, lsn uint64) (dropped int) {
	a := c.accepted[shard]
	n := len(a)
	for n > 0 && a[n-1].LSN > lsn {
		n--
	}
	c.accepted[shard] = a[:n]
	return len(a) - n
}

// Oracle is the expected state of every follower that applied the whole
// history: each accepted request once (a retry of a request that took
// effect has none), in LSN order per shard.
func (c *Client) Oracle() *Oracle {
	o, _ := c.oracle()
	return o
}

// oracle is Oracle and the number of requests that take effect: what each
// follower that applied the whole history applied.
func (c *Client) oracle() (*Oracle, int) {
	o, n := NewOracle(), 0
	for _, acc := range c.accepted {
		for i := range acc {
			if o.Once(acc[i].Req.Key(), &acc[i].Req.Event) {
				n++
			}
		}
	}
	return o, n
}

// Logged is the number of events the leaders logged (every shard).
func (c *Client) Logged() int {
	n := 0
	for _, a := range c.accepted {
		n += len(a)
	}
	return n
}
