package clientapi_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"

	"github.com/oncewal/oncewal/clientapi"
	"github.com/oncewal/oncewal/idempotency"
	"github.com/oncewal/oncewal/internal/clientwire"
	"github.com/oncewal/oncewal/leader"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/testutil"
	"github.com/oncewal/oncewal/wal"
)

// TestSubmitOnce: a fresh request runs and its events are on the leader's
// store; the same ID again replays the same outcome without running; the
// same ID with another payload is a conflict naming the first request's
// action; Status answers each state.
func TestSubmitOnce(t *testing.T) {
	r := newRig(t, leader.Options{Shards: 2}, nil)
	cc := r.client("alice")
	sid := session.ID(openSession(t, cc, clientwire.OpenSessionRequest{}).Session)
	st := status(t, cc, clientwire.StatusRequest{Session: sid, RequestID: "r1"})
	require.Equal(t, clientwire.Unknown, st.Code)

	req := clientwire.SubmitRequest{Session: sid, RequestID: "r1", Action: "deposit 5", Payload: ops(add("balance", 5), put("note", "x"))}
	first := submit(t, cc, req)
	require.Equal(t, clientwire.OK, first.Code, first.Message)
	require.Positive(t, first.LSN)
	require.Equal(t, uint64(1), first.Epoch)
	require.Equal(t, int64(5), r.counter(sid, "balance"))
	v, ok, err := r.l.For(sid).Store().State().Get(sid, []byte("note"))
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, "x", string(v))

	again := submit(t, cc, req)
	require.Equal(t, clientwire.Replay, again.Code, again.Message)
	require.Equal(t, first.Outcome, again.Outcome)
	require.GreaterOrEqual(t, again.LSN, first.LSN, "a replay's LSN covers the original's batch")
	require.Equal(t, int64(5), r.counter(sid, "balance"), "a replay runs nothing")

	other := req
	other.Payload, other.Action = ops(add("balance", 7)), "deposit 7"
	conflict := submit(t, cc, other)
	require.Equal(t, clientwire.Conflict, conflict.Code)
	require.Contains(t, conflict.Message, `"deposit 5"`, "the conflict names the first request's action")
	require.Equal(t, int64(5), r.counter(sid, "balance"))

	st = status(t, cc, clientwire.StatusRequest{Session: sid, RequestID: "r1"})
	require.Equal(t, clientwire.Replay, st.Code)
	require.Positive(t, st.Expires)
	require.Equal(t, clientapi.Stats{
		Submit:      map[clientwire.Code]uint64{clientwire.OK: 1, clientwire.Replay: 1, clientwire.Conflict: 1},
		Status:      map[clientwire.Code]uint64{clientwire.Unknown: 1, clientwire.Replay: 1},
		OpenSession: map[clientwire.Code]uint64{clientwire.OK: 1},
	}, r.svc.Stats())
}

// TestHandlerOutcomeAndRefusal: a handler's outcome is answered and
// replayed verbatim; a handler's error answers Refused, leaves nothing
// claimed, and a retry runs the handler again.
func TestHandlerOutcomeAndRefusal(t *testing.T) {
	var mu sync.Mutex
	runs, fail := 0, true
	h := func(ctx context.Context, q clientapi.Request) ([]wal.Event, []byte, error) {
		mu.Lock()
		defer mu.Unlock()
		runs++
		if fail {
			return nil, nil, errors.New("insufficient funds")
		}
		return []wal.Event{{Op: wal.OpAdd, Session: q.Session, Key: []byte("n"), Delta: 1}}, []byte("receipt for " + q.Principal + "/" + q.RequestID), nil
	}
	r := newRig(t, leader.Options{Shards: 1}, &clientapi.Options{Handler: h})
	cc := r.client("carol")
	sid := session.ID(openSession(t, cc, clientwire.OpenSessionRequest{}).Session)
	req := clientwire.SubmitRequest{Session: sid, RequestID: "t-1", Payload: []byte("anything")}

	refused := submit(t, cc, req)
	require.Equal(t, clientwire.Refused, refused.Code)
	require.Contains(t, refused.Message, "insufficient funds")
	_, found, err := r.l.For(sid).Ledger().Lookup("carol", "t-1")
	require.NoError(t, err)
	require.False(t, found, "a refused request leaves no claim")
	require.Equal(t, int64(0), r.counter(sid, "n"))

	mu.Lock()
	fail = false
	mu.Unlock()
	ok := submit(t, cc, req)
	require.Equal(t, clientwire.OK, ok.Code, ok.Message)
	require.Equal(t, "receipt for carol/t-1", string(ok.Outcome))
	replay := submit(t, cc, req)
	require.Equal(t, clientwire.Replay, replay.Code)
	require.Equal(t, ok.Outcome, replay.Outcome)
	require.Equal(t, 2, runs)
	require.Equal(t, int64(1), r.counter(sid, "n"))
}

// TestPrincipalsAreScopes: two clients using one request ID each run their
// own request; neither replays nor conflicts with the other's.
func TestPrincipalsAreScopes(t *testing.T) {
	r := newRig(t, leader.Options{Shards: 1}, nil)
	alice, bob := r.client("alice"), r.client("bob")
	sid := session.ID(openSession(t, alice, clientwire.OpenSessionRequest{}).Session)
	a := submit(t, alice, clientwire.SubmitRequest{Session: sid, RequestID: "same", Payload: ops(add("n", 1))})
	require.Equal(t, clientwire.OK, a.Code, a.Message)
	b := submit(t, bob, clientwire.SubmitRequest{Session: sid, RequestID: "same", Payload: ops(add("n", 10))})
	require.Equal(t, clientwire.OK, b.Code, "bob's request is his own, not a conflict with alice's: %s", b.Message)
	require.Equal(t, int64(11), r.counter(sid, "n"))
	require.Equal(t, clientwire.Replay, submit(t, bob, clientwire.SubmitRequest{Session: sid, RequestID: "same", Payload: ops(add("n", 10))}).Code)
	require.Equal(t, clientwire.Unknown, status(t, r.client("dave"), clientwire.StatusRequest{Session: sid, RequestID: "same"}).Code)
}

// TestSessionExpiredAtTheDoor: a request in a session idle past the
// retention horizon answers SessionExpired and claims nothing; retried
// under a session opened with Near, it runs.
func TestSessionExpiredAtTheDoor(t *testing.T) {
	clk := testutil.NewClock()
	r := newRig(t, leader.Options{Shards: 4, Wall: clk.Now}, nil)
	cc := r.client("erin")
	opened := openSession(t, cc, clientwire.OpenSessionRequest{})
	require.Equal(t, int64(session.DefaultRetentionHorizon), opened.Horizon)
	sid := session.ID(opened.Session)
	clk.Advance(time.Duration(opened.Horizon) + time.Hour)

	req := clientwire.SubmitRequest{Session: sid, RequestID: "late", Payload: ops(add("n", 1))}
	next := r.l.For(sid).NextLSN()
	rep := submit(t, cc, req)
	require.Equal(t, clientwire.SessionExpired, rep.Code, rep.Message)
	require.Equal(t, next, r.l.For(sid).NextLSN(), "nothing logged: no claim, no release")
	require.Contains(t, rep.Message, "open a new session")
	_, found, err := r.l.For(sid).Ledger().Lookup("erin", "late")
	require.NoError(t, err)
	require.False(t, found, "nothing claimed")
	require.Equal(t, clientwire.Unknown, status(t, cc, clientwire.StatusRequest{Session: sid, RequestID: "late"}).Code)

	renewed := session.ID(openSession(t, cc, clientwire.OpenSessionRequest{Near: sid, HasNear: true}).Session)
	require.Equal(t, r.l.For(sid).ID(), r.l.For(renewed).ID())
	req.Session = renewed
	rep = submit(t, cc, req)
	require.Equal(t, clientwire.OK, rep.Code, rep.Message)
	require.Equal(t, int64(1), r.counter(renewed, "n"))
}

// TestStatusStates: Status answers Unknown, InFlight (while the handler
// runs), Replay with the outcome, and Failed for a failure the ledger
// recorded.
func TestStatusStates(t *testing.T) {
	running, release := make(chan struct{}), make(chan struct{})
	h := func(ctx context.Context, q clientapi.Request) ([]wal.Event, []byte, error) {
		if q.RequestID == "slow" {
			close(running)
			<-release
		}
		return nil, []byte("done " + q.RequestID), nil
	}
	r := newRig(t, leader.Options{Shards: 2}, &clientapi.Options{Handler: h})
	cc := r.client("frank")
	sid := session.ID(openSession(t, cc, clientwire.OpenSessionRequest{}).Session)
	q := func(id string) clientwire.StatusReply {
		return status(t, cc, clientwire.StatusRequest{Session: sid, RequestID: id})
	}
	require.Equal(t, clientwire.Unknown, q("slow").Code)

	done := make(chan clientwire.SubmitReply, 1)
	go func() {
		var rep clientwire.SubmitReply
		_ = call(cc, clientwire.SubmitMethod, &clientwire.SubmitRequest{Session: sid, RequestID: "slow"}, &rep)
		done <- rep
	}()
	<-running
	require.Equal(t, clientwire.InFlight, q("slow").Code)
	close(release)
	require.Equal(t, clientwire.OK, (<-done).Code)
	st := q("slow")
	require.Equal(t, clientwire.Replay, st.Code)
	require.Equal(t, "done slow", string(st.Outcome))

	// A failure recorded by an embedder on the same ledger.
	sh := r.l.For(sid)
	c, err := sh.Claim(context.Background(), sid, "frank", "bad", nil, idempotency.ClaimOptions{})
	require.NoError(t, err)
	require.NoError(t, sh.Ledger().Fail(c, []byte("card declined"), time.Hour))
	st = q("bad")
	require.Equal(t, clientwire.Failed, st.Code)
	require.Equal(t, "card declined", string(st.Outcome))
}

// TestOpenSessionNear: a session opened with Near routes to Near's shard,
// over many draws on a leader of 4 shards; without Near it is logged open.
func TestOpenSessionNear(t *testing.T) {
	r := newRig(t, leader.Options{Shards: 4}, nil)
	cc := r.client("grace")
	rng := rand.New(rand.NewPCG(26, 1))
	shards := map[uint32]bool{}
	for range 24 {
		near := testutil.SessionID(rng)
		rep := openSession(t, cc, clientwire.OpenSessionRequest{Near: near, HasNear: true})
		id := session.ID(rep.Session)
		require.Equal(t, r.l.For(near).ID(), r.l.For(id).ID())
		require.NotEqual(t, near, id)
		shards[r.l.For(id).ID()] = true
		_, _, found, err := r.l.For(id).Store().Tracker().Get(id)
		require.NoError(t, err)
		require.True(t, found, "the session's opening is logged and applied")
	}
	require.Len(t, shards, 4, "Near, not chance, chose the shard")
}

// TestIdentityRequired: a certificate without an identity, a follower's
// (the rig's generated one, or another) and a node's are refused before
// the request is looked at; an undecodable request is InvalidArgument.
func TestIdentityRequired(t *testing.T) {
	r := newRig(t, leader.Options{Shards: 1}, nil)
	sid := session.NewID()
	req := &clientwire.SubmitRequest{Session: sid, RequestID: "x", Payload: ops(add("n", 1))}
	for _, tc := range []struct {
		name string
		cc   *grpc.ClientConn
		want codes.Code
	}{
		{"no identity", r.conn(), codes.Unauthenticated},
		{"generated follower", dial(t, r.addr, r.tls, r.tls.Follower), codes.PermissionDenied},
		{"follower", r.conn("oncewal://follower/f1"), codes.PermissionDenied},
		{"node", r.conn("oncewal://node/n1"), codes.PermissionDenied},
	} {
		var rep clientwire.SubmitReply
		err := call(tc.cc, clientwire.SubmitMethod, req, &rep)
		require.Equal(t, tc.want, grpcstatus.Code(err), "%s: %v", tc.name, err)
	}
	require.Equal(t, int64(0), r.counter(sid, "n"))
	_, found, err := r.l.For(sid).Ledger().Lookup("f1", "x")
	require.NoError(t, err)
	require.False(t, found)

	out, err := grpctransportCall(r.client("alice"), clientwire.SubmitMethod, []byte{clientwire.Version, 9})
	require.Nil(t, out)
	require.Equal(t, codes.InvalidArgument, grpcstatus.Code(err), "%v", err)
	st := r.svc.Stats()
	require.Equal(t, uint64(4), st.Denied)
	require.Equal(t, uint64(1), st.Malformed)
	require.Empty(t, st.Submit)
}

// TestConcurrentRetryWaits: a retry that arrives while the first attempt
// runs waits for it and replays its outcome; the handler runs once.
func TestConcurrentRetryWaits(t *testing.T) {
	running, release := make(chan struct{}), make(chan struct{})
	var count int
	h := func(ctx context.Context, q clientapi.Request) ([]wal.Event, []byte, error) {
		count++ // the claim serialises runs of one ID
		close(running)
		<-release
		return []wal.Event{{Op: wal.OpAdd, Session: q.Session, Key: []byte("n"), Delta: 1}}, []byte("once"), nil
	}
	r := newRig(t, leader.Options{Shards: 1}, &clientapi.Options{Handler: h})
	cc := r.client("heidi")
	sid := session.ID(openSession(t, cc, clientwire.OpenSessionRequest{}).Session)
	req := clientwire.SubmitRequest{Session: sid, RequestID: "dup", Payload: []byte("p")}
	first := make(chan clientwire.SubmitReply, 1)
	go func() {
		var rep clientwire.SubmitReply
		_ = call(cc, clientwire.SubmitMethod, &req, &rep)
		first <- rep
	}()
	<-running
	second := make(chan clientwire.SubmitReply, 1)
	go func() {
		var rep clientwire.SubmitReply
		_ = call(cc, clientwire.SubmitMethod, &req, &rep)
		second <- rep
	}()
	// The retry is parked on the claim (the ledger counts its waiters)
	// before the first attempt is let go.
	waitFor(t, func() bool { return r.l.For(sid).Ledger().Waiting() == 1 })
	close(release)
	a, b := <-first, <-second
	require.Equal(t, clientwire.OK, a.Code, a.Message)
	require.Equal(t, clientwire.Replay, b.Code, "the retry waited for the first attempt: %s", b.Message)
	require.Equal(t, "once", string(b.Outcome))
	require.Equal(t, 1, count)
	require.Equal(t, int64(1), r.counter(sid, "n"))
}

// TestSlowHandlerKeepsItsClaim: a handler that runs past the ledger's
// lease (on a hand-moved WAL clock) keeps its request ID by the service's
// heartbeat and commits; no other attempt could take the ID meanwhile.
func TestSlowHandlerKeepsItsClaim(t *testing.T) {
	clk := testutil.NewClock()
	var r *rig
	h := func(ctx context.Context, q clientapi.Request) ([]wal.Event, []byte, error) {
		sh := r.l.For(q.Session)
		lease := func() int64 {
			e, found, err := sh.Ledger().Lookup(q.Principal, q.RequestID)
			if err != nil || !found {
				return 0
			}
			return e.Expires
		}
		first := lease()
		clk.Advance(45 * time.Second)
		// A heartbeat that read the clock before the advance extends the
		// lease by WAL time's nanosecond steps only: wait for one after it.
		for deadline := time.Now().Add(10 * time.Second); lease() < first+int64(45*time.Second); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				return nil, nil, errors.New("no heartbeat extended the claim in 10s")
			}
		}
		clk.Advance(45 * time.Second) // past the first lease's end
		return []wal.Event{{Op: wal.OpAdd, Session: q.Session, Key: []byte("n"), Delta: 1}}, []byte("slow but done"), nil
	}
	r = newRig(t, leader.Options{Shards: 1, Wall: clk.Now, Ledger: idempotency.LedgerOptions{Lease: time.Minute}},
		&clientapi.Options{Handler: h, Heartbeat: time.Millisecond})
	cc := r.client("judy")
	sid := session.ID(openSession(t, cc, clientwire.OpenSessionRequest{}).Session)
	rep := submit(t, cc, clientwire.SubmitRequest{Session: sid, RequestID: "slow", Payload: []byte("p")})
	require.Equal(t, clientwire.OK, rep.Code, rep.Message)
	require.Equal(t, "slow but done", string(rep.Outcome))
	require.Equal(t, int64(1), r.counter(sid, "n"))
}

// TestServiceRefusals: an unknown ack policy, a handler that panics and a
// handler whose events belong to another shard's session are refused,
// leave no claim and log nothing of the request's.
func TestServiceRefusals(t *testing.T) {
	var other session.ID
	h := func(ctx context.Context, q clientapi.Request) ([]wal.Event, []byte, error) {
		switch q.RequestID {
		case "panic":
			panic("handler bug")
		case "cross":
			return []wal.Event{{Op: wal.OpAdd, Session: other, Key: []byte("n"), Delta: 1}}, nil, nil
		}
		return nil, nil, nil
	}
	r := newRig(t, leader.Options{Shards: 4}, &clientapi.Options{Handler: h})
	cc := r.client("kim")
	sid := session.ID(openSession(t, cc, clientwire.OpenSessionRequest{}).Session)
	for other = session.NewID(); r.l.For(other) == r.l.For(sid); other = session.NewID() {
	}
	for _, tc := range []struct {
		id   string
		ack  clientwire.Ack
		want string
	}{{"ack", 7, "ack policy 7"}, {"panic", 0, "the handler panicked: handler bug"}, {"cross", 0, "which shard"}} {
		next := r.l.For(sid).NextLSN()
		rep := submit(t, cc, clientwire.SubmitRequest{Session: sid, RequestID: tc.id, Ack: tc.ack, Payload: []byte("p")})
		require.Equal(t, clientwire.Refused, rep.Code, "%s: %s", tc.id, rep.Message)
		require.Contains(t, rep.Message, tc.want)
		_, found, err := r.l.For(sid).Ledger().Lookup("kim", tc.id)
		require.NoError(t, err)
		require.False(t, found, "%s: the claim is released", tc.id)
		if tc.id == "ack" {
			require.Equal(t, next, r.l.For(sid).NextLSN(), "an unknown policy is refused before the claim")
		}
	}
	require.Equal(t, int64(0), r.counter(other, "n"))
}
