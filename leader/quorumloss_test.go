package leader_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/oncewal/oncewal/leader"
	"github.com/oncewal/oncewal/replication/inprocess"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/testutil"
	"github.com/stretchr/testify/require"
)

// waitQuorum polls until l.Quorum(p) answers as want (nil or not); the
// deadline only keeps a broken build from hanging.
func waitQuorum(t *testing.T, l *leader.Leader, p leader.AckPolicy, want bool) error {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		err := l.Quorum(p)
		if (err == nil) == want {
			return err
		}
		if time.Now().After(deadline) {
			t.Fatalf("Quorum(%v) = %v, want ok=%v; %+v", p, err, want, l.Stats())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestAckTimeoutAndQuorumLost: with both of two registered followers down,
// Quorum(majority) is ErrQuorumLost naming the count, and WaitAcked ends
// with ErrAckTimeout after Options.AckTimeout instead of hanging (the
// caller's context, long, is not what ends it); a caller's own cancelled
// context still answers its error. One follower up restores the majority
// quorum (the leader counted) but not all's; once it is down again the
// quorum is lost again.
func TestAckTimeoutAndQuorumLost(t *testing.T) {
	c := startCluster(t, t.TempDir(), leader.Options{Shards: 1, Followers: []string{"a", "b"}, AckTimeout: 50 * time.Millisecond}, inprocess.FaultsNone)
	sh, _ := c.l.Shard(0)

	err := c.l.Quorum(leader.AckMajority)
	require.ErrorIs(t, err, leader.ErrQuorumLost)
	require.ErrorContains(t, err, "shard 0: 0 of 2 followers connected, majority needs 1")
	require.ErrorContains(t, err, "oncewal inspect")
	require.ErrorIs(t, sh.Quorum(leader.AckAll), leader.ErrQuorumLost)

	rng := rand.New(rand.NewPCG(3, 4))
	h, err := c.l.Append(randomOps(rng, []session.ID{testutil.SessionID(rng)}, 3)...)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err = sh.WaitAcked(ctx, h.LastLSN(), leader.AckMajority)
	require.ErrorIs(t, err, leader.ErrAckTimeout)
	require.False(t, errors.Is(err, context.DeadlineExceeded), "the bound's deadline leaks: %v", err)
	require.ErrorContains(t, err, "acknowledged by 0 of 2 followers (0 connected)")
	require.ErrorContains(t, err, "majority needs 1")
	require.ErrorIs(t, c.l.WaitAcked(ctx, leader.AckOne), leader.ErrAckTimeout)

	gone, stop := context.WithCancel(context.Background())
	stop()
	require.ErrorIs(t, sh.WaitAcked(gone, h.LastLSN(), leader.AckMajority), context.Canceled)

	_, stopA := c.runFollower(t.TempDir(), "a", 0)
	waitQuorum(t, c.l, leader.AckMajority, true)
	require.NoError(t, sh.WaitAcked(ctx, h.LastLSN(), leader.AckMajority))
	err = sh.Quorum(leader.AckAll)
	require.ErrorIs(t, err, leader.ErrQuorumLost)
	require.ErrorContains(t, err, "1 of 2 followers connected, all needs 2")
	err = sh.WaitAcked(ctx, h.LastLSN(), leader.AckAll)
	require.ErrorIs(t, err, leader.ErrAckTimeout)
	require.ErrorContains(t, err, "acknowledged by 1 of 2 followers (1 connected)")

	stopA()
	err = waitQuorum(t, c.l, leader.AckMajority, false)
	require.ErrorIs(t, err, leader.ErrQuorumLost)
}

// TestQuorumOneOfThreeConnected: majority of three followers needs two;
// each shard's loss is in Leader.Quorum's joined error.
func TestQuorumOneOfThreeConnected(t *testing.T) {
	c := startCluster(t, t.TempDir(), leader.Options{Shards: 2, Followers: []string{"a", "b", "c"}}, inprocess.FaultsNone)
	for s := range uint32(2) {
		_, stop := c.runFollower(t.TempDir(), "a", s)
		defer stop()
	}
	waitQuorum(t, c.l, leader.AckOne, true)
	err := c.l.Quorum(leader.AckMajority)
	require.ErrorIs(t, err, leader.ErrQuorumLost)
	require.ErrorContains(t, err, "shard 0: 1 of 3 followers connected, majority needs 2")
	require.ErrorContains(t, err, "shard 1: 1 of 3 followers connected, majority needs 2")
}

// TestAckTimeoutDefaults: zero is DefaultAckTimeout; a negative bound is
// valid (no bound).
func TestAckTimeoutDefaults(t *testing.T) {
	o := (&leader.Options{Shards: 1}).EnsureDefaults()
	require.Equal(t, leader.DefaultAckTimeout, o.AckTimeout)
	o = (&leader.Options{Shards: 1, AckTimeout: -1}).EnsureDefaults()
	require.Equal(t, time.Duration(-1), o.AckTimeout)
	require.NoError(t, o.Validate())
}
