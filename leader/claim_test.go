package leader_test

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/oncewal/oncewal/idempotency"
	"github.com/oncewal/oncewal/leader"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/testutil"
	"github.com/oncewal/oncewal/wal"
	"github.com/stretchr/testify/require"
)

// TestClaimRefusesSessionThatCannotLog: a claim on a session idle past the
// retention horizon (on a hand-moved WAL clock) or closed is refused at the
// door with the error Append gives, saying what to do, and the ledger holds
// nothing for the key afterwards; a live session's claim is Fresh and
// commits.
func TestClaimRefusesSessionThatCannotLog(t *testing.T) {
	clk := testutil.NewClock()
	l := open(t, t.TempDir(), &leader.Options{Shards: 2, Wall: clk.Now})
	defer l.Close()
	rng := rand.New(rand.NewPCG(26, 3))
	idle, closed, live := testutil.SessionID(rng), testutil.SessionID(rng), testutil.SessionID(rng)
	for _, id := range []session.ID{idle, closed, live} {
		_, err := l.Append(wal.Event{Op: wal.OpOpen, Session: id})
		require.NoError(t, err)
	}
	_, err := l.Append(wal.Event{Op: wal.OpClose, Session: closed})
	require.NoError(t, err)
	ctx := context.Background()

	c, err := l.For(live).Claim(ctx, live, "alice", "r-live", []byte("p"), idempotency.ClaimOptions{})
	require.NoError(t, err)
	require.Equal(t, idempotency.Fresh, c.Status)
	_, err = l.For(live).Commit(c, []byte("done"), wal.Event{Op: wal.OpPut, Session: live, Key: []byte("k"), Value: []byte("v")})
	require.NoError(t, err)

	refused := func(name string, id session.ID, want error) {
		t.Helper()
		sh := l.For(id)
		_, appendErr := sh.Append(wal.Event{Op: wal.OpPut, Session: id, Key: []byte("k")})
		require.ErrorIs(t, appendErr, want, "%s: Append's own rule", name)
		next := sh.NextLSN()
		c, err := sh.Claim(ctx, id, "alice", "r-"+name, []byte("p"), idempotency.ClaimOptions{Wait: true, Action: "put k"})
		require.ErrorIs(t, err, want, name)
		require.Nil(t, c)
		require.Contains(t, err.Error(), "open a new session and retry with the same request ID")
		_, found, err := sh.Ledger().Lookup("alice", "r-"+name)
		require.NoError(t, err)
		require.False(t, found, "%s: nothing claimed", name)
		require.Equal(t, next, sh.NextLSN(), "%s: nothing logged", name)
	}
	refused("closed", closed, session.ErrSessionClosed)

	// The horizon is 24 h; live stays active, idle does not.
	clk.Advance(13 * time.Hour)
	_, err = l.Append(wal.Event{Op: wal.OpPut, Session: live, Key: []byte("k"), Value: []byte("w")})
	require.NoError(t, err)
	clk.Advance(12 * time.Hour)
	refused("expired", idle, leader.ErrSessionExpired)

	c, err = l.For(live).Claim(ctx, live, "alice", "r-live-2", []byte("p"), idempotency.ClaimOptions{})
	require.NoError(t, err)
	require.Equal(t, idempotency.Fresh, c.Status, "a session active within the horizon still claims")
}

// TestClaimWrongShard: a claim must be made on its session's shard, where
// its events will log.
func TestClaimWrongShard(t *testing.T) {
	l := open(t, t.TempDir(), &leader.Options{Shards: 4})
	defer l.Close()
	rng := rand.New(rand.NewPCG(26, 4))
	id := testutil.SessionID(rng)
	other, err := l.Shard((l.For(id).ID() + 1) % 4)
	require.NoError(t, err)
	_, err = other.Claim(context.Background(), id, "alice", "r", nil, idempotency.ClaimOptions{})
	require.ErrorIs(t, err, leader.ErrCrossShard)
	_, found, err := other.Ledger().Lookup("alice", "r")
	require.NoError(t, err)
	require.False(t, found)
}
