package leader_test

import (
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/oncewal/oncewal/replication/inprocess"

	"github.com/oncewal/oncewal/store"

	"github.com/oncewal/oncewal/follower"
	"github.com/oncewal/oncewal/leader"
	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/sim"
	"github.com/oncewal/oncewal/testutil"
	"github.com/oncewal/oncewal/wal"
	"github.com/stretchr/testify/require"
)

// cluster is a leader with one InProcess transport per shard and followers
// that dial it by ID.
type cluster struct {
	t      *testing.T
	l      *leader.Leader
	trs    []*inprocess.Transport
	cancel context.CancelFunc
	done   chan error
}

func startCluster(t *testing.T, dir string, o leader.Options, faults inprocess.FaultOptions) *cluster {
	t.Helper()
	c := &cluster{t: t, done: make(chan error, 1)}
	for s := range o.Shards {
		c.trs = append(c.trs, inprocess.New(faults, uint64(s)+1))
	}
	o.Listener = func(s uint32) replication.Listener { return c.trs[s] }
	o.Shipping.RetransmitTimeout = 20 * time.Millisecond
	o.Shipping.PollInterval = time.Millisecond
	o.Logger = discard()
	o.Store.Logger = discard()
	var err error
	c.l, err = leader.Open(dir, &o)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	go func() { c.done <- c.l.Run(ctx) }()
	t.Cleanup(c.stop)
	return c
}

func (c *cluster) stop() {
	if c.cancel == nil {
		return
	}
	c.cancel()
	require.NoError(c.t, <-c.done)
	c.cancel = nil
	require.NoError(c.t, c.l.Close())
	for _, tr := range c.trs {
		tr.Close()
	}
}

// runFollower serves shard from c as follower id in dir until the returned
// stop func is called; stop closes the follower.
func (c *cluster) runFollower(dir, id string, shard uint32) (*follower.Follower, func()) {
	f, err := follower.Open(dir, &follower.Options{Store: store.Options{ID: id, Shard: shard, Logger: discard()}, ReconnectBackoff: time.Millisecond})
	require.NoError(c.t, err)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = f.Serve(ctx, c.trs[shard]) })
	return f, func() {
		cancel()
		wg.Wait()
		require.NoError(c.t, f.Close())
	}
}

func randomOps(rng *rand.Rand, ids []session.ID, n int) []wal.Event {
	evs := make([]wal.Event, n)
	for i := range evs {
		id := ids[rng.IntN(len(ids))]
		evs[i] = wal.Event{Op: wal.OpAdd, Session: id, Key: []byte{byte('a' + rng.IntN(4))}, Delta: int64(rng.IntN(100))}
	}
	return evs
}

// TestThreeFollowersPerShard: three followers of each of two shards, over
// transports with faults, each get every batch on their own stream (no
// stream stealing: a follower whose link never broke connected once), the
// leader's WaitAcked(all) returns, and every follower equals the oracle.
func TestThreeFollowersPerShard(t *testing.T) {
	ids := []string{"f1", "f2", "f3"}
	c := startCluster(t, t.TempDir(), leader.Options{Shards: 2, Followers: ids}, inprocess.FaultsNone)
	type member struct {
		f     *follower.Follower
		id    string
		shard uint32
	}
	var followers []member
	for s := range uint32(2) {
		for _, id := range ids {
			f, stop := c.runFollower(t.TempDir(), id, s)
			defer stop()
			followers = append(followers, member{f, id, s})
		}
	}
	rng := rand.New(rand.NewPCG(11, 12))
	sess := make([]session.ID, 20)
	for i := range sess {
		sess[i] = testutil.SessionID(rng)
	}
	oracles := []*sim.Oracle{sim.NewOracle(), sim.NewOracle()}
	for range 200 {
		evs := randomOps(rng, sess[:1+rng.IntN(len(sess))], 1)
		_, err := c.l.Append(evs...)
		require.NoError(t, err)
		oracles[c.l.Router().Shard(evs[0].Session)].Apply(&evs[0])
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, c.l.WaitAcked(ctx, leader.AckAll))
	for _, m := range followers {
		require.NoError(t, oracles[m.shard].Verify(m.f.State()), "follower %s of shard %d", m.id, m.shard)
	}
	for _, st := range c.l.Stats() {
		require.Len(t, st.Shipping.Followers, 3)
		for _, fs := range st.Shipping.Followers {
			require.True(t, fs.Connected, "shard %d follower %s", st.Shard, fs.ID)
			require.Equal(t, uint64(1), fs.Connections, "shard %d follower %s: its stream was taken over", st.Shard, fs.ID)
			require.Equal(t, st.NextLSN-1, fs.AckedLSN)
		}
	}
}

// TestQuorumAck: with one of three followers stopped, WaitAcked(majority)
// returns and WaitAcked(all) does not.
func TestQuorumAck(t *testing.T) {
	ids := []string{"a", "b", "c"}
	c := startCluster(t, t.TempDir(), leader.Options{Shards: 1, Followers: ids}, inprocess.FaultsNone)
	for _, id := range ids[:2] {
		_, stop := c.runFollower(t.TempDir(), id, 0)
		defer stop()
	}
	rng := rand.New(rand.NewPCG(1, 1))
	h, err := c.l.Append(randomOps(rng, []session.ID{testutil.SessionID(rng)}, 5)...)
	require.NoError(t, err)
	sh, _ := c.l.Shard(0)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	require.NoError(t, sh.WaitAcked(ctx, h.LastLSN(), leader.AckMajority))
	short, cancel2 := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel2()
	require.ErrorIs(t, sh.WaitAcked(short, h.LastLSN(), leader.AckAll), context.DeadlineExceeded)
}

// TestRetentionBound: registered followers pin the WAL; a follower that
// never comes back is dropped once the WAL it pins exceeds
// MaxRetainedBytes, the WAL is deleted down to the live followers, and when
// the dead follower returns it is refused with replication.ErrBehindRetention.
func TestRetentionBound(t *testing.T) {
	const seg = 4 << 10
	o := leader.Options{Shards: 1, Followers: []string{"live", "dead"}, SegmentSize: seg,
		MaxRetainedBytes: 8 * seg, RetentionInterval: time.Hour /* passes run by hand */}
	c := startCluster(t, t.TempDir(), o, inprocess.FaultsNone)
	f, stop := c.runFollower(t.TempDir(), "live", 0)
	defer stop()
	rng := rand.New(rand.NewPCG(2, 2))
	sess := []session.ID{testutil.SessionID(rng), testutil.SessionID(rng), testutil.SessionID(rng)}
	sh, _ := c.l.Shard(0)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	maxRetained := int64(0)
	for i := range 60 {
		h, err := c.l.Append(randomOps(rng, sess, 20)...)
		require.NoError(t, err)
		require.NoError(t, sh.WaitAcked(ctx, h.LastLSN(), leader.AckOne))
		require.NoError(t, c.l.Retain())
		st := sh.Stats()
		maxRetained = max(maxRetained, st.Retention.RetainedBytes)
		if i == 5 {
			require.Equal(t, uint64(1), st.Retention.FirstLSN, "the dead follower pins the WAL within the bound")
		}
	}
	st := sh.Stats()
	require.Greater(t, st.Retention.FirstLSN, uint64(1), "nothing was deleted")
	require.LessOrEqual(t, maxRetained, int64(8*seg)+2*seg, "the WAL outgrew its bound")
	require.Positive(t, st.Retention.SegmentsDeleted)
	for _, sl := range st.Retention.Slots {
		require.Equal(t, sl.ID == "dead", sl.Dropped, "slot %s", sl.ID)
	}
	applied, _ := f.Position()
	require.Equal(t, st.NextLSN-1, applied)

	// The dead follower comes back with an empty store: refused.
	dead, stopDead := c.runFollower(t.TempDir(), "dead", 0)
	defer stopDead()
	require.Eventually(t, func() bool {
		for _, fs := range sh.Stats().Shipping.Followers {
			if fs.ID == "dead" && fs.Refused.BehindRetention > 0 {
				return true
			}
		}
		return false
	}, 10*time.Second, 5*time.Millisecond, "the dropped follower was not refused as behind retention")
	applied, _ = dead.Position()
	require.Zero(t, applied)
}

// TestAlignedDivergenceRefused is the case of issue 11: follower F applied a
// deposed leader's LSNs 41..50 under epoch 1; the new leader's epoch-2 log
// starts exactly at 51 on a different history (its store applied other
// epoch-1 entries 41..50). No batch overlaps anything F applied, yet F must
// be refused (ErrDiverged), not silently continued.
func TestAlignedDivergenceRefused(t *testing.T) {
	rng := rand.New(rand.NewPCG(4, 4))
	sess := []session.ID{testutil.SessionID(rng), testutil.SessionID(rng)}
	// Deposed leader A: 50 events, epoch 1.
	aDir := t.TempDir()
	a := open(t, aDir, &leader.Options{Shards: 1})
	for range 50 {
		_, err := a.Append(randomOps(rng, sess, 1)...)
		require.NoError(t, err)
	}
	require.NoError(t, a.Close())
	fDir := t.TempDir()
	feed(t, fDir, a.WALDir(), 1, 50)

	// B's store applied A's 1..40, then another epoch-1 writer's 41..50.
	bDir := t.TempDir()
	feed(t, store.ShardDir(bDir, 0), a.WALDir(), 1, 40)
	other := t.TempDir()
	w, err := wal.OpenWriter(other, &wal.WriterOptions{FirstLSN: 41})
	require.NoError(t, err)
	for i := range 10 {
		_, err := w.Append(1, []wal.Event{{Op: wal.OpOpen, Session: testutil.SessionID(rng), Seq: 1, Time: int64(i + 1)}})
		require.NoError(t, err)
	}
	require.NoError(t, w.Close())
	feed(t, store.ShardDir(bDir, 0), other, 41, 50)
	// G has exactly B's history.
	gDir := t.TempDir()
	feed(t, gDir, a.WALDir(), 1, 40)
	feed(t, gDir, other, 41, 50)

	c := startCluster(t, bDir, leader.Options{Shards: 1, Epoch: 2, Promote: true, Followers: []string{"f", "g"}}, inprocess.FaultsNone)
	sh, _ := c.l.Shard(0)
	require.Equal(t, uint64(51), sh.Log().EpochStartLSN())
	_, err = c.l.Append(randomOps(rng, sess, 3)...)
	require.NoError(t, err)
	f, stop := c.runFollower(fDir, "f", 0)
	defer stop()
	require.Eventually(t, func() bool {
		return sh.Stats().Shipping.Refused.Diverged > 0
	}, 10*time.Second, 5*time.Millisecond, "the diverged follower was not refused")
	applied, epoch := f.Position()
	require.Equal(t, uint64(50), applied, "the diverged follower applied the new leader's log")
	require.Equal(t, uint64(1), epoch)

	// Control: a follower with B's own history up to 50 is served to the end.
	g, stopG := c.runFollower(gDir, "g", 0)
	defer stopG()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	require.NoError(t, sh.WaitAcked(ctx, sh.NextLSN()-1, leader.AckOne))
	applied, _ = g.Position()
	require.Equal(t, sh.NextLSN()-1, applied)
	require.Zero(t, sh.Stats().Shipping.Followers[1].Refused.Total())
}

// feed applies the batches of walDir with LSNs from..to to the store in dir.
func feed(t *testing.T, dir, walDir string, from, to uint64) {
	t.Helper()
	f, err := follower.Open(dir, quiet())
	require.NoError(t, err)
	defer func() { require.NoError(t, f.Close()) }()
	r, err := wal.OpenReader(walDir, 0)
	require.NoError(t, err)
	defer r.Close()
	require.NoError(t, r.Seek(from))
	for {
		h, raw, err := r.Next()
		if errors.Is(err, io.EOF) || (err == nil && h.FirstLSN > to) {
			break
		}
		require.NoError(t, err)
		_, err = f.Apply(append([]byte(nil), raw...))
		require.NoError(t, err)
	}
	applied, _ := f.Position()
	require.Equal(t, to, applied)
}
