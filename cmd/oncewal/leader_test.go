package main

import (
	"context"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oncewal/oncewal/follower"
	"github.com/oncewal/oncewal/replication/grpctransport"
)

// TestLeaderFollowerMTLS runs the leader and follower commands' bodies
// in-process on 127.0.0.1 with certificates from gencerts: the leader
// generates a workload, the follower replicates it; both stop on ctx (what
// SIGINT/SIGTERM does), and a reopened follower store resumes where it was.
func TestLeaderFollowerMTLS(t *testing.T) {
	dir := t.TempDir()
	certDir := filepath.Join(dir, "certs")
	out, errOut, code := runCmd(t, "gencerts", certDir)
	if code != exitOK {
		t.Fatalf("gencerts: %d %s", code, errOut)
	}
	if !strings.Contains(out, "oncewal follower") {
		t.Errorf("gencerts output: %s", out)
	}
	for _, k := range []string{grpctransport.FileCAKey, grpctransport.FileLeaderKey, grpctransport.FileFollowerKey} {
		fi, err := os.Stat(filepath.Join(certDir, k))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != fs.FileMode(0o600) {
			t.Errorf("%s mode %v, want 0600", k, fi.Mode().Perm())
		}
	}
	if _, _, code := runCmd(t, "gencerts", certDir); code != exitFailure {
		t.Errorf("gencerts over existing files: exit %d, want %d", code, exitFailure)
	}
	p := func(n string) string { return filepath.Join(certDir, n) }
	st, err := grpctransport.LoadServerTLS(p(grpctransport.FileCA), p(grpctransport.FileLeader), p(grpctransport.FileLeaderKey))
	if err != nil {
		t.Fatal(err)
	}
	ct, err := grpctransport.LoadClientTLS(p(grpctransport.FileCA), p(grpctransport.FileFollower), p(grpctransport.FileFollowerKey))
	if err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	leaderCtx, stopLeader := context.WithCancel(ctx)
	addrc := make(chan string, 1)
	var wg sync.WaitGroup
	var leaderErr error
	var leaderLog strings.Builder
	var mu sync.Mutex
	wg.Go(func() {
		leaderErr = serveLeader(leaderCtx, newLogger(&lockedWriter{w: &leaderLog, mu: &mu}, "text", slog.LevelInfo), leaderConfig{
			walDir: filepath.Join(dir, "leader"), listen: "127.0.0.1:0", tls: st,
			rate: 20_000, sessions: 20, batch: 128, statsEvery: 50 * time.Millisecond,
			ready: func(a string) { addrc <- a },
		})
	})
	addr := <-addrc
	addr = strings.Replace(addr, "127.0.0.1", "localhost", 1) // verified against the certificate's DNS SAN

	var fol *follower.Follower
	var fmu sync.Mutex
	followerCtx, stopFollower := context.WithCancel(ctx)
	ferr := make(chan error, 1)
	go func() {
		ferr <- serveFollower(followerCtx, newLogger(io.Discard, "text", slog.LevelInfo), followerConfig{
			dir: filepath.Join(dir, "follower"), leader: addr, tls: ct, statsEvery: 50 * time.Millisecond,
			opened: func(f *follower.Follower) { fmu.Lock(); fol = f; fmu.Unlock() },
		})
	}()
	var lsn uint64
	for lsn < 2000 {
		select {
		case <-ctx.Done():
			t.Fatalf("follower stuck at %d", lsn)
		case <-time.After(5 * time.Millisecond):
		}
		fmu.Lock()
		if fol != nil {
			lsn, _ = fol.Position()
		}
		fmu.Unlock()
	}
	stopFollower()
	if err := <-ferr; err != nil {
		t.Fatalf("follower: %v", err)
	}
	stopLeader()
	wg.Wait()
	if leaderErr != nil {
		t.Fatalf("leader: %v", leaderErr)
	}
	mu.Lock()
	ll := leaderLog.String()
	mu.Unlock()
	if !strings.Contains(ll, "oncewal leader: stats") || !strings.Contains(ll, "mtls=true") {
		t.Errorf("leader log lacks stats/mtls lines:\n%s", ll)
	}
	f, err := follower.Open(filepath.Join(dir, "follower"), &follower.Options{Logger: newLogger(io.Discard, "text", slog.LevelInfo)})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if got, _ := f.Position(); got < lsn {
		t.Fatalf("reopened follower at %d, had %d", got, lsn)
	}
}

func TestLeaderFollowerUsage(t *testing.T) {
	for _, args := range [][]string{
		{"leader"},               // no --wal
		{"leader", "--wal", "x"}, // neither TLS nor --insecure
		{"leader", "--wal", "x", "--insecure", "--tls-ca", "f"}, // both
		{"follower", "--dir", "x"},                              // no --leader
		{"follower", "--dir", "x", "--leader", "l"},             // no TLS
		{"gencerts"},
	} {
		if _, _, code := runCmd(t, args...); code != exitUsage {
			t.Errorf("%q: exit %d, want %d", args, code, exitUsage)
		}
	}
}

type lockedWriter struct {
	w  *strings.Builder
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
