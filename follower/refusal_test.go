package follower_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/oncewal/oncewal/replication/inprocess"

	"github.com/oncewal/oncewal/store"

	"github.com/oncewal/oncewal/follower"
	"github.com/oncewal/oncewal/leader"
	"github.com/oncewal/oncewal/replication"
	"github.com/stretchr/testify/require"
)

// TestRefusalReachesFollower: a leader that refuses a follower's hello
// tells it why (over the in-process transport here; grpctransport carries
// the same reasons), the follower counts the refusal by reason as
// permanent, and with StopOnPermanentRefusal Serve returns
// ErrPermanentRefusal wrapping the reason instead of redialling for ever
// (it used to see only a dropped connection: "dial_failures=0").
func TestRefusalReachesFollower(t *testing.T) {
	tr := inprocess.New(inprocess.FaultsNone, 1)
	defer tr.Close()
	l, err := leader.Open(t.TempDir(), &leader.Options{
		Shards: 1, Followers: []string{"f1"}, Logger: quietLogger, Store: store.Options{Logger: quietLogger},
		Listener: func(uint32) replication.Listener { return tr },
	})
	require.NoError(t, err)
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ran := make(chan error, 1)
	go func() { ran <- l.Run(ctx) }()

	cases := []struct {
		name   string
		opts   follower.Options
		reason string
		want   error
	}{
		{"unknown follower", follower.Options{Store: store.Options{ID: "stranger"}}, "unknown_follower", replication.ErrUnknownFollower},
		{"wrong shard", follower.Options{Store: store.Options{ID: "f1", Shard: 3}}, "wrong_shard", replication.ErrWrongShard},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			o := c.opts
			o.Store.Logger, o.ReconnectBackoff, o.MaxReconnectBackoff = quietLogger, time.Millisecond, 4*time.Millisecond

			// Default: Serve keeps redialling, and counts every refusal.
			f, err := follower.Open(t.TempDir(), &o)
			require.NoError(t, err)
			sctx, stop := context.WithCancel(ctx)
			served := make(chan error, 1)
			go func() { served <- f.Serve(sctx, tr) }()
			for f.Stats().Link.Refusals[c.reason] < 3 {
				require.NoError(t, ctx.Err(), "no refusal reached the follower: %+v", f.Stats().Link)
				time.Sleep(time.Millisecond)
			}
			stop()
			require.NoError(t, <-served)
			link := f.Stats().Link
			require.Equal(t, link.Permanent, link.Refusals[c.reason], "every failure was this refusal: %+v", link)
			require.NoError(t, f.Close())

			// StopOnPermanentRefusal: Serve returns the typed refusal.
			o.StopOnPermanentRefusal = true
			f, err = follower.Open(t.TempDir(), &o)
			require.NoError(t, err)
			err = f.Serve(ctx, tr)
			require.ErrorIs(t, err, follower.ErrPermanentRefusal)
			require.ErrorIs(t, err, c.want)
			require.ErrorIs(t, err, replication.ErrRefused)
			require.Equal(t, uint64(1), f.Stats().Link.Refusals[c.reason])
			lsn, _ := f.Position()
			require.Zero(t, lsn)
			require.NoError(t, f.Close())
		})
	}
	cancel()
	if err := <-ran; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
}
