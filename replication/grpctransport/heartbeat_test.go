package grpctransport

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/oncewal/oncewal/replication"
)

// TestHeartbeats: a follower of this version asks for heartbeats and a
// leader of this version promises its interval; a heartbeat reaches the
// follower (LivenessConn.LastHeard) and its pong reaches the leader
// (PeerConn.LastHeard moves). Neither side sends a heartbeat or a pong to
// a peer that did not ask or promise — an earlier follower (a raw stream
// with a version-2 hello and no metadata) gets only batches, and a leader
// without heartbeats leaves HeartbeatInterval at 0 — so an upgrade can
// start on either side.
func TestHeartbeats(t *testing.T) {
	checkGoroutines(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv, err := Listen("127.0.0.1:0", &ServerOptions{Insecure: true, Logger: quietLogger(), HeartbeatInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	d, err := NewDialer(srv.Addr().String(), &DialerOptions{Insecure: true, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	accept := func() replication.LeaderConn {
		t.Helper()
		c, _, err := srv.Accept(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}

	// Both sides of this version.
	dialed := make(chan replication.FollowerConn, 1)
	go func() {
		fc, err := d.Dial(ctx, replication.Ack{Shard: 1, FollowerID: "f1"})
		if err != nil {
			t.Error(err)
		}
		dialed <- fc
	}()
	lc := accept()
	fc := <-dialed
	if fc == nil {
		t.FailNow()
	}
	defer fc.Close()
	defer lc.Close()
	hc, live := lc.(replication.HeartbeatConn), fc.(replication.LivenessConn)
	if hc.HeartbeatInterval() != 20*time.Millisecond || live.HeartbeatInterval() != 20*time.Millisecond {
		t.Fatalf("intervals: leader %v, follower %v", hc.HeartbeatInterval(), live.HeartbeatInterval())
	}
	heardAtHello := lc.(replication.PeerConn).LastHeard()
	if err := hc.SendHeartbeat(replication.Heartbeat{LastLSN: 42, WALTime: 7}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "the heartbeat at the follower", func() bool {
		_, hb := live.LastHeard()
		return hb == replication.Heartbeat{LastLSN: 42, WALTime: 7}
	})
	waitFor(t, ctx, "the pong at the leader", func() bool {
		return lc.(replication.PeerConn).LastHeard().After(heardAtHello)
	})

	// A follower of the previous version: no metadata, so no heartbeat.
	cs := rogueStream(t, ctx, srv.Addr().String())
	if err := cs.SendMsg(&frame{mustHello(t, replication.Ack{Shard: 1, FollowerID: "f2"})}); err != nil {
		t.Fatal(err)
	}
	old := accept()
	defer old.Close()
	if iv := old.(replication.HeartbeatConn).HeartbeatInterval(); iv != 0 {
		t.Fatalf("an old follower's interval: %v", iv)
	}
	if err := old.(replication.HeartbeatConn).SendHeartbeat(replication.Heartbeat{LastLSN: 1}); err != nil {
		t.Fatal(err)
	}
	if err := old.Send(ctx, testBatch(t, 1, 1, 2)); err != nil {
		t.Fatal(err)
	}
	if md, err := cs.Header(); err != nil || len(md.Get(heartbeatIntervalKey)) != 0 {
		t.Fatalf("old follower's header: %v %v", md, err)
	}
	var f frame
	if err := cs.RecvMsg(&f); err != nil || f.b[0] != frameBatch {
		t.Fatalf("the old follower's first frame: type %#x, %v", f.b[0], err)
	}

	// A leader that sends no heartbeats (as one of the previous version).
	quiet, err := Listen("127.0.0.1:0", &ServerOptions{Insecure: true, Logger: quietLogger(), HeartbeatInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer quiet.Close()
	qd, err := NewDialer(quiet.Addr().String(), &DialerOptions{Insecure: true, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer qd.Close()
	go func() {
		fc, err := qd.Dial(ctx, replication.Ack{Shard: 1, FollowerID: "f3"})
		if err != nil {
			t.Error(err)
		}
		dialed <- fc
	}()
	qc, _, err := quiet.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer qc.Close()
	qf := <-dialed
	if qf == nil {
		t.FailNow()
	}
	defer qf.Close()
	if iv := qf.(replication.LivenessConn).HeartbeatInterval(); iv != 0 {
		t.Fatalf("interval from a leader without heartbeats: %v", iv)
	}
}

// TestRefusalReasonsCarried: every refusal reason a leader gives reaches
// the follower as its own sentinel, wrapped with ErrRefused and
// ErrDisconnected, its text (with the remedy) intact — the duplicate
// follower ID included (it arrived as an untyped "other").
func TestRefusalReasonsCarried(t *testing.T) {
	for _, sentinel := range []error{replication.ErrWrongShard, replication.ErrFenced, replication.ErrStaleEpoch,
		replication.ErrDiverged, replication.ErrBehindRetention, replication.ErrUnknownFollower, replication.ErrIdentityMismatch,
		replication.ErrDuplicateFollower, replication.ErrBadFollowerID, replication.ErrBadHello} {
		reason := fmt.Errorf("%w: \"f1\" is already connected; give each follower its own ID", sentinel)
		got, ok := refusal(status.Error(codes.FailedPrecondition, refusalMessage(reason)))
		if !ok || !errors.Is(got, sentinel) || !errors.Is(got, ErrRefused) || !errors.Is(got, replication.ErrDisconnected) ||
			!strings.Contains(got.Error(), "give each follower its own ID") {
			t.Errorf("%v: carried as %v", sentinel, got)
		}
	}
}
