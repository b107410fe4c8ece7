package grpctransport

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/oncewal/oncewal/replication"
)

// dialAsync dials with hello in the background: Dial returns only once a
// Listener accepted the stream.
func dialAsync(ctx context.Context, d *Dialer, hello replication.Ack) chan dialResult {
	out := make(chan dialResult, 1)
	go func() {
		c, err := d.Dial(ctx, hello)
		out <- dialResult{c, err}
	}()
	return out
}

type dialResult struct {
	c   replication.FollowerConn
	err error
}

// TestServerRoutesByShard: one server serves several shards, each shard's
// Listener taking only the streams whose hello names it; a stream for a
// shard nobody serves is refused at once with the reason, on both sides; a
// stream that waited before routing started is routed once it does; the
// Server's own Accept then says ErrRouted; Close ends every Listener.
func TestServerRoutesByShard(t *testing.T) {
	checkGoroutines(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	log, rec := newLogRecorder()
	srv, d := mtls(t, log) // d's certificate names f1: every hello here says f1

	// A stream that arrives while the server is still unrouted waits in its
	// queue; it moves to its shard's Listener when routing starts.
	early := dialAsync(ctx, d, replication.Ack{Shard: 3, FollowerID: "f1"})
	waitFor(t, ctx, "the early stream", func() bool { return srv.Stats().Streams == 1 })
	l3 := srv.Listener(3)
	c, hello, err := l3.Accept(ctx)
	if err != nil || hello.Shard != 3 || hello.FollowerID != "f1" {
		t.Fatalf("shard 3 accepted %+v, %v", hello, err)
	}
	if r := <-early; r.err != nil {
		t.Fatalf("early dial: %v", r.err)
	} else {
		defer r.c.Close()
	}
	defer c.Close()

	l0 := srv.Listener(0)
	if srv.Listener(0) != l0 || l0.Shard() != 0 {
		t.Fatal("Listener(0) is not one Listener")
	}
	if _, _, err := srv.Accept(ctx); !errors.Is(err, ErrRouted) {
		t.Fatalf("Server.Accept on a routed server: %v", err)
	}
	// Each shard's stream goes to its own Listener, whatever the order.
	for _, shard := range []uint32{3, 0, 3} {
		res := dialAsync(ctx, d, replication.Ack{Shard: shard, FollowerID: "f1"})
		l := map[uint32]*ShardListener{0: l0, 3: l3}[shard]
		lc, h, err := l.Accept(ctx)
		if err != nil || h.Shard != shard {
			t.Fatalf("shard %d Listener accepted %+v, %v", shard, h, err)
		}
		r := <-res
		if r.err != nil {
			t.Fatal(r.err)
		}
		// The stream works: a batch goes through.
		if err := lc.Send(ctx, testBatch(t, shard, 1, 2)); err != nil {
			t.Fatal(err)
		}
		if _, err := r.c.Recv(ctx); err != nil {
			t.Fatal(err)
		}
		r.c.Close()
		lc.Close()
	}

	// A shard nobody serves: refused before Dial returns, with the reason.
	_, err = d.Dial(ctx, replication.Ack{Shard: 1, FollowerID: "f1"})
	if !errors.Is(err, ErrRefused) || !errors.Is(err, replication.ErrDisconnected) || !errors.Is(err, replication.ErrWrongShard) ||
		!strings.Contains(err.Error(), "no shard 1") {
		t.Fatalf("dial of an unserved shard: %v", err)
	}
	if st := srv.Stats(); st.UnservedShard != 1 {
		t.Fatalf("server stats %+v", st)
	}
	if _, ok := rec.find("leader serves no shard 1", "follower=f1"); !ok {
		t.Errorf("no leader log line for the unserved shard: %q", rec.Lines())
	}
	if _, ok := rec.find("refused this follower", "no shard 1"); !ok {
		t.Errorf("no follower log line for the refusal: %q", rec.Lines())
	}

	closed := make(chan error, 1)
	go func() { _, _, err := l0.Accept(ctx); closed <- err }()
	srv.Close()
	if err := <-closed; !errors.Is(err, replication.ErrClosed) {
		t.Fatalf("Accept after Close: %v", err)
	}
}

// TestRefuseCarriesReason: a connection the leader refuses (as a Fanout
// does for an unknown, diverged or behind-retention follower) ends on the
// follower with ErrRefused, the refusal's own sentinel and the leader's
// reason, whichever sentinel it is; a reason of no known kind still arrives.
func TestRefuseCarriesReason(t *testing.T) {
	checkGoroutines(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv, d := mtls(t, nil)
	reasons := []error{
		fmt.Errorf("%w: follower's batch ending at LSN 9 is epoch 1, this log's is epoch 2", replication.ErrDiverged),
		fmt.Errorf("%w: follower needs LSN 10, the log starts at 500", replication.ErrBehindRetention),
		fmt.Errorf("%w: %q is not registered", replication.ErrUnknownFollower, "x"),
		errors.New("checking the hello: disk on fire"),
	}
	for _, reason := range reasons {
		res := dialAsync(ctx, d, replication.Ack{FollowerID: "f1", AppliedLSN: 9})
		lc, _, err := srv.Accept(ctx)
		if err != nil {
			t.Fatal(err)
		}
		r := <-res
		if r.err != nil {
			t.Fatal(r.err)
		}
		rc, ok := lc.(replication.RefusingConn)
		if !ok {
			t.Fatal("the server's LeaderConn is not a RefusingConn")
		}
		if err := rc.Refuse(reason); err != nil {
			t.Fatal(err)
		}
		rc.Close() // the first of Refuse and Close decides
		_, err = r.c.Recv(ctx)
		if !errors.Is(err, ErrRefused) || !errors.Is(err, replication.ErrDisconnected) || !strings.Contains(err.Error(), reason.Error()) {
			t.Fatalf("follower saw %v", err)
		}
		for _, sentinel := range []error{replication.ErrDiverged, replication.ErrBehindRetention, replication.ErrUnknownFollower} {
			if errors.Is(reason, sentinel) != errors.Is(err, sentinel) {
				t.Fatalf("reason %v arrived as %v", reason, err)
			}
		}
		r.c.Close()
	}
	if st, dst := srv.Stats(), d.Stats(); st.Refused != uint64(len(reasons)) || dst.Refused != uint64(len(reasons)) {
		t.Fatalf("server %+v, dialer %+v", st, dst)
	}
}
