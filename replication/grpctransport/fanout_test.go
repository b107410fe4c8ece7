package grpctransport

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/oncewal/oncewal/internal/drill"
	"github.com/oncewal/oncewal/internal/leaderhook"
	"github.com/oncewal/oncewal/store"

	"github.com/oncewal/oncewal/leader"

	"github.com/oncewal/oncewal/follower"
	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/sim"
	"github.com/oncewal/oncewal/wal"
)

// feedingLeader is a leader of one shard whose appends reach the Fanout's
// cache through Appended, as a leader's append hook delivers them.
type feedingLeader struct {
	w      *wal.Writer
	r      *wal.Reader
	fo     *leader.Fanout
	notify chan struct{}
}

func (l *feedingLeader) append(t testing.TB, evs []wal.Event) wal.Header {
	t.Helper()
	h, err := l.w.Append(1, evs)
	if err != nil {
		t.Fatal(err)
	}
	_, raw, err := l.r.Next() // the batch as it was written, for Appended
	if err != nil {
		t.Fatal(err)
	}
	l.fo.Appended(h, raw)
	return h
}

// TestFanoutOverMTLS: two named followers of one shard behind one gRPC
// server with mutual TLS. Follower b restarts (clean and killed) while a
// streams on; an unregistered follower is refused. a is served on exactly
// one connection, both end equal to the oracle, and a, at the tail, never
// reads the WAL.
func TestFanoutOverMTLS(t *testing.T) {
	checkGoroutines(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	log, rec := newLogRecorder()
	srv, _ := mtls(t, log)
	dir := t.TempDir()
	walDir := filepath.Join(dir, "wal")
	w, err := wal.OpenWriter(walDir, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	r, err := wal.OpenReader(walDir, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	fo, err := leader.NewFanout(&leader.FanoutOptions{
		ShipperOptions: leader.ShipperOptions{
			WALDir: walDir, Listener: srv, DurableLSN: w.DurableLSN, Epoch: func() uint64 { return 1 },
			RetransmitTimeout: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond, PollInterval: time.Millisecond,
			Logger: log,
		},
		Followers: []string{"a", "b"},
	})
	if err != nil {
		t.Fatal(err)
	}
	feed := &feedingLeader{w: w, r: r, fo: fo}
	runCtx, stopRun := context.WithCancel(ctx)
	runDone := make(chan error, 1)
	go func() { runDone <- fo.Run(runCtx) }()

	open := func(id string) *follower.Follower {
		f, err := follower.Open(filepath.Join(dir, id), &follower.Options{Store: store.Options{ID: id, Logger: quietLogger()}})
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	// Each follower dials with the certificate naming its ID.
	dialers := map[string]*Dialer{"a": followerDialer(t, srv, "a", log), "b": followerDialer(t, srv, "b", log)}
	serve := func(f *follower.Follower, id string) chan error {
		done := make(chan error, 1)
		go func() { done <- f.Serve(ctx, dialers[id]) }()
		return done
	}
	wl := recorded(t, sim.WorkloadOptions{Seed: 7, Sessions: 8, Requests: 3000, RetryRate: 0.05, BatchSize: 32})
	batches := wl.Shards[0]
	// The cache is fed before anyone connects: from then on a follower at
	// the tail finds every batch there.
	last := feed.append(t, batches[0]).LastLSN()
	batches = batches[1:]
	fa, fb := open("a"), open("b")
	aDone, bDone := serve(fa, "a"), serve(fb, "b")

	third := len(batches) / 3
	waitAll := func(lsn uint64) {
		t.Helper()
		wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
		defer wcancel()
		if err := leaderhook.WaitAcked(fo, wctx, lsn); err != nil {
			t.Fatalf("WaitAcked(%d): %v; %+v", lsn, err, fo.Stats())
		}
	}
	for i, evs := range batches {
		last = feed.append(t, evs).LastLSN()
		switch i {
		case third, 2 * third:
			// b goes down (cleanly, then killed) and comes back while a
			// keeps streaming.
			if i == third {
				if err := fb.Close(); err != nil {
					t.Fatal(err)
				}
			} else if err := drill.Kill(fb); err != nil {
				t.Fatal(err)
			}
			if err := <-bDone; err != nil {
				t.Fatal(err)
			}
			fb = open("b")
			bDone = serve(fb, "b")
		case third + 10:
			// A follower nobody registered is refused.
			c, err := followerDialer(t, srv, "stranger", log).Dial(ctx, replication.Ack{FollowerID: "stranger"})
			if err == nil {
				_, err = c.Recv(ctx)
				c.Close()
			}
			// Refused with the Fanout's reason, which reaches the follower.
			if !errors.Is(err, replication.ErrDisconnected) || !errors.Is(err, ErrRefused) ||
				!strings.Contains(err.Error(), "unknown follower") {
				t.Fatalf("unregistered follower: %v", err)
			}
		}
		if i%50 == 0 {
			waitAll(last) // paced like a leader that waits for its followers
		}
	}
	waitAll(last)
	st := fo.Stats()
	stopRun()
	if err := <-runDone; err != nil {
		t.Fatal(err)
	}
	for _, f := range []*follower.Follower{fa, fb} {
		if lsn, _ := f.Position(); lsn != last {
			t.Fatalf("follower at %d, log ends at %d", lsn, last)
		}
		if err := wl.Oracle.Verify(f.State()); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if err := <-aDone; err != nil {
		t.Fatal(err)
	}
	if err := <-bDone; err != nil {
		t.Fatal(err)
	}
	a, b := st.Followers[0], st.Followers[1]
	if a.ID != "a" || a.Connections != 1 || a.DiskReads != 0 || a.AckedLSN != last || a.LagEvents != 0 {
		t.Fatalf("a %+v", a)
	}
	if b.ID != "b" || b.Connections < 3 || b.AckedLSN != last {
		t.Fatalf("b %+v", b)
	}
	if st.Refused.UnknownFollower != 1 || st.Refused.Total() != 1 {
		t.Fatalf("refusals %+v", st.Refused)
	}
	if _, ok := rec.find("stranger", "unknown follower"); !ok {
		t.Errorf("no log line for the refusal: %q", rec.Lines())
	}
	t.Logf("a: %d batches sent, %d from disk; b: %d connections, %d batches sent (%d resent), %d from disk; cache %+v",
		a.BatchesSent, a.DiskReads, b.Connections, b.BatchesSent, b.BatchesResent, b.DiskReads, st.Cache)
}
