package main

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/oncewal/oncewal/internal/pki"
)

// TestRealProcessesForgedFollowerID: gencerts issues certificates for
// followers f1 and f2; a leader registering both runs as a real process. A
// follower run as --id f2 with f1's (valid) certificate is refused: it
// exits 1 (--stop-on-refusal) with a log line giving the reason and the
// remedy, and the leader's log says why it refused it. f2 with its own
// certificate is then served. (A client's certificate posing as a
// follower: TestForgedFollowerIDRefused in grpctransport.) Short: part of
// every go test run.
func TestRealProcessesForgedFollowerID(t *testing.T) {
	rp := newRealProcs(t, "f1", "f2")
	dir := rp.dir
	ld := &proc{name: "leader", log: filepath.Join(dir, "leader.log"), args: []string{"leader",
		"--dir", filepath.Join(dir, "leader"), "--shards", "1", "--followers", "f1,f2",
		"--listen", fmt.Sprintf("127.0.0.1:%d", rp.port),
		"--tls-ca", rp.cert(pki.FileCA), "--tls-cert", rp.cert(pki.FileLeader), "--tls-key", rp.cert(pki.FileLeaderKey),
		"--stats-interval", "100ms"}}
	follower := func(name, id string, tlsFlags []string, extra ...string) *proc {
		return &proc{name: name, log: filepath.Join(dir, name+".log"), args: append(append([]string{"follower",
			"--dir", filepath.Join(dir, name), "--shards", "1", "--id", id, "--leader", fmt.Sprintf("localhost:%d", rp.port),
			"--stats-interval", "1h"}, tlsFlags...), extra...)}
	}
	forged := follower("forged", "f2", rp.followerTLS("f1"), "--stop-on-refusal")
	real := follower("f2", "f2", rp.followerTLS("f2"))
	reapProcs(t, []*proc{ld, forged, real})
	ld.start(t, rp.bin)

	forged.start(t, rp.bin)
	select {
	case err := <-forged.done:
		if code := exitCode(err); code != exitFailure {
			t.Fatalf("the forged follower exited %v, want exit %d", err, exitFailure)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("the forged follower still runs after 2 minutes")
	}
	flog := readFile(t, forged.log)
	for _, want := range []string{"the leader refused this follower", "certificate names follower f1, hello says f2",
		"reason=identity_mismatch", "give this follower the certificate issued for --id f2"} {
		if !strings.Contains(flog, want) {
			t.Errorf("the forged follower's log does not say %q:\n%s", want, flog)
		}
	}
	waitUntil(t, "the leader's log line for the refusal", func() bool {
		l := readFile(t, ld.log)
		return strings.Contains(l, "refused a follower whose certificate does not name its ID") &&
			strings.Contains(l, "follower=f2") && strings.Contains(l, "hello says f2")
	})

	real.start(t, rp.bin)
	waitUntil(t, "f2 with its own certificate to be served", func() bool {
		return strings.Contains(readFile(t, ld.log), "follower=f2 connected=true")
	})
	if l := readFile(t, real.log); strings.Contains(l, "the leader refused this follower") {
		t.Errorf("f2 with its own certificate was refused:\n%s", l)
	}
	for _, p := range []*proc{real, ld} {
		if err := p.stop(t); err != nil {
			t.Errorf("%s: %v", p.name, err)
		}
	}
}
