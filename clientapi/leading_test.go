package clientapi_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncewal/oncewal/clientapi"
	"github.com/oncewal/oncewal/follower"
	"github.com/oncewal/oncewal/leader"
	clientv1 "github.com/oncewal/oncewal/proto/oncewal/client/v1"
	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/replication/inprocess"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/store"
	"github.com/oncewal/oncewal/wal"
)

// TestMinAckRaisesTheRequestsPolicy: under MinAck AckAll, a request that
// asks for AckLeader is not answered OK while its registered follower has
// not acknowledged it: the leader's AckTimeout ends the wait with the
// outcome unknown, naming the policy it waited for. Once the follower
// runs and holds the batch, the retry answers Replay — and a new request
// OK — saying they were answered under the raised policy.
func TestMinAckRaisesTheRequestsPolicy(t *testing.T) {
	tr := inprocess.New(inprocess.FaultsNone, 1)
	defer tr.Close()
	r := newRig(t, leader.Options{Shards: 1, Followers: []string{"f1"}, AckTimeout: time.Second,
		Listener: func(uint32) replication.Listener { return tr },
		Shipping: leader.ShipperOptions{PollInterval: time.Millisecond, RetransmitTimeout: 20 * time.Millisecond}},
		&clientapi.Options{MinAck: clientv1.Ack_ACK_ALL})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Go(func() { _ = r.l.Run(ctx) })

	cc := r.client("alice")
	sid := session.ID(openSession(t, cc, &clientv1.OpenSessionRequest{}).Session)
	req := &clientv1.SubmitRequest{Session: sid[:], RequestId: "a1", Ack: clientv1.Ack_ACK_LEADER, Payload: ops(add("n", 1))}
	rep := submit(t, cc, req)
	require.Equal(t, clientv1.Code_UNAVAILABLE, rep.Code, "answered %v under ack leader with MinAck all and no follower running: %s", rep.Code, rep.Message)
	for _, want := range []string{"not acknowledged under ack policy all", "acknowledgement timed out", "outcome is unknown", "retry with the same request ID"} {
		require.Contains(t, rep.Message, want)
	}
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
	end := r.l.For(sid).NextLSN() - 1
	waitFor(t, func() bool { applied, _ := f.Position(); return applied >= end })

	replay := submit(t, cc, req)
	require.Equal(t, clientv1.Code_REPLAY, replay.Code, replay.Message)
	require.Contains(t, replay.Message, "answered under ack policy all, this node's minimum (the request asked for leader)")
	next := submit(t, cc, &clientv1.SubmitRequest{Session: sid[:], RequestId: "a2", Ack: clientv1.Ack_ACK_LEADER, Payload: ops(add("n", 2))})
	require.Equal(t, clientv1.Code_OK, next.Code, next.Message)
	applied, _ := f.Position()
	require.GreaterOrEqual(t, applied, next.Lsn, "OK was answered before the follower held it")
	same := submit(t, cc, &clientv1.SubmitRequest{Session: sid[:], RequestId: "a3", Ack: clientv1.Ack_ACK_ALL, Payload: ops(add("n", 4))})
	require.Equal(t, clientv1.Code_OK, same.Code, same.Message)
	require.Empty(t, same.Message, "a request asking for the minimum itself is answered as before")
	require.Equal(t, int64(7), r.counter(sid, "n"))
}

// TestMinAckValidate: a MinAck that is no ack policy is refused by New,
// naming the field and the policies there are.
func TestMinAckValidate(t *testing.T) {
	l, err := leader.Open(t.TempDir(), &leader.Options{Shards: 1, Logger: quiet(), Store: store.Options{Logger: quiet()}})
	require.NoError(t, err)
	defer l.Close()
	_, err = clientapi.New(l, &clientapi.Options{MinAck: 4, Logger: quiet()})
	require.ErrorIs(t, err, clientapi.ErrBadOptions)
	require.ErrorContains(t, err, "MinAck 4 is not an ack policy: use 0 (leader), 1 (one), 2 (majority) or 3 (all)")
}

// TestLeadingWithholdsAnswers: a request during which Leading starts to
// report an error (the lease of this node may have ended) runs and is
// logged, but is answered Unavailable, its outcome unknown, telling to
// retry with the same ID at the current leader; while it reports one,
// every call is answered NotLeader with the leader unknown and nothing
// runs or is claimed. Once it leads again, the retry replays the one run.
func TestLeadingWithholdsAnswers(t *testing.T) {
	errLease := errors.New("lease deadline passed")
	var deposed atomic.Bool
	var runs atomic.Int64
	h := func(ctx context.Context, q clientapi.Request) ([]wal.Event, []byte, error) {
		runs.Add(1)
		deposed.Store(q.RequestID == "r1") // the lease ends while r1 runs
		events, _, err := clientapi.DefaultHandler(ctx, q)
		return events, []byte("ran"), err
	}
	leading := func() error {
		if deposed.Load() {
			return errLease
		}
		return nil
	}
	r := newRig(t, leader.Options{Shards: 1}, &clientapi.Options{Handler: h, Leading: leading})
	cc := r.client("bob")
	sid := session.ID(openSession(t, cc, &clientv1.OpenSessionRequest{}).Session)

	rep := submit(t, cc, &clientv1.SubmitRequest{Session: sid[:], RequestId: "r1", Payload: ops(add("n", 1))})
	require.Equal(t, clientv1.Code_UNAVAILABLE, rep.Code, "answered %v after its leadership ended: %s", rep.Code, rep.Message)
	for _, want := range []string{"lease deadline passed", "outcome is unknown", "retry with the same request ID at the current leader"} {
		require.Contains(t, rep.Message, want)
	}
	require.Empty(t, rep.Outcome)
	require.Equal(t, int64(1), r.counter(sid, "n"), "it ran, once")

	next := r.l.For(sid).NextLSN()
	rep = submit(t, cc, &clientv1.SubmitRequest{Session: sid[:], RequestId: "r2", Payload: ops(add("n", 10))})
	require.Equal(t, clientv1.Code_NOT_LEADER, rep.Code, rep.Message)
	require.Empty(t, rep.Leader)
	require.Contains(t, rep.Message, "nothing ran here")
	_, found, err := r.l.For(sid).Ledger().Lookup("bob", "r2")
	require.NoError(t, err)
	require.False(t, found, "a deposed node claimed r2")
	st := status(t, cc, &clientv1.StatusRequest{Session: sid[:], RequestId: "r1"})
	require.Equal(t, clientv1.Code_NOT_LEADER, st.Code, st.Message)
	var op clientv1.OpenSessionReply
	require.NoError(t, call(cc, clientv1.Client_OpenSession_FullMethodName, &clientv1.OpenSessionRequest{}, &op))
	require.Equal(t, clientv1.Code_NOT_LEADER, op.Code, op.Message)
	require.Equal(t, next, r.l.For(sid).NextLSN(), "a deposed node logged something")

	deposed.Store(false)
	rep = submit(t, cc, &clientv1.SubmitRequest{Session: sid[:], RequestId: "r1", Payload: ops(add("n", 1))})
	require.Equal(t, clientv1.Code_REPLAY, rep.Code, rep.Message)
	require.Equal(t, "ran", string(rep.Outcome))
	require.Equal(t, int64(1), runs.Load())
	require.Equal(t, int64(1), r.counter(sid, "n"))
}
