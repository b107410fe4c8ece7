package follower_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncewal/oncewal/internal/drill"
	"github.com/oncewal/oncewal/internal/leaderhook"
	"github.com/oncewal/oncewal/replication/inprocess"

	"github.com/oncewal/oncewal/leader"

	"github.com/anishathalye/porcupine"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/oncewal/oncewal/follower"
	"github.com/oncewal/oncewal/idempotency"
	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/sim"
	"github.com/oncewal/oncewal/wal"
	"github.com/stretchr/testify/require"
)

// TestFailoverLiveShipper runs the failover scenario over the real Shipper
// and the InProcess transport with light faults (drops, duplicates,
// reorders, disconnects): A answers a request only once the Shipper reports
// B's ack covering it (AckedLSN), A is killed at a random request and
// phase, B is promoted, unanswered requests are retried against B — half of
// them as waiting claims, which block on a claim inherited from A until its
// lease ends on the WAL clock. Same invariant as
// TestFailoverRequestsExactlyOnce (synchronous mode), the client history
// checked by porcupine against the request model, plus: A's Shipper,
// restarted against B's store, is fenced (ErrFenced).
func TestFailoverLiveShipper(t *testing.T) {
	for seed := range uint64(12) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { liveFailover(t, seed) })
	}
}

func liveFailover(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 0x11fe))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var wall atomic.Int64
	wall.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	now := func() int64 { return wall.Load() }
	dir := t.TempDir()
	fsA, fsB := vfs.NewMem(), vfs.NewMem()
	opts := func(fs vfs.FS) *follower.Options {
		o := testOptions(fs)
		o.ReconnectBackoff = time.Millisecond
		return o
	}

	a, err := follower.Open("a", opts(fsA))
	require.NoError(t, err)
	la, err := leader.Promote(retire(t, a), leader.PromoteOptions{WALDir: filepath.Join(dir, "a-wal"), Wall: now, Ledger: handClock})
	require.NoError(t, err)
	tr := inprocess.New(inprocess.FaultsLight, seed)
	defer tr.Close()
	newShipper := func(l *leader.LedgerLog, epoch uint64, walDir string, durable func() uint64, notify <-chan struct{}) *leader.Shipper {
		var start uint64
		if l != nil {
			start = l.EpochStartLSN()
		}
		s, err := leader.NewShipper(&leader.ShipperOptions{WALDir: walDir, Listener: tr,
			Epoch: func() uint64 { return epoch }, Notify: notify, DurableLSN: durable, EpochStartLSN: start,
			RetransmitTimeout: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond, PollInterval: time.Millisecond})
		require.NoError(t, err)
		return s
	}
	ship := newShipper(la, la.Epoch(), la.WALDir(), la.Writer().DurableLSN, la.Notify())
	shipCtx, stopShip := context.WithCancel(ctx)
	shipDone := make(chan error, 1)
	go func() { shipDone <- ship.Run(shipCtx) }()

	b, err := follower.Open("b", opts(fsB))
	require.NoError(t, err)
	serveDone := make(chan error, 1)
	go func() { serveDone <- b.Serve(ctx, tr) }()

	type req struct {
		key     string
		counter int
		delta   int64
		payload []byte
		seen    []byte
		final   []byte
		op      int // the client operation A left unanswered (-1: none)
	}
	sid := session.ID{0x11, byte(seed)}
	var (
		histMu sync.Mutex
		hist   []sim.ClientOp
		ticks  atomic.Int64
	)
	call := func(r *req) int {
		histMu.Lock()
		defer histMu.Unlock()
		hist = append(hist, sim.ClientOp{Client: len(hist), Key: r.key, Counter: r.counter, Delta: r.delta, Call: ticks.Add(1)})
		return len(hist) - 1
	}
	ret := func(op int, outcome []byte) {
		histMu.Lock()
		defer histMu.Unlock()
		hist[op].Return, hist[op].Outcome = ticks.Add(1), bytes.Clone(outcome)
	}
	reqs := make([]req, 20)
	for i := range reqs {
		reqs[i] = req{key: fmt.Sprintf("req-%d", i), counter: rng.IntN(3), delta: 1 + rng.Int64N(50), op: -1}
		reqs[i].payload = fmt.Appendf(nil, "add %d to c%d", reqs[i].delta, reqs[i].counter)
	}
	execute := func(l *leader.LedgerLog, f *follower.Follower, i int, c *idempotency.Claim) ([]byte, wal.Header) {
		r := &reqs[i]
		ckey := fmt.Appendf(nil, "c%d", r.counter)
		cur, err := f.State().Counter(sid, ckey)
		require.NoError(t, err)
		out := sim.FailoverOutcome(r.key, r.counter, r.delta, cur)
		h, err := leaderhook.Commit(l, c, out, wal.Event{Op: wal.OpAdd, Session: sid, Key: ckey, Delta: r.delta})
		require.NoError(t, err)
		return out, h
	}
	killAt, phase := rng.IntN(len(reqs)), rng.IntN(3) // after claim, before the ack, after the answer
	for i := range reqs {
		wall.Add(int64(time.Millisecond))
		op := call(&reqs[i])
		reqs[i].op = op
		c, err := la.Ledger().Claim("client", reqs[i].key, reqs[i].payload)
		require.NoError(t, err)
		require.Equal(t, idempotency.Fresh, c.Status)
		if i == killAt && phase == 0 {
			break
		}
		out, h := execute(la, a, i, c)
		if i == killAt && phase == 1 {
			time.Sleep(time.Duration(rng.IntN(3)) * time.Millisecond) // it may or may not get there
			break
		}
		wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
		require.NoError(t, leaderhook.WaitAcked(ship, wctx, h.LastLSN()), "B never acked LSN %d", h.LastLSN())
		wcancel()
		reqs[i].seen = out
		ret(op, out)
		reqs[i].op = -1
		if i == killAt {
			break
		}
	}
	// Kill A: its shipper stops wherever it is.
	stopShip()
	<-shipDone
	require.NoError(t, la.Close())
	require.NoError(t, drill.Kill(a))

	lb, err := leader.Promote(retire(t, b), leader.PromoteOptions{WALDir: filepath.Join(dir, "b-wal"), Wall: now, Epoch: 2, Ledger: handClock})
	require.NoError(t, err)
	require.NoError(t, <-serveDone)
	for i := range reqs {
		r := &reqs[i]
		if r.seen != nil && rng.IntN(2) == 0 {
			r.final = r.seen
			continue // the client does not retry what it saw; the check below replays it anyway
		}
		op := r.op
		if op < 0 {
			op = call(r)
		}
		if rng.IntN(2) == 0 { // a waiting claim
			wall.Add(int64(time.Millisecond))
			e, inFlight, err := lb.Ledger().Lookup("client", r.key)
			require.NoError(t, err)
			got := make(chan *idempotency.Claim, 1)
			go func() {
				c, err := lb.Ledger().ClaimWith(ctx, "client", r.key, r.payload, idempotency.ClaimOptions{Wait: true})
				if err != nil {
					t.Error(err)
				}
				got <- c
			}()
			if inFlight && e.State == idempotency.StateInFlight {
				for lb.Ledger().Waiting() < 1 {
					time.Sleep(50 * time.Microsecond)
				}
				wall.Store(e.Expires) // the claim A left behind frees itself on the WAL clock
			}
			c := <-got
			require.NotNil(t, c)
			if c.Status == idempotency.Replay {
				r.final = c.Outcome
			} else {
				require.Equal(t, idempotency.Fresh, c.Status)
				r.final, _ = execute(lb, b, i, c)
			}
			ret(op, r.final)
			if r.seen != nil {
				require.Equal(t, string(r.seen), string(r.final), "%s: A's answer must replay verbatim on B", r.key)
			}
			continue
		}
		for attempt := 0; ; attempt++ {
			wall.Add(int64(time.Millisecond))
			c, err := lb.Ledger().Claim("client", r.key, r.payload)
			require.NoError(t, err)
			if c.Status == idempotency.InFlight {
				require.Zero(t, attempt, "%s in flight after its lease", r.key)
				wall.Store(c.LeaseEnd) // the claim A left behind frees itself on the WAL clock
				continue
			}
			if c.Status == idempotency.Replay {
				require.True(t, c.Replayed)
				r.final = c.Outcome
			} else {
				r.final, _ = execute(lb, b, i, c)
			}
			break
		}
		ret(op, r.final)
		if r.seen != nil {
			require.Equal(t, string(r.seen), string(r.final), "%s: A's answer must replay verbatim on B", r.key)
		}
	}
	want := map[int]int64{}
	for i := range reqs {
		r := &reqs[i]
		want[r.counter] += r.delta
		op := call(r)
		c, err := lb.Ledger().Claim("client", r.key, r.payload)
		require.NoError(t, err)
		ret(op, c.Outcome)
		require.Equal(t, idempotency.Replay, c.Status)
		require.True(t, bytes.Equal(r.final, c.Outcome))
	}
	require.Equal(t, porcupine.Ok, checkHistory(t, hist), "client history not linearizable against the request model")
	for j, w := range want {
		got, err := b.State().Counter(sid, fmt.Appendf(nil, "c%d", j))
		require.NoError(t, err)
		require.Equal(t, w, got, "counter c%d: every request exactly once", j)
	}

	// A comes back and ships its old log to B's store (now a follower of
	// nobody): the hello carries epoch 2, A's Shipper is fenced.
	require.NoError(t, lb.Close())
	require.NoError(t, b.Close())
	b2, err := follower.Open("b", opts(fsB))
	require.NoError(t, err)
	defer b2.Close()
	_, epoch := b2.Position()
	require.Equal(t, uint64(2), epoch)
	serveCtx, stopServe := context.WithCancel(ctx)
	defer stopServe()
	go func() { _ = b2.Serve(serveCtx, tr) }()
	old := newShipper(nil, 1, filepath.Join(dir, "a-wal"), nil, nil)
	err = old.Run(ctx)
	require.True(t, errors.Is(err, replication.ErrFenced), "old leader's shipper: %v", err)
}
