package clientapi_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncewal/oncewal/follower"
	"github.com/oncewal/oncewal/leader"
	clientv1 "github.com/oncewal/oncewal/proto/oncewal/client/v1"
	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/replication/inprocess"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/store"
)

// TestAckMajority: with a registered follower not running, a majority
// request cannot be acknowledged: when its context ends the answer is the
// outcome unknown (Unavailable, saying to retry with the same ID); once the follower runs,
// the retry answers Replay — and a new request OK — only with the
// follower holding the batch.
func TestAckMajority(t *testing.T) {
	tr := inprocess.New(inprocess.FaultsNone, 1)
	defer tr.Close()
	r := newRig(t, leader.Options{Shards: 1, Followers: []string{"f1"},
		Listener: func(uint32) replication.Listener { return tr },
		Shipping: leader.ShipperOptions{PollInterval: time.Millisecond, RetransmitTimeout: 20 * time.Millisecond}}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Go(func() { _ = r.l.Run(ctx) })

	cc := r.client("alice")
	sid := session.ID(openSession(t, cc, &clientv1.OpenSessionRequest{}).Session)
	req := &clientv1.SubmitRequest{Session: sid[:], RequestId: "m1", Ack: clientv1.Ack_ACK_MAJORITY, Payload: ops(add("n", 1))}
	// Over the wire the caller's deadline ends the call on both sides; the
	// service's own answer to a wait its context ended is what it says.
	short, stop := context.WithTimeout(context.Background(), 200*time.Millisecond)
	rep := r.svc.Submit(short, "alice", req)
	stop()
	require.Equal(t, clientv1.Code_UNAVAILABLE, rep.Code, "answered %v before any follower acknowledged", rep.Code)
	require.Contains(t, rep.Message, "outcome is unknown")
	require.Contains(t, rep.Message, "retry with the same request ID")
	require.Equal(t, int64(1), r.counter(sid, "n"), "it ran, once")

	f, err := follower.Open(t.TempDir(), &follower.Options{Store: store.Options{ID: "f1", Logger: quiet()}, ReconnectBackoff: time.Millisecond})
	require.NoError(t, err)
	fctx, fcancel := context.WithCancel(context.Background())
	var fwg sync.WaitGroup
	fwg.Go(func() { _ = f.Serve(fctx, tr) })
	defer func() {
		fcancel()
		fwg.Wait()
		require.NoError(t, f.Close())
	}()

	replay := submit(t, cc, req)
	require.Equal(t, clientv1.Code_REPLAY, replay.Code, replay.Message)
	applied, _ := f.Position()
	require.GreaterOrEqual(t, applied, replay.Lsn, "the replay was answered before the follower held it")
	n, err := f.Store().State().Counter(sid, []byte("n"))
	require.NoError(t, err)
	require.Equal(t, int64(1), n)

	next := submit(t, cc, &clientv1.SubmitRequest{Session: sid[:], RequestId: "m2", Ack: clientv1.Ack_ACK_MAJORITY, Payload: ops(add("n", 2))})
	require.Equal(t, clientv1.Code_OK, next.Code, next.Message)
	applied, _ = f.Position()
	require.GreaterOrEqual(t, applied, next.Lsn, "OK was answered before the follower held it")
	require.Equal(t, int64(3), r.counter(sid, "n"))
}

// TestAckTimeoutAnswersUnavailable: a majority request whose follower
// never runs is answered over the wire once the leader's AckTimeout
// passes — not when the caller's deadline ends the call — as Unavailable,
// outcome unknown, retry with the same request ID, naming how many
// followers acknowledged.
func TestAckTimeoutAnswersUnavailable(t *testing.T) {
	tr := inprocess.New(inprocess.FaultsNone, 1)
	defer tr.Close()
	r := newRig(t, leader.Options{Shards: 1, Followers: []string{"f1"}, AckTimeout: 50 * time.Millisecond,
		Listener: func(uint32) replication.Listener { return tr }}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Go(func() { _ = r.l.Run(ctx) })

	cc := r.client("alice")
	sid := session.ID(openSession(t, cc, &clientv1.OpenSessionRequest{}).Session)
	rep := submit(t, cc, &clientv1.SubmitRequest{Session: sid[:], RequestId: "t1", Ack: clientv1.Ack_ACK_MAJORITY, Payload: ops(add("n", 1))})
	require.Equal(t, clientv1.Code_UNAVAILABLE, rep.Code, rep.Message)
	for _, want := range []string{"acknowledgement timed out", "acknowledged by 0 of 1 followers (0 connected)",
		"majority needs 1", "outcome is unknown", "retry with the same request ID"} {
		require.Contains(t, rep.Message, want)
	}
	require.Equal(t, int64(1), r.counter(sid, "n"), "it ran, once")
}
