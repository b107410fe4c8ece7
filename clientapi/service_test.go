package clientapi_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"

	"github.com/oncewal/oncewal/clientapi"
	"github.com/oncewal/oncewal/idempotency"
	"github.com/oncewal/oncewal/leader"
	clientv1 "github.com/oncewal/oncewal/proto/oncewal/client/v1"
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
	sid := session.ID(openSession(t, cc, &clientv1.OpenSessionRequest{}).Session)
	st := status(t, cc, &clientv1.StatusRequest{Session: sid[:], RequestId: "r1"})
	require.Equal(t, clientv1.Code_UNKNOWN, st.Code)

	req := &clientv1.SubmitRequest{Session: sid[:], RequestId: "r1", Action: "deposit 5", Payload: ops(add("balance", 5), put("note", "x"))}
	first := submit(t, cc, req)
	require.Equal(t, clientv1.Code_OK, first.Code, first.Message)
	require.Positive(t, first.Lsn)
	require.Equal(t, uint64(1), first.Epoch)
	require.Equal(t, int64(5), r.counter(sid, "balance"))
	v, ok, err := r.l.For(sid).Store().State().Get(sid, []byte("note"))
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, "x", string(v))

	again := submit(t, cc, req)
	require.Equal(t, clientv1.Code_REPLAY, again.Code, again.Message)
	require.Equal(t, first.Outcome, again.Outcome)
	require.GreaterOrEqual(t, again.Lsn, first.Lsn, "a replay's LSN covers the original's batch")
	require.Equal(t, int64(5), r.counter(sid, "balance"), "a replay runs nothing")

	other := req
	other.Payload, other.Action = ops(add("balance", 7)), "deposit 7"
	conflict := submit(t, cc, other)
	require.Equal(t, clientv1.Code_CONFLICT, conflict.Code)
	require.Contains(t, conflict.Message, `"deposit 5"`, "the conflict names the first request's action")
	require.Equal(t, int64(5), r.counter(sid, "balance"))

	st = status(t, cc, &clientv1.StatusRequest{Session: sid[:], RequestId: "r1"})
	require.Equal(t, clientv1.Code_REPLAY, st.Code)
	require.Positive(t, st.Expires)
	require.Equal(t, clientapi.Stats{
		Submit:      map[clientv1.Code]uint64{clientv1.Code_OK: 1, clientv1.Code_REPLAY: 1, clientv1.Code_CONFLICT: 1},
		Status:      map[clientv1.Code]uint64{clientv1.Code_UNKNOWN: 1, clientv1.Code_REPLAY: 1},
		OpenSession: map[clientv1.Code]uint64{clientv1.Code_OK: 1},
		Txn:         map[clientv1.Code]uint64{}, Get: map[clientv1.Code]uint64{}, Range: map[clientv1.Code]uint64{},
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
	sid := session.ID(openSession(t, cc, &clientv1.OpenSessionRequest{}).Session)
	req := &clientv1.SubmitRequest{Session: sid[:], RequestId: "t-1", Payload: []byte("anything")}

	refused := submit(t, cc, req)
	require.Equal(t, clientv1.Code_REFUSED, refused.Code)
	require.Contains(t, refused.Message, "insufficient funds")
	_, found, err := r.l.For(sid).Ledger().Lookup("carol", "t-1")
	require.NoError(t, err)
	require.False(t, found, "a refused request leaves no claim")
	require.Equal(t, int64(0), r.counter(sid, "n"))

	mu.Lock()
	fail = false
	mu.Unlock()
	ok := submit(t, cc, req)
	require.Equal(t, clientv1.Code_OK, ok.Code, ok.Message)
	require.Equal(t, "receipt for carol/t-1", string(ok.Outcome))
	replay := submit(t, cc, req)
	require.Equal(t, clientv1.Code_REPLAY, replay.Code)
	require.Equal(t, ok.Outcome, replay.Outcome)
	require.Equal(t, 2, runs)
	require.Equal(t, int64(1), r.counter(sid, "n"))
}

// TestPrincipalsAreScopes: two clients using one request ID each run their
// own request; neither replays nor conflicts with the other's.
func TestPrincipalsAreScopes(t *testing.T) {
	r := newRig(t, leader.Options{Shards: 1}, nil)
	alice, bob := r.client("alice"), r.client("bob")
	sid := session.ID(openSession(t, alice, &clientv1.OpenSessionRequest{}).Session)
	a := submit(t, alice, &clientv1.SubmitRequest{Session: sid[:], RequestId: "same", Payload: ops(add("n", 1))})
	require.Equal(t, clientv1.Code_OK, a.Code, a.Message)
	b := submit(t, bob, &clientv1.SubmitRequest{Session: sid[:], RequestId: "same", Payload: ops(add("n", 10))})
	require.Equal(t, clientv1.Code_OK, b.Code, "bob's request is his own, not a conflict with alice's: %s", b.Message)
	require.Equal(t, int64(11), r.counter(sid, "n"))
	require.Equal(t, clientv1.Code_REPLAY, submit(t, bob, &clientv1.SubmitRequest{Session: sid[:], RequestId: "same", Payload: ops(add("n", 10))}).Code)
	require.Equal(t, clientv1.Code_UNKNOWN, status(t, r.client("dave"), &clientv1.StatusRequest{Session: sid[:], RequestId: "same"}).Code)
}

// TestSessionExpiredAtTheDoor: a request in a session idle past the
// retention horizon answers SessionExpired and claims nothing; retried
// under a session opened with Near, it runs.
func TestSessionExpiredAtTheDoor(t *testing.T) {
	clk := testutil.NewClock()
	r := newRig(t, leader.Options{Shards: 4, Wall: clk.Now}, nil)
	cc := r.client("erin")
	opened := openSession(t, cc, &clientv1.OpenSessionRequest{})
	require.Equal(t, int64(session.DefaultRetentionHorizon), opened.Horizon)
	sid := session.ID(opened.Session)
	clk.Advance(time.Duration(opened.Horizon) + time.Hour)

	req := &clientv1.SubmitRequest{Session: sid[:], RequestId: "late", Payload: ops(add("n", 1))}
	next := r.l.For(sid).NextLSN()
	rep := submit(t, cc, req)
	require.Equal(t, clientv1.Code_SESSION_EXPIRED, rep.Code, rep.Message)
	require.Equal(t, next, r.l.For(sid).NextLSN(), "nothing logged: no claim, no release")
	require.Contains(t, rep.Message, "open a new session")
	_, found, err := r.l.For(sid).Ledger().Lookup("erin", "late")
	require.NoError(t, err)
	require.False(t, found, "nothing claimed")
	require.Equal(t, clientv1.Code_UNKNOWN, status(t, cc, &clientv1.StatusRequest{Session: sid[:], RequestId: "late"}).Code)

	renewed := session.ID(openSession(t, cc, &clientv1.OpenSessionRequest{Near: sid[:]}).Session)
	require.Equal(t, r.l.For(sid).ID(), r.l.For(renewed).ID())
	req.Session = renewed[:]
	rep = submit(t, cc, req)
	require.Equal(t, clientv1.Code_OK, rep.Code, rep.Message)
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
	sid := session.ID(openSession(t, cc, &clientv1.OpenSessionRequest{}).Session)
	q := func(id string) *clientv1.StatusReply {
		return status(t, cc, &clientv1.StatusRequest{Session: sid[:], RequestId: id})
	}
	require.Equal(t, clientv1.Code_UNKNOWN, q("slow").Code)

	done := make(chan *clientv1.SubmitReply, 1)
	go func() {
		var rep clientv1.SubmitReply
		_ = call(cc, clientv1.Client_Submit_FullMethodName, &clientv1.SubmitRequest{Session: sid[:], RequestId: "slow"}, &rep)
		done <- &rep
	}()
	<-running
	require.Equal(t, clientv1.Code_IN_FLIGHT, q("slow").Code)
	close(release)
	require.Equal(t, clientv1.Code_OK, (<-done).Code)
	st := q("slow")
	require.Equal(t, clientv1.Code_REPLAY, st.Code)
	require.Equal(t, "done slow", string(st.Outcome))

	// A failure recorded by an embedder on the same ledger.
	sh := r.l.For(sid)
	c, err := sh.Claim(context.Background(), sid, "frank", "bad", nil, idempotency.ClaimOptions{})
	require.NoError(t, err)
	require.NoError(t, sh.Ledger().Fail(c, []byte("card declined"), time.Hour))
	st = q("bad")
	require.Equal(t, clientv1.Code_FAILED, st.Code)
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
		rep := openSession(t, cc, &clientv1.OpenSessionRequest{Near: near[:]})
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
// the request is looked at; a malformed request (a session ID that is not
// 16 bytes) is InvalidArgument.
func TestIdentityRequired(t *testing.T) {
	r := newRig(t, leader.Options{Shards: 1}, nil)
	sid := session.NewID()
	req := &clientv1.SubmitRequest{Session: sid[:], RequestId: "x", Payload: ops(add("n", 1))}
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
		var rep clientv1.SubmitReply
		err := call(tc.cc, clientv1.Client_Submit_FullMethodName, req, &rep)
		require.Equal(t, tc.want, grpcstatus.Code(err), "%s: %v", tc.name, err)
	}
	require.Equal(t, int64(0), r.counter(sid, "n"))
	_, found, err := r.l.For(sid).Ledger().Lookup("f1", "x")
	require.NoError(t, err)
	require.False(t, found)

	var rep clientv1.SubmitReply
	err = call(r.client("alice"), clientv1.Client_Submit_FullMethodName, &clientv1.SubmitRequest{Session: sid[:15], RequestId: "x"}, &rep)
	require.Equal(t, codes.InvalidArgument, grpcstatus.Code(err), "a session of 15 bytes: %v", err)
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
	sid := session.ID(openSession(t, cc, &clientv1.OpenSessionRequest{}).Session)
	req := &clientv1.SubmitRequest{Session: sid[:], RequestId: "dup", Payload: []byte("p")}
	first := make(chan *clientv1.SubmitReply, 1)
	go func() {
		var rep clientv1.SubmitReply
		_ = call(cc, clientv1.Client_Submit_FullMethodName, req, &rep)
		first <- &rep
	}()
	<-running
	second := make(chan *clientv1.SubmitReply, 1)
	go func() {
		var rep clientv1.SubmitReply
		_ = call(cc, clientv1.Client_Submit_FullMethodName, req, &rep)
		second <- &rep
	}()
	// The retry is parked on the claim (the ledger counts its waiters)
	// before the first attempt is let go.
	waitFor(t, func() bool { return r.l.For(sid).Ledger().Waiting() == 1 })
	close(release)
	a, b := <-first, <-second
	require.Equal(t, clientv1.Code_OK, a.Code, a.Message)
	require.Equal(t, clientv1.Code_REPLAY, b.Code, "the retry waited for the first attempt: %s", b.Message)
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
	sid := session.ID(openSession(t, cc, &clientv1.OpenSessionRequest{}).Session)
	rep := submit(t, cc, &clientv1.SubmitRequest{Session: sid[:], RequestId: "slow", Payload: []byte("p")})
	require.Equal(t, clientv1.Code_OK, rep.Code, rep.Message)
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
	sid := session.ID(openSession(t, cc, &clientv1.OpenSessionRequest{}).Session)
	for other = session.NewID(); r.l.For(other) == r.l.For(sid); other = session.NewID() {
	}
	for _, tc := range []struct {
		id   string
		ack  clientv1.Ack
		want string
	}{{"ack", 7, "ack policy 7"}, {"panic", 0, "the handler panicked: handler bug"}, {"cross", 0, "which shard"}} {
		next := r.l.For(sid).NextLSN()
		rep := submit(t, cc, &clientv1.SubmitRequest{Session: sid[:], RequestId: tc.id, Ack: tc.ack, Payload: []byte("p")})
		require.Equal(t, clientv1.Code_REFUSED, rep.Code, "%s: %s", tc.id, rep.Message)
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

// TestSubmitLimits: a request out of the service's limits (clientv1's) is
// refused before anything is claimed, naming every problem; a default
// payload that is no clientv1.Ops, or holds a wrong op, is refused by
// DefaultHandler with ErrBadPayload's text and nothing logged.
func TestSubmitLimits(t *testing.T) {
	r := newRig(t, leader.Options{Shards: 1}, nil)
	cc := r.client("lee")
	sid := session.ID(openSession(t, cc, &clientv1.OpenSessionRequest{}).Session)
	for _, tc := range []struct {
		name string
		req  *clientv1.SubmitRequest
		want []string
	}{
		{"limits", &clientv1.SubmitRequest{Session: sid[:], RequestId: "a", Ack: -1, Action: strings.Repeat("x", clientv1.MaxAction+1),
			Payload: make([]byte, clientv1.MaxPayload+1)}, []string{"ack policy -1", "action of 201 bytes", "payload of 1048577 bytes"}},
		{"not ops", &clientv1.SubmitRequest{Session: sid[:], RequestId: "b", Payload: []byte{0xff, 0xff}}, []string{"not the default payload"}},
		{"no ops", &clientv1.SubmitRequest{Session: sid[:], RequestId: "c", Payload: ops()}, []string{"0 ops"}},
		{"empty key", &clientv1.SubmitRequest{Session: sid[:], RequestId: "d", Payload: ops(put("", "v"))}, []string{"op 0 has an empty key"}},
		{"unknown kind", &clientv1.SubmitRequest{Session: sid[:], RequestId: "e", Payload: ops(&clientv1.Op{Kind: 9, Key: []byte("k")})}, []string{"unknown kind"}},
		{"value on add", &clientv1.SubmitRequest{Session: sid[:], RequestId: "f", Payload: ops(&clientv1.Op{Kind: clientv1.Op_ADD, Key: []byte("k"), Value: []byte("v")})}, []string{"a value on a ADD"}},
		{"delta on put", &clientv1.SubmitRequest{Session: sid[:], RequestId: "g", Payload: ops(&clientv1.Op{Kind: clientv1.Op_PUT, Key: []byte("k"), Delta: 3})}, []string{"a delta on a PUT"}},
	} {
		next := r.l.For(sid).NextLSN()
		var rep clientv1.SubmitReply
		err := call(cc, clientv1.Client_Submit_FullMethodName, tc.req, &rep)
		require.NoError(t, err, tc.name)
		require.Equal(t, clientv1.Code_REFUSED, rep.Code, "%s: %s", tc.name, rep.Message)
		for _, w := range tc.want {
			require.Contains(t, rep.Message, w, tc.name)
		}
		if tc.name == "limits" {
			require.Equal(t, next, r.l.For(sid).NextLSN(), "refused before the claim: nothing logged")
		}
		_, found, err := r.l.For(sid).Ledger().Lookup("lee", tc.req.RequestId)
		require.NoError(t, err)
		require.False(t, found, "%s: no ledger entry", tc.name)
	}
	rep := submit(t, cc, &clientv1.SubmitRequest{Session: sid[:], RequestId: "ok", Ack: clientv1.Ack_ACK_LEADER, Payload: ops(add("n", 2))})
	require.Equal(t, clientv1.Code_OK, rep.Code, rep.Message)
	require.Equal(t, clientv1.Ack_ACK_LEADER, rep.Ack, "the reply says the policy it is durable under")
	require.Equal(t, int64(2), r.counter(sid, "n"))
}
