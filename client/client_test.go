package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/oncewal/oncewal/clientapi"
	clientv1 "github.com/oncewal/oncewal/proto/oncewal/client/v1"
	"github.com/oncewal/oncewal/replication/grpctransport"
	"github.com/oncewal/oncewal/testutil"
)

// TestSubmitMutualTLS: over mutual TLS, the first Submit opens a session
// and logs in it; the node sees the principal the client certificate
// names, the ops, action and ack asked for; the answer is the Result, a
// replay is Replayed.
func TestSubmitMutualTLS(t *testing.T) {
	p := testutil.NewTLSPair(t)
	n := startNode(t, &node{submit: func(i int, r *clientv1.SubmitRequest) (*clientv1.SubmitReply, error) {
		return &clientv1.SubmitReply{Code: []clientv1.Code{clientv1.Code_OK, clientv1.Code_REPLAY}[i], Lsn: 40 + uint64(i), Epoch: 3, Outcome: []byte("done")}, nil
	}}, grpctransport.ServerTLSConfig(p.Pool, p.Leader))
	alice := testutil.ClientCert(t, p.Certs, "oncewal://client/alice")
	c, err := New(&Options{Addrs: []string{n.addr}, TLS: grpctransport.ClientTLSConfig(p.Pool, alice, ""), Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ops := []Op{Put([]byte("k"), []byte("v")), Add([]byte("n"), -2), Delete([]byte("old"))}
	ctx := context.Background()
	res, err := c.Submit(ctx, "req-1", Ops(ops...), WithAction("set k"), WithAck(AckAll))
	if err != nil {
		t.Fatal(err)
	}
	if string(res.Outcome) != "done" || res.LSN != 40 || res.Epoch != 3 || res.Replayed {
		t.Errorf("result %+v", res)
	}
	if res, err = c.Submit(ctx, "req-1", Ops(ops...), WithAction("set k")); err != nil || !res.Replayed || res.LSN != 41 {
		t.Errorf("replay: %+v, %v", res, err)
	}
	if opens := n.seenOpens(); len(opens) != 1 || !is(opens[0].GetNear(), homeOf("alice")) {
		t.Errorf("opens %+v, want one near alice's home", opens)
	}
	subs := n.seenSubmits()
	if len(subs) != 2 || n.principals[0] != "client/alice" {
		t.Fatalf("submits %d, principals %v", len(subs), n.principals)
	}
	r := subs[0]
	if r.RequestId != "req-1" || r.Action != "set k" || !is(r.Session, sessionN(0)) || r.Ack != clientv1.Ack_ACK_ALL || subs[1].Ack != clientv1.Ack_ACK_MAJORITY {
		t.Errorf("request %+v, then ack %v", r, subs[1].Ack)
	}
	dec, err := clientapi.DecodeOps(r.Payload)
	got := dec.GetOps()
	if err != nil || len(got) != 3 || got[0].Kind != clientv1.Op_PUT || string(got[0].Key) != "k" || string(got[0].Value) != "v" ||
		got[1].Kind != clientv1.Op_ADD || string(got[1].Key) != "n" || got[1].Delta != -2 || got[2].Kind != clientv1.Op_DELETE || string(got[2].Key) != "old" {
		t.Errorf("ops %+v, %v", got, err)
	}
}

// TestInsecurePrincipal: a plaintext client names its principal in the
// oncewal-principal metadata.
func TestInsecurePrincipal(t *testing.T) {
	n := startNode(t, &node{}, nil)
	c := newTestClient(t, []string{n.addr}, nil)
	if _, err := c.Submit(context.Background(), "r", Ops(Put([]byte("k"), nil))); err != nil {
		t.Fatal(err)
	}
	if n.principals[0] != "metadata:tester" {
		t.Errorf("principal %q", n.principals[0])
	}
}

// notLeader is a follower's script: NotLeader on every method, naming
// leader ("" if it knows none).
func notLeader(leader string) *node {
	return &node{
		submit: func(int, *clientv1.SubmitRequest) (*clientv1.SubmitReply, error) {
			return &clientv1.SubmitReply{Code: clientv1.Code_NOT_LEADER, Leader: leader, Epoch: 2}, nil
		},
		open: func(int, *clientv1.OpenSessionRequest) *clientv1.OpenSessionReply {
			return &clientv1.OpenSessionReply{Code: clientv1.Code_NOT_LEADER, Leader: leader, Epoch: 2}
		},
		status: func(int, *clientv1.StatusRequest) *clientv1.StatusReply {
			return &clientv1.StatusReply{Code: clientv1.Code_NOT_LEADER, Leader: leader, Epoch: 2}
		},
	}
}

// TestRedirects: a NotLeader naming the leader sends the client there (and
// later calls start there); one naming none, and a node that refuses the
// connection, send it to the next address.
func TestRedirects(t *testing.T) {
	leader := startNode(t, &node{status: func(int, *clientv1.StatusRequest) *clientv1.StatusReply {
		return &clientv1.StatusReply{Code: clientv1.Code_REPLAY, Outcome: []byte("o"), Epoch: 2}
	}}, nil)
	t.Run("with address", func(t *testing.T) {
		f := startNode(t, notLeader(leader.addr), nil)
		c := newTestClient(t, []string{f.addr}, nil)
		for _, id := range []string{"a", "b"} {
			if res, err := c.Submit(context.Background(), id, Ops(Put([]byte("k"), nil))); err != nil || res.LSN != 7 {
				t.Fatalf("submit %s: %+v, %v", id, res, err)
			}
		}
		if st, err := c.Status(context.Background(), "a"); err != nil || st.State != StateDone || string(st.Outcome) != "o" {
			t.Errorf("status: %+v, %v", st, err)
		}
		// Only the OpenSession met the follower: every later call started
		// at the leader it named.
		if opens, subs := f.seenOpens(), f.seenSubmits(); len(opens) != 1 || len(subs) != 0 {
			t.Errorf("follower saw %d opens, %d submits; want 1, 0", len(opens), len(subs))
		}
	})
	t.Run("connection refused", func(t *testing.T) {
		c := newTestClient(t, []string{deadAddr(t), leader.addr}, nil)
		if _, err := c.Submit(context.Background(), "d", Ops(Put([]byte("k"), nil))); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("without address", func(t *testing.T) {
		f := startNode(t, notLeader(""), nil)
		c := newTestClient(t, []string{f.addr, leader.addr}, nil)
		if _, err := c.Submit(context.Background(), "c", Ops(Put([]byte("k"), nil))); err != nil {
			t.Fatal(err)
		}
		if st, err := c.Status(context.Background(), "c"); err != nil || st.State != StateDone {
			t.Errorf("status: %+v, %v", st, err)
		}
		if len(f.seenOpens()) != 1 {
			t.Errorf("follower saw %d opens, want 1", len(f.seenOpens()))
		}
	})
}

// TestRedirectEpochs: the client remembers the highest epoch it was told
// of, a NotLeader naming no leader included; one from the node calls start
// at makes it forget that node; and after epoch 4, a redirect naming epoch
// 3 is stale: the client goes round the addresses it knows instead.
func TestRedirectEpochs(t *testing.T) {
	leader := startNode(t, &node{submit: func(i int, _ *clientv1.SubmitRequest) (*clientv1.SubmitReply, error) {
		if i == 0 {
			return &clientv1.SubmitReply{Code: clientv1.Code_OK, Epoch: 3}, nil
		}
		return &clientv1.SubmitReply{Code: clientv1.Code_NOT_LEADER, Epoch: 4}, nil // deposed; it knows no successor
	}}, nil)
	f := notLeader(leader.addr)
	f.open = func(int, *clientv1.OpenSessionRequest) *clientv1.OpenSessionReply {
		return &clientv1.OpenSessionReply{Code: clientv1.Code_NOT_LEADER, Leader: leader.addr, Epoch: 3}
	}
	stale := startNode(t, &node{}, nil) // serves, and counts what reaches it
	f.submit = func(int, *clientv1.SubmitRequest) (*clientv1.SubmitReply, error) {
		return &clientv1.SubmitReply{Code: clientv1.Code_NOT_LEADER, Leader: stale.addr, Epoch: 3}, nil // stale
	}
	startNode(t, f, nil)
	c := newTestClient(t, []string{f.addr, leader.addr}, func(o *Options) { o.RetryTimeout = 300 * time.Millisecond })
	if _, err := c.Submit(context.Background(), "a", Ops(Put([]byte("k"), nil))); err != nil {
		t.Fatal(err)
	}
	if addr, epoch := c.Leader(); addr != leader.addr || epoch != 3 {
		t.Errorf("after an OK: leader %q at %d, want %q at 3", addr, epoch, leader.addr)
	}
	_, err := c.Submit(context.Background(), "b", Ops(Put([]byte("k"), nil)))
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("every node said it does not lead: %v, want ErrUnavailable", err)
	}
	if addr, epoch := c.Leader(); addr != "" || epoch != 4 {
		t.Errorf("after the leader said it no longer leads: leader %q at %d, want none at 4", addr, epoch)
	}
	// Attempts: leader (NotLeader), f (stale: not followed), leader, f, …
	// until RetryTimeout.
	if n := len(stale.seenSubmits()) + len(stale.seenOpens()); n != 0 {
		t.Errorf("the stale redirect was followed: its address saw %d requests", n)
	}
	if subs, fsubs := len(leader.seenSubmits()), len(f.seenSubmits()); fsubs < 2 || subs-1-fsubs < 0 || subs-1-fsubs > 1 {
		t.Errorf("the leader saw %d submits, the follower %d; want them to alternate", subs, fsubs)
	}
}

// TestRetrySameID: Unavailable answers, a gRPC Unavailable status and an
// InFlight are retried, every attempt with the same request ID, action and
// payload, until the node answers.
func TestRetrySameID(t *testing.T) {
	script := []func() (*clientv1.SubmitReply, error){
		func() (*clientv1.SubmitReply, error) {
			return &clientv1.SubmitReply{Code: clientv1.Code_UNAVAILABLE}, nil
		},
		func() (*clientv1.SubmitReply, error) { return nil, status.Error(codes.Unavailable, "going away") },
		func() (*clientv1.SubmitReply, error) {
			return &clientv1.SubmitReply{Code: clientv1.Code_IN_FLIGHT}, nil
		},
		func() (*clientv1.SubmitReply, error) {
			return &clientv1.SubmitReply{Code: clientv1.Code_REPLAY, Lsn: 9, Outcome: []byte("once")}, nil
		},
	}
	n := startNode(t, &node{submit: func(i int, _ *clientv1.SubmitRequest) (*clientv1.SubmitReply, error) { return script[i]() }}, nil)
	c := newTestClient(t, []string{n.addr}, nil)
	payload := Ops(Add([]byte("balance"), 10))
	res, err := c.Submit(context.Background(), "pay-7", payload, WithAction("pay 10"))
	if err != nil || !res.Replayed || string(res.Outcome) != "once" {
		t.Fatalf("%+v, %v", res, err)
	}
	subs := n.seenSubmits()
	if len(subs) != len(script) {
		t.Fatalf("node saw %d submits, want %d", len(subs), len(script))
	}
	for i, r := range subs {
		if r.RequestId != "pay-7" || r.Action != "pay 10" || string(r.Payload) != string(payload) || !bytes.Equal(r.Session, subs[0].Session) || len(r.Session) != clientv1.SessionIDLen {
			t.Errorf("attempt %d: %+v", i, r)
		}
	}
}

// TestBudget: a budget spent after attempts that reached a node is
// ErrOutcomeUnknown, all of them with the same ID; one spent before any
// request could have run is ErrUnavailable, never outcome unknown.
func TestBudget(t *testing.T) {
	always := func(code clientv1.Code) *node {
		return &node{submit: func(int, *clientv1.SubmitRequest) (*clientv1.SubmitReply, error) {
			return &clientv1.SubmitReply{Code: code}, nil
		}}
	}
	for _, code := range []clientv1.Code{clientv1.Code_UNAVAILABLE, clientv1.Code_IN_FLIGHT} {
		t.Run(code.String(), func(t *testing.T) {
			n := startNode(t, always(code), nil)
			c := newTestClient(t, []string{n.addr}, func(o *Options) { o.Attempts = 3 })
			_, err := c.Submit(context.Background(), "x", Ops(Put([]byte("k"), nil)))
			if !errors.Is(err, ErrOutcomeUnknown) || errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "retry with the same request ID") {
				t.Fatalf("err = %v, want ErrOutcomeUnknown", err)
			}
			subs := n.seenSubmits()
			if len(subs) != 3 || subs[0].RequestId != "x" || subs[2].RequestId != "x" {
				t.Errorf("node saw %d submits: %+v", len(subs), subs)
			}
		})
	}
	// A gRPC error once the request reached the node: it may have run.
	t.Run("status after sending", func(t *testing.T) {
		n := startNode(t, &node{submit: func(int, *clientv1.SubmitRequest) (*clientv1.SubmitReply, error) {
			return nil, status.Error(codes.Internal, "lost")
		}}, nil)
		c := newTestClient(t, []string{n.addr}, func(o *Options) { o.Attempts = 2 })
		if _, err := c.Submit(context.Background(), "x", Ops(Put([]byte("k"), nil))); !errors.Is(err, ErrOutcomeUnknown) {
			t.Fatalf("err = %v, want ErrOutcomeUnknown", err)
		}
	})
	// Every address refuses the connection: gRPC never had a transport for
	// the request, so it cannot have run; and a node that answers NotLeader
	// (naming nobody) ran nothing either.
	t.Run("never sent", func(t *testing.T) {
		f := startNode(t, notLeader(""), nil)
		for name, addrs := range map[string][]string{
			"connection refused": {deadAddr(t), deadAddr(t)},
			"not leader":         {f.addr, deadAddr(t)},
		} {
			// Nodes not reached and NotLeader answers do not count against
			// Attempts: RetryTimeout ends the call.
			c := newTestClient(t, addrs, func(o *Options) { o.Attempts, o.RetryTimeout = 5, 300*time.Millisecond })
			_, err := c.Submit(context.Background(), "x", Ops(Put([]byte("k"), nil)))
			if !errors.Is(err, ErrUnavailable) || errors.Is(err, ErrOutcomeUnknown) || !strings.Contains(err.Error(), "RetryTimeout") {
				t.Errorf("%s: err = %v, want ErrUnavailable after RetryTimeout", name, err)
			}
			if _, err := c.Status(context.Background(), "x"); !errors.Is(err, ErrUnavailable) {
				t.Errorf("%s: status: %v, want ErrUnavailable", name, err)
			}
		}
		if len(f.seenSubmits()) != 0 {
			t.Errorf("the follower saw a submit: the session must come first")
		}
	})
	// The session is open, and the node names a leader that refuses the
	// connection: the Submit sent there never left the client.
	t.Run("submit refused a connection", func(t *testing.T) {
		dead := deadAddr(t)
		n := startNode(t, &node{submit: func(int, *clientv1.SubmitRequest) (*clientv1.SubmitReply, error) {
			return &clientv1.SubmitReply{Code: clientv1.Code_NOT_LEADER, Leader: dead}, nil
		}}, nil)
		// Looking for the leader does not count against Attempts: the
		// call ends at its RetryTimeout.
		c := newTestClient(t, []string{n.addr}, func(o *Options) { o.RetryTimeout = 300 * time.Millisecond })
		_, err := c.Submit(context.Background(), "x", Ops(Put([]byte("k"), nil)))
		if !errors.Is(err, ErrUnavailable) || errors.Is(err, ErrOutcomeUnknown) || !strings.Contains(err.Error(), "RetryTimeout") {
			t.Errorf("err = %v, want ErrUnavailable after RetryTimeout", err)
		}
		if len(n.seenSubmits()) < 2 {
			t.Errorf("node saw %d submits, want the first and the retries after the dead leader refused", len(n.seenSubmits()))
		}
	})
	// RetryTimeout ends while an attempt is in flight: the attempt keeps
	// going (its AttemptTimeout bounds it) and its answer ends the call —
	// here a NotLeader, so the request did not run. The caller's context
	// ending at the same point cuts the attempt: the request reached the
	// node, so its outcome is unknown.
	t.Run("budget ends in an attempt", func(t *testing.T) {
		n := startNode(t, &node{submit: func(int, *clientv1.SubmitRequest) (*clientv1.SubmitReply, error) {
			time.Sleep(300 * time.Millisecond)
			return &clientv1.SubmitReply{Code: clientv1.Code_NOT_LEADER}, nil
		}}, nil)
		c := newTestClient(t, []string{n.addr}, func(o *Options) { o.RetryTimeout, o.AttemptTimeout = 100*time.Millisecond, 5*time.Second })
		_, err := c.Submit(context.Background(), "x", Ops(Put([]byte("k"), nil)))
		if !errors.Is(err, ErrUnavailable) || errors.Is(err, ErrOutcomeUnknown) || !strings.Contains(err.Error(), "RetryTimeout") {
			t.Errorf("RetryTimeout: err = %v, want ErrUnavailable after RetryTimeout", err)
		}
		if got := len(n.seenSubmits()); got != 1 {
			t.Errorf("node saw %d submits, want the one in flight when RetryTimeout ended", got)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		if _, err := c.Submit(ctx, "y", Ops(Put([]byte("k"), nil))); !errors.Is(err, ErrOutcomeUnknown) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("caller's context: err = %v, want ErrOutcomeUnknown and context.DeadlineExceeded", err)
		}
	})
}

// TestFinalAnswers: Conflict, Refused, a code the client does not know (a
// reply without a code included) and what gRPC says no retry fixes end
// the call at once; an invalid request
// is refused before anything is sent.
func TestFinalAnswers(t *testing.T) {
	for _, tc := range []struct {
		name  string
		reply *clientv1.SubmitReply
		err   error
		want  error
	}{
		{"conflict", &clientv1.SubmitReply{Code: clientv1.Code_CONFLICT, Message: `recorded as "pay 5"`}, nil, ErrConflict},
		{"refused", &clientv1.SubmitReply{Code: clientv1.Code_REFUSED, Message: "unknown op"}, nil, ErrRefused},
		{"rejected", &clientv1.SubmitReply{Code: clientv1.Code_REJECTED, Rejection: &clientv1.Rejection{Code: "insufficient_funds", Detail: "5 < 10"}}, nil, ErrRejected},
		{"unknown code", &clientv1.SubmitReply{Code: clientv1.Code(200)}, nil, ErrRefused},
		{"no code", &clientv1.SubmitReply{Code: clientv1.Code_CODE_UNSPECIFIED, Outcome: []byte("o")}, nil, ErrRefused},
		{"permission denied", nil, status.Error(codes.PermissionDenied, "a follower's certificate"), ErrDenied},
		{"unauthenticated", nil, status.Error(codes.Unauthenticated, "no identity"), ErrDenied},
		{"malformed", nil, status.Error(codes.InvalidArgument, "clientapi: session of 3 bytes, want 16"), ErrRefused},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := startNode(t, &node{submit: func(int, *clientv1.SubmitRequest) (*clientv1.SubmitReply, error) { return tc.reply, tc.err }}, nil)
			c := newTestClient(t, []string{n.addr}, nil)
			_, err := c.Submit(context.Background(), "id", Ops(Put([]byte("k"), nil)), WithAction("pay 10"))
			if !errors.Is(err, tc.want) || errors.Is(err, ErrOutcomeUnknown) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			if len(n.seenSubmits()) != 1 {
				t.Errorf("node saw %d submits, want 1 (not retried)", len(n.seenSubmits()))
			}
			var ce *ConflictError
			if errors.As(err, &ce) && (ce.RequestID != "id" || ce.Action != "pay 10" || !strings.Contains(ce.Message, "pay 5")) {
				t.Errorf("conflict %+v", ce)
			}
			var re *RejectedError
			if errors.As(err, &re) && (re.RequestID != "id" || re.Code != "insufficient_funds" || re.Detail != "5 < 10") {
				t.Errorf("rejection %+v", re)
			}
		})
	}
	n := startNode(t, &node{}, nil)
	c := newTestClient(t, []string{n.addr}, nil)
	for _, id := range []string{"", strings.Repeat("x", clientv1.MaxRequestID+1)} {
		if _, err := c.Submit(context.Background(), id, nil); !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "not sent") {
			t.Errorf("request ID of %d bytes: %v", len(id), err)
		}
	}
	if _, err := c.Submit(context.Background(), "id", nil, WithAction(strings.Repeat("a", clientv1.MaxAction+1))); !errors.Is(err, ErrRefused) {
		t.Errorf("long action: %v", err)
	}
	if len(n.seenSubmits())+len(n.seenOpens()) != 0 {
		t.Errorf("an invalid request reached the node")
	}
}

// TestSessionExpiredRenews: a SessionExpired answer renews the session
// next to the expired one (Near) and retries the same request ID under it.
func TestSessionExpiredRenews(t *testing.T) {
	n := startNode(t, &node{submit: func(i int, r *clientv1.SubmitRequest) (*clientv1.SubmitReply, error) {
		if is(r.Session, sessionN(0)) {
			return &clientv1.SubmitReply{Code: clientv1.Code_SESSION_EXPIRED, Message: "idle past the horizon"}, nil
		}
		return &clientv1.SubmitReply{Code: clientv1.Code_OK, Lsn: 5}, nil
	}}, nil)
	c := newTestClient(t, []string{n.addr}, nil)
	if _, err := c.Submit(context.Background(), "r1", Ops(Put([]byte("k"), nil))); err != nil {
		t.Fatal(err)
	}
	opens, subs := n.seenOpens(), n.seenSubmits()
	if len(opens) != 2 || !is(opens[1].GetNear(), sessionN(0)) {
		t.Errorf("opens %+v, want a first one, then one near %x", opens, sessionN(0))
	}
	if len(subs) != 2 || !is(subs[1].Session, sessionN(1)) || subs[1].RequestId != "r1" {
		t.Errorf("submits %+v", subs)
	}
}

// TestSessionRenewedBeforeHorizon: the session is renewed (near itself)
// once it has been idle for more than half the node's horizon, and not
// before; an OK Submit restarts the idle time.
func TestSessionRenewedBeforeHorizon(t *testing.T) {
	n := startNode(t, &node{}, nil)
	clk := testutil.NewClock()
	c := newTestClient(t, []string{n.addr}, func(o *Options) { o.now = func() time.Time { return time.Unix(0, clk.Now()) } })
	submit := func(id string) []byte {
		t.Helper()
		if _, err := c.Submit(context.Background(), id, Ops(Put([]byte("k"), nil))); err != nil {
			t.Fatal(err)
		}
		subs := n.seenSubmits()
		return subs[len(subs)-1].Session
	}
	first := submit("a")
	clk.Advance(testHorizon / 2) // idle exactly half: still usable
	if s := submit("b"); !bytes.Equal(s, first) {
		t.Errorf("renewed at half the horizon")
	}
	clk.Advance(testHorizon/2 + time.Second) // idle just past half since "b"
	if s := submit("c"); !is(s, sessionN(1)) {
		t.Errorf("session %x after an idle past half the horizon, want the renewed %x", s, sessionN(1))
	}
	if opens := n.seenOpens(); len(opens) != 2 || len(first) != clientv1.SessionIDLen || !bytes.Equal(opens[1].GetNear(), first) {
		t.Errorf("opens %+v, want the renewal near %x", opens, first)
	}
}

// TestCancelStopsPromptly: the caller's context ends a Submit stuck on a
// node that does not answer, with the context's error and, since the
// request reached the node, ErrOutcomeUnknown.
func TestCancelStopsPromptly(t *testing.T) {
	arrived := make(chan struct{}, 1)
	release := make(chan struct{})
	defer close(release)
	n := startNode(t, &node{submit: func(int, *clientv1.SubmitRequest) (*clientv1.SubmitReply, error) {
		arrived <- struct{}{}
		<-release
		return &clientv1.SubmitReply{Code: clientv1.Code_OK}, nil
	}}, nil)
	// Budgets far beyond the test's timeout: only the cancel can end it.
	c := newTestClient(t, []string{n.addr}, func(o *Options) { o.RetryTimeout, o.AttemptTimeout = time.Hour, time.Hour })
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-arrived
		cancel()
	}()
	_, err := c.Submit(ctx, "slow", Ops(Put([]byte("k"), nil)))
	if !errors.Is(err, context.Canceled) || !errors.Is(err, ErrOutcomeUnknown) {
		t.Fatalf("err = %v, want context.Canceled and ErrOutcomeUnknown", err)
	}
}

// TestClose: Close ends a call in progress with ErrClosed (outcome unknown:
// its request reached the node); later calls answer ErrClosed, and a
// second Close nothing.
func TestClose(t *testing.T) {
	arrived := make(chan struct{}, 1)
	release := make(chan struct{})
	defer close(release)
	n := startNode(t, &node{submit: func(int, *clientv1.SubmitRequest) (*clientv1.SubmitReply, error) {
		arrived <- struct{}{}
		<-release
		return &clientv1.SubmitReply{Code: clientv1.Code_OK}, nil
	}}, nil)
	c := newTestClient(t, []string{n.addr}, func(o *Options) { o.RetryTimeout, o.AttemptTimeout = time.Hour, time.Hour })
	go func() {
		<-arrived
		c.Close()
	}()
	_, err := c.Submit(context.Background(), "r", Ops(Put([]byte("k"), nil)))
	if !errors.Is(err, ErrClosed) || !errors.Is(err, ErrOutcomeUnknown) {
		t.Fatalf("in progress: %v, want ErrClosed and ErrOutcomeUnknown", err)
	}
	if _, err := c.Submit(context.Background(), "r", Ops(Put([]byte("k"), nil))); !errors.Is(err, ErrClosed) || errors.Is(err, ErrOutcomeUnknown) {
		t.Errorf("after Close: %v", err)
	}
	if _, err := c.Status(context.Background(), "r"); !errors.Is(err, ErrClosed) {
		t.Errorf("status after Close: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// TestStatusStates: each ledger answer maps to its State; the request
// names the Client's session, opened for it if need be.
func TestStatusStates(t *testing.T) {
	codes := []clientv1.Code{clientv1.Code_UNKNOWN, clientv1.Code_IN_FLIGHT, clientv1.Code_REPLAY, clientv1.Code_FAILED, clientv1.Code_REFUSED}
	n := startNode(t, &node{status: func(i int, _ *clientv1.StatusRequest) *clientv1.StatusReply {
		return &clientv1.StatusReply{Code: codes[i], Time: 11, Expires: 22, Outcome: []byte("o")}
	}}, nil)
	c := newTestClient(t, []string{n.addr}, nil)
	for _, want := range []State{StateUnknown, StateInFlight, StateDone, StateFailed} {
		st, err := c.Status(context.Background(), "id")
		if err != nil || st.State != want || st.Time != 11 || st.Expires != 22 {
			t.Errorf("status %+v, %v; want %v", st, err, want)
		}
	}
	if _, err := c.Status(context.Background(), "id"); !errors.Is(err, ErrRefused) {
		t.Errorf("refused status: %v", err)
	}
	// The ledger is per shard: Status names the Client's session.
	n.mu.Lock()
	defer n.mu.Unlock()
	if len(n.opens) != 1 || !is(n.statuses[0].Session, sessionN(0)) || n.statuses[0].RequestId != "id" {
		t.Errorf("%d opens, status request %+v", len(n.opens), n.statuses[0])
	}
}

// TestOptionsValidate: every problem is reported at once, wrapping
// ErrBadOptions; defaults fill the zero fields.
func TestOptionsValidate(t *testing.T) {
	p := testutil.NewTLSPair(t)
	bad := &Options{Addrs: []string{"nohost"}, Insecure: true, TLS: grpctransport.ClientTLSConfig(p.Pool, p.Follower, ""),
		Ack: AckAll + 1, Attempts: -1, RetryTimeout: -1, AttemptTimeout: -1}
	bad.Backoff.BaseDelay, bad.Backoff.Multiplier, bad.Backoff.Jitter = time.Second, 0.5, 2
	_, err := New(bad)
	for _, want := range []string{`"nohost" is not host:port`, "both TLS and Insecure", "Ack 5", "Attempts -1", "RetryTimeout -1", "AttemptTimeout -1",
		"MaxDelay 0s is below BaseDelay 1s", "Multiplier 0.5", "Jitter 2"} {
		if !errors.Is(err, ErrBadOptions) || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate: %v\nwant %q", err, want)
		}
	}
	for _, tc := range []struct {
		o    Options
		want string
	}{
		{Options{Addrs: []string{"a:1"}}, "TLS is required"},
		{Options{}, "Addrs is empty"},
		{Options{Addrs: []string{"a:1"}, Insecure: true}, "Insecure without Principal"},
		{Options{Addrs: []string{"a:1"}, TLS: grpctransport.ClientTLSConfig(p.Pool, p.Follower, ""), Principal: "x"}, "the certificate names the caller"},
		{Options{Addrs: []string{"a:1"}, TLS: grpctransport.ClientTLSConfig(nil, p.Follower, "")}, "RootCAs is required"},
	} {
		if err := tc.o.Validate(); !errors.Is(err, ErrBadOptions) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate: %v\nwant %q", err, tc.want)
		}
	}
	o := (&Options{Addrs: []string{"a:1"}, Insecure: true, Principal: "p"}).EnsureDefaults()
	if o.Ack != AckMajority || o.Attempts != DefaultAttempts || o.RetryTimeout != DefaultRetryTimeout ||
		o.AttemptTimeout != DefaultAttemptTimeout || o.Backoff != DefaultBackoff || o.Logger == nil || o.Validate() != nil {
		t.Errorf("defaults %+v", o)
	}
	if AckMajority.wire() != clientv1.Ack_ACK_MAJORITY || AckLeader.wire() != clientv1.Ack_ACK_LEADER || AckOne.wire() != clientv1.Ack_ACK_ONE || AckAll.wire() != clientv1.Ack_ACK_ALL {
		t.Errorf("ack policies do not map to clientv1's")
	}
}

// TestDelay: the backoff grows by Multiplier from BaseDelay to MaxDelay,
// spread by ±Jitter.
func TestDelay(t *testing.T) {
	cfg := DefaultBackoff
	for _, tc := range []struct {
		waits int
		r     float64
		want  time.Duration
	}{
		{0, 0.5, 50 * time.Millisecond},
		{1, 0.5, 80 * time.Millisecond},
		{2, 0.5, 128 * time.Millisecond},
		{0, 0, 40 * time.Millisecond},     // −20 %
		{0, 1, 60 * time.Millisecond},     // +20 %
		{100, 0.5, 2 * time.Second},       // capped
		{100, 1, 2400 * time.Millisecond}, // jitter applies after the cap, as in gRPC
	} {
		if got := delay(cfg, tc.waits, tc.r); got.Round(time.Microsecond) != tc.want {
			t.Errorf("delay(%d waits, r %v) = %v, want %v", tc.waits, tc.r, got, tc.want)
		}
	}
}

// TestConcurrentCallsShareSessions: concurrent first calls open one
// session between them, and concurrent SessionExpired answers for it renew
// it once; every request is retried with its own ID under the new one.
func TestConcurrentCallsShareSessions(t *testing.T) {
	expire := make(chan struct{})
	n := startNode(t, &node{submit: func(_ int, r *clientv1.SubmitRequest) (*clientv1.SubmitReply, error) {
		select {
		case <-expire:
			if is(r.Session, sessionN(0)) {
				return &clientv1.SubmitReply{Code: clientv1.Code_SESSION_EXPIRED}, nil
			}
		default:
		}
		return &clientv1.SubmitReply{Code: clientv1.Code_OK}, nil
	}}, nil)
	c := newTestClient(t, []string{n.addr}, nil)
	burst := func(prefix string) {
		t.Helper()
		errs := make(chan error, 8)
		for i := range 8 {
			go func() {
				_, err := c.Submit(context.Background(), fmt.Sprintf("%s-%d", prefix, i), Ops(Put([]byte("k"), nil)))
				errs <- err
			}()
		}
		for range 8 {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
	}
	burst("a")
	if len(n.seenOpens()) != 1 {
		t.Fatalf("%d opens for 8 concurrent first calls, want 1", len(n.seenOpens()))
	}
	close(expire)
	burst("b")
	if opens := n.seenOpens(); len(opens) != 2 || !is(opens[1].GetNear(), sessionN(0)) {
		t.Errorf("opens %+v, want one renewal near the first session", opens)
	}
	last := map[string][]byte{}
	for _, r := range n.seenSubmits() {
		last[r.RequestId] = r.Session
	}
	for i := range 8 {
		if s := last[fmt.Sprintf("b-%d", i)]; !is(s, sessionN(1)) {
			t.Errorf("b-%d last sent under %x, want the renewed session", i, s)
		}
	}
}

// TestCloseLeavesNoGoroutines: Close ends every connection the client made
// (to a node that answered and to one that refused).
func TestCloseLeavesNoGoroutines(t *testing.T) {
	n := startNode(t, &node{}, nil)
	base := runtime.NumGoroutine()
	c, err := New(&Options{Addrs: []string{deadAddr(t), n.addr}, Insecure: true, Principal: "p", Backoff: fastBackoff, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Submit(context.Background(), "r", Ops(Put([]byte("k"), nil))); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	testutil.WaitGoroutines(t, base)
}

// TestFirstSessionHome: every Client of one principal — a process and its
// restart — opens its first session near the same home, so in the same
// shard, and another principal's home differs (invariant 8).
func TestFirstSessionHome(t *testing.T) {
	n := startNode(t, &node{}, nil)
	for _, who := range []string{"tester", "tester", "other"} {
		c := newTestClient(t, []string{n.addr}, func(o *Options) { o.Principal = who })
		if _, err := c.Submit(context.Background(), "r", Ops(Put([]byte("k"), nil))); err != nil {
			t.Fatal(err)
		}
		c.Close()
	}
	opens := n.seenOpens()
	if len(opens) != 3 || len(opens[0].GetNear()) != clientv1.SessionIDLen || !bytes.Equal(opens[0].GetNear(), opens[1].GetNear()) ||
		len(opens[2].GetNear()) != clientv1.SessionIDLen || bytes.Equal(opens[2].GetNear(), opens[0].GetNear()) {
		t.Errorf("opens %+v: want the same home twice, then another", opens)
	}
	if !is(opens[0].GetNear(), homeOf("tester")) {
		t.Errorf("home %x, want homeOf(tester)", opens[0].Near)
	}
}

// TestElectionDoesNotSpendAttempts: while every node answers NotLeader
// naming no leader (an election), the call is bounded by RetryTimeout, not
// by Attempts, which those instant answers would spend long before a new
// leader is elected; it then ends ErrUnavailable, saying RetryTimeout.
func TestElectionDoesNotSpendAttempts(t *testing.T) {
	f := startNode(t, notLeader(""), nil)
	c := newTestClient(t, []string{f.addr}, func(o *Options) { o.Attempts, o.RetryTimeout = 3, 500*time.Millisecond })
	start := time.Now()
	_, err := c.Submit(context.Background(), "e", Ops(Put([]byte("k"), nil)))
	if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "RetryTimeout") {
		t.Fatalf("Submit during an election: %v; want ErrUnavailable after RetryTimeout", err)
	}
	if d := time.Since(start); d < 500*time.Millisecond {
		t.Errorf("the call ended after %v, before its RetryTimeout", d)
	}
	if n := len(f.seenOpens()); n <= 3 {
		t.Errorf("the node saw %d attempts; the budget of 3 should not bound an election", n)
	}
}

// TestBadSessionIDNotUsed: a node that opens a session whose ID is not
// clientv1.SessionIDLen bytes (a field the old wire fixed, the proto does
// not) is not trusted with the request: the client logs nothing under that
// ID and moves to the next address, whose session it uses.
func TestBadSessionIDNotUsed(t *testing.T) {
	bad := startNode(t, &node{open: func(int, *clientv1.OpenSessionRequest) *clientv1.OpenSessionReply {
		return &clientv1.OpenSessionReply{Code: clientv1.Code_OK, Session: []byte{1, 2, 3}, Horizon: int64(testHorizon)}
	}}, nil)
	good := startNode(t, &node{}, nil)
	c := newTestClient(t, []string{bad.addr, good.addr}, nil)
	if _, err := c.Submit(context.Background(), "r", Ops(Put([]byte("k"), nil))); err != nil {
		t.Fatal(err)
	}
	if len(bad.seenOpens()) != 1 || len(bad.seenSubmits()) != 0 {
		t.Errorf("the node that answered a short session ID saw %d opens, %d submits; want 1, 0", len(bad.seenOpens()), len(bad.seenSubmits()))
	}
	if subs := good.seenSubmits(); len(subs) != 1 || !is(subs[0].Session, sessionN(0)) {
		t.Errorf("submits %+v, want one under the good node's session", subs)
	}
}
