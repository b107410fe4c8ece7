package client_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/oncewal/oncewal/client"
	"github.com/oncewal/oncewal/clientapi"
	"github.com/oncewal/oncewal/internal/clienthistory"
	"github.com/oncewal/oncewal/testutil"
)

// TestClientsAcrossLeaderRestart: three clients keep submitting through a
// fault proxy while the leader (2 shards, one follower node, majority
// acks) is closed and reopened on its directory twice, serving again on
// the same address; one client has a budget too small to ride out every
// outage. Every request a client was told succeeded took effect
// once on the leader and on the follower, one it was never told at most
// once; the answers, porcupine and the WAL agree (the oracle of
// TestExactlyOnceOverTheNetwork). 2 seeds by default, 10 with
// ONCEWAL_LONG=1.
func TestClientsAcrossLeaderRestart(t *testing.T) {
	seeds := 2
	if os.Getenv("ONCEWAL_LONG") != "" {
		seeds = 10
	}
	for seed := range uint64(seeds) {
		t.Run(fmt.Sprint(seed+1), func(t *testing.T) { acrossLeaderRestart(t, seed+1) })
	}
}

func acrossLeaderRestart(t *testing.T, seed uint64) {
	const clients, n = 3, 30
	c := newCluster(t, 2, "f1")
	proxy := testutil.NewFaultProxy(t, c.addr, seed, testutil.ProxyFaults{Reset: 0.01, Drop: 0.01, Stall: 0.05})
	defer proxy.Close()
	var h clienthistory.History
	done := drive(t, &h, clients, n, seed, func(name string) *client.Client {
		return c.newClient(name, client.AckMajority, attempts(name), proxy.Addr())
	})
	for _, at := range []int64{clients * n / 3, 2 * clients * n / 3} {
		waitFor(t, func() bool { return h.Answered() >= at })
		c.restartLeader()
	}
	<-done

	c.caughtUp()
	v := h.Check(t, "leader", c.leaderEffects())
	h.Check(t, "follower f1", c.nodeEffects("f1"))
	v.Replays = h.CheckAnswers(t)
	h.CheckLinearizable(t)
	checkWAL(t, &h, c.l.WALDir(), c.shards)
	t.Logf("seed %d: %v", seed, v)
}

// TestClientsAcrossPromotion: three clients keep submitting (all acks)
// while the leader is stopped and follower f1 is promoted in its place
// (leader.Open with Promote on f1's node directory, epoch 2) with a new
// follower made from a copy of f1's directory; the other follower, f2,
// which may hold batches f1 lacks, is retired. The clients know only the
// old address, where a node now answers NotLeader naming the new leader
// (clientapi.NotLeader), and find it; one has a budget too small to ride
// out the promotion. Every request they were told
// succeeded took effect once on the final leader and its follower; one
// whose outcome they were never told, at most once. The WAL is not
// checked here: the old leader's log holds batches that died with it and
// were run again by the new one, which is the point. 2 seeds by default,
// 10 with ONCEWAL_LONG=1.
func TestClientsAcrossPromotion(t *testing.T) {
	seeds := 2
	if os.Getenv("ONCEWAL_LONG") != "" {
		seeds = 10
	}
	for seed := range uint64(seeds) {
		t.Run(fmt.Sprint(seed+1), func(t *testing.T) { acrossPromotion(t, seed+1) })
	}
}

func acrossPromotion(t *testing.T, seed uint64) {
	const clients, n = 3, 30
	c := newCluster(t, 2, "f1", "f2")
	oldAddr := c.addr
	proxy := testutil.NewFaultProxy(t, oldAddr, seed, testutil.ProxyFaults{Reset: 0.01, Drop: 0.01, Stall: 0.05})
	defer proxy.Close()
	var h clienthistory.History
	done := drive(t, &h, clients, n, seed, func(name string) *client.Client {
		return c.newClient(name, client.AckAll, attempts(name), proxy.Addr())
	})
	waitFor(t, func() bool { return h.Answered() >= clients*n/3 })

	// The leader dies; f2 is retired (it may be ahead of f1 on batches
	// nobody was told of); f1, which holds every acknowledged batch (all
	// acks), is promoted, with a copy of its directory as its follower.
	c.stopLeader()
	c.closeNode("f2")
	f1 := c.nodes["f1"].dir
	c.closeNode("f1")
	f3 := filepath.Join(t.TempDir(), "f3")
	testutil.CopyDir(t, f1, f3)
	c.dir = f1
	c.lopts.Promote, c.lopts.Epoch, c.lopts.Followers = true, 2, []string{"f3"}
	c.startLeader("127.0.0.1:0")
	c.startNode("f3", f3)
	next := testutil.NewFaultProxy(t, c.addr, seed+1, testutil.ProxyFaults{Reset: 0.01, Drop: 0.01, Stall: 0.05})
	defer next.Close()
	notLeader := c.listenServices(oldAddr, clientapi.NotLeader(func() (string, uint64) { return next.Addr(), 2 }))
	defer notLeader.Close()
	<-done

	c.caughtUp()
	v := h.Check(t, "promoted leader", c.leaderEffects())
	h.Check(t, "follower f3", c.nodeEffects("f3"))
	v.Replays = h.CheckAnswers(t)
	h.CheckLinearizable(t)
	for _, r := range h.Requests() {
		for _, a := range r.Answers() {
			if a.OK() && a.Res.Epoch == 2 {
				t.Logf("seed %d: %v; the promoted leader answered (%s, for one)", seed, v, r.ID)
				return
			}
		}
	}
	t.Fatalf("seed %d: no answer came from the promoted leader (epoch 2): the clients never found it", seed)
}

// attempts is client name's budget: c0 has 3 attempts a call, so that a
// call caught by the outage can end without an answer (the at-most-once
// case); the others enough to ride it out.
func attempts(name string) int {
	if name == "c0" {
		return 3
	}
	return 100
}

// drive runs clients clients of n requests each, made by newClient, and
// closes the returned channel when all are done; the test fails if they
// do not finish within two minutes.
func drive(t *testing.T, h *clienthistory.History, clients, n int, seed uint64, newClient func(name string) *client.Client) <-chan struct{} {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	done := make(chan struct{})
	var wg sync.WaitGroup
	for k := range clients {
		name := fmt.Sprintf("c%d", k)
		cl := newClient(name)
		wg.Go(func() { h.Drive(ctx, cl, name, n, seed*16+uint64(k)) })
	}
	go func() {
		wg.Wait()
		if ctx.Err() != nil {
			t.Error("the clients did not finish")
		}
		close(done)
	}()
	return done
}
