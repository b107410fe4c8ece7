package store_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/oncewal/oncewal/replication/inprocess"

	"github.com/oncewal/oncewal/store"

	"github.com/oncewal/oncewal/leader"

	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/wal"
	"github.com/stretchr/testify/require"
)

// walHelloLog is a HelloLog over a live WAL that nothing trims.
type walHelloLog struct {
	dir   string
	w     *wal.Writer
	first uint64
	b     leader.EpochBoundary
}

func (l walHelloLog) Retained() (uint64, uint64) { return l.first, l.w.NextLSN() - 1 }

func (l walHelloLog) BatchEndingAt(lsn uint64) (wal.BatchRef, bool, error) {
	r, err := wal.OpenReader(l.dir, 3)
	if err != nil {
		return wal.BatchRef{}, false, err
	}
	defer r.Close()
	return leader.FindBatchEndingAt(r, lsn)
}

func (l walHelloLog) Boundary() leader.EpochBoundary { return l.b }

// serveOnce runs one connection of a follower: hello from its receiver,
// then apply and ack until the link ends.
func serveOnce(ctx context.Context, d replication.Dialer, recv *store.Receiver) error {
	c, err := d.Dial(ctx, recv.Hello())
	if err != nil {
		return err
	}
	defer c.Close()
	for {
		b, err := c.Recv(ctx)
		if err != nil {
			return err
		}
		res, _ := recv.Apply(b)
		if err := c.Send(ctx, res.Ack); err != nil {
			return err
		}
	}
}

// TestAlignedBoundaryDivergenceRefused is the finding: follower F
// applied a deposed leader's LSNs 6..10 under epoch 1; the new leader,
// promoted from a store that holds leader X's 6..10 (also epoch 1), starts
// epoch 2 at LSN 11 — exactly F's position + 1, so no batch of the new epoch
// overlaps what F applied and the receiver's overlap check cannot see it.
// With the epoch-start rule alone F is shipped epoch 2 and silently applies
// it on top of the wrong history; with CheckHello its hello is refused
// (ErrDiverged) before anything is shipped, while follower G, which holds X's
// history, is served.
func TestAlignedBoundaryDivergenceRefused(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	id := session.NewID()
	batch := func(epoch, first uint64, delta int64) []byte {
		evs := make([]wal.Event, 5)
		for i := range evs {
			evs[i] = add(id, session.SeqNo(first)+session.SeqNo(i), delta, nil)
		}
		b, err := wal.AppendBatch(nil, 3, epoch, first, evs)
		require.NoError(t, err)
		return b
	}
	x1, x6 := batch(1, 1, 1), batch(1, 6, 1) // leader X
	y6 := batch(1, 6, 100)                   // deposed leader Y, same epoch
	follower := func(second []byte) *rig {
		r := newRig(t, nil)
		for _, b := range [][]byte{x1, second} {
			_, err := r.recv.Apply(b)
			require.NoError(t, err)
		}
		return r
	}
	prevX, err := wal.BatchRefOf(x6)
	require.NoError(t, err)

	// The new leader's log: epoch 2 from LSN 11.
	dir := t.TempDir()
	w, err := wal.OpenWriter(dir, &wal.WriterOptions{Shard: 3, FirstLSN: 11})
	require.NoError(t, err)
	defer w.Close()
	evs := make([]wal.Event, 5)
	for i := range evs {
		evs[i] = add(id, session.SeqNo(11+i), 1, nil)
	}
	_, err = w.Append(2, evs)
	require.NoError(t, err)
	log := walHelloLog{dir: dir, w: w, first: 11, b: leader.EpochBoundary{Epoch: 2, StartLSN: 11, Prev: prevX}}

	position := func(r *rig) uint64 {
		lsn, _, err := store.ReadLastBatch(r.db)
		require.NoError(t, err)
		return lsn
	}
	// run ships the new leader's log to the followers fs until those in
	// served are at its end and the others were refused.
	run := func(verify func(replication.Ack) error, fs map[string]*rig, toServe ...string) *leader.Fanout {
		tr := inprocess.New(inprocess.FaultsNone, 1)
		defer tr.Close()
		ids := make([]string, 0, len(fs))
		for fid := range fs {
			ids = append(ids, fid)
		}
		fo, err := leader.NewFanout(&leader.FanoutOptions{
			ShipperOptions: leader.ShipperOptions{WALDir: dir, Shard: 3, Listener: tr, Epoch: func() uint64 { return 2 },
				EpochStartLSN: 11, VerifyHello: verify, DurableLSN: w.DurableLSN, PollInterval: time.Millisecond},
			Followers: ids,
		})
		require.NoError(t, err)
		rctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- fo.Run(rctx) }()
		var served sync.WaitGroup
		defer served.Wait() // no Apply outlives the test's stores
		for fid, r := range fs {
			recv, err := r.reopen(fid)
			require.NoError(t, err)
			served.Go(func() { _ = serveOnce(rctx, tr, recv) })
		}
		require.Eventually(t, func() bool {
			for _, fid := range toServe {
				if position(fs[fid]) != 15 {
					return false
				}
			}
			return fo.Stats().Refused.Total() == uint64(len(fs)-len(toServe))
		}, 10*time.Second, time.Millisecond)
		stop()
		require.NoError(t, <-done)
		return fo
	}

	// The epoch-start rule alone (the Shipper's check before CheckHello):
	// F's position 10 is below the epoch's start 11, so F is served and
	// applies epoch 2 on top of Y's history. This is the bug.
	f := follower(y6)
	run(nil, map[string]*rig{"f": f}, "f")
	require.Equal(t, uint64(15), position(f), "without CheckHello the diverged follower is shipped to")

	// With CheckHello: F is refused as diverged and applies nothing; G is
	// served.
	f, g := follower(y6), follower(x6)
	before := f.snapshot()
	fo := run(func(h replication.Ack) error { return leader.CheckHello(h, log) }, map[string]*rig{"f": f, "g": g}, "g")
	require.Equal(t, before, f.snapshot(), "the diverged follower's store changed")
	st := fo.Stats()
	require.Equal(t, leader.HelloRefusals{Diverged: 1}, st.Refused)
	require.Equal(t, uint64(0), st.Followers[0].Connections) // "f"
	require.Equal(t, uint64(1), st.Followers[1].Connections) // "g"
	// G's next hello (at the new leader's batch) passes the same check.
	recv, err := g.reopen("g")
	require.NoError(t, err)
	require.NoError(t, leader.CheckHello(recv.Hello(), log))
	require.Equal(t, uint64(2), recv.Hello().LastBatch.Epoch)
}
