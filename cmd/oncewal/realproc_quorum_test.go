package main

import (
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/oncewal/oncewal/internal/pki"
)

// TestRealProcessesQuorumLoss runs the built binary: a leader with two
// registered followers, both down, answers /readyz 503 naming the lost
// quorum and logs one WARN line saying so; with one follower up, the
// majority (the leader and one of two followers) is met: /readyz 200 and
// one INFO line that the quorum is back. Short: not behind ONCEWAL_LONG.
func TestRealProcessesQuorumLoss(t *testing.T) {
	rp := newRealProcs(t, "f1", "f2")
	dir, cert := rp.dir, rp.cert
	metricsAddr := freeAddr(t)
	ld := &proc{name: "leader", log: filepath.Join(dir, "leader.log"), args: []string{"leader",
		"--dir", filepath.Join(dir, "leader"), "--shards", "1", "--followers", "f1,f2",
		"--listen", fmt.Sprintf("127.0.0.1:%d", rp.port), "--metrics-addr", metricsAddr,
		"--tls-ca", cert(pki.FileCA), "--tls-cert", cert(pki.FileLeader), "--tls-key", cert(pki.FileLeaderKey),
		"--stats-interval", "1h"}}
	f1 := &proc{name: "f1", log: filepath.Join(dir, "f1.log"), args: append([]string{"follower",
		"--dir", filepath.Join(dir, "f1"), "--id", "f1", "--leader", fmt.Sprintf("localhost:%d", rp.port),
		"--stats-interval", "1h"}, rp.followerTLS("f1")...)}
	reapProcs(t, []*proc{ld, f1})
	ld.start(t, rp.bin)
	readyz := "http://" + metricsAddr + "/readyz"

	body := waitHTTP(t, "leader, both followers down", readyz, http.StatusServiceUnavailable, time.Minute)
	for _, want := range []string{"quorum lost", "shard 0: 0 of 2 followers connected, majority needs 1"} {
		if !strings.Contains(body, want) {
			t.Fatalf("/readyz body lacks %q: %s", want, body)
		}
	}
	waitProcLog(t, ld, 30*time.Second, "level=WARN", "oncewal leader: quorum lost", "0 of 2 followers connected")

	f1.start(t, rp.bin)
	waitHTTP(t, "leader, f1 up", readyz, http.StatusOK, time.Minute)
	waitProcLog(t, ld, 30*time.Second, "level=INFO", "oncewal leader: quorum back")
	if n := strings.Count(readFile(t, ld.log), "oncewal leader: quorum lost"); n != 1 {
		t.Fatalf("%d quorum-lost lines, want one (a transition, not a line per tick)", n)
	}
	if err := ld.stop(t); err != nil {
		t.Fatalf("leader stop: %v", err)
	}
}
