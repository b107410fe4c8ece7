package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/oncewal/oncewal/internal/pki"
)

// freeAddr is a loopback host:port nobody listens on now.
func freeAddr(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	defer lis.Close()
	return lis.Addr().String()
}

// waitProcLog waits (at most limit) for a line of p's output holding every
// part, and returns it.
func waitProcLog(t *testing.T, p *proc, limit time.Duration, parts ...string) string {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		for _, line := range strings.Split(readFile(t, p.log), "\n") {
			ok := true
			for _, part := range parts {
				ok = ok && strings.Contains(line, part)
			}
			if ok {
				return line
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: no line with %q within %v", p.name, parts, limit)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitHTTP polls url until it answers code (a refused connection counts as
// not yet: the process may still be starting), for at most limit, and
// returns the body.
func waitHTTP(t *testing.T, what, url string, code int, limit time.Duration) string {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		got, body := 0, ""
		if resp, err := http.Get(url); err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			got, body = resp.StatusCode, string(b)
		} else {
			body = err.Error()
		}
		if got == code {
			return body
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s %s: %d %s, want %d", what, url, got, body, code)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestRealProcessOperator runs the built binary as an operator would, for
// what operators see (issue 24):
//
//   - a usage error prints the error and one line pointing at -h (exit 2,
//     nothing created), while -h prints the whole help (exit 0);
//   - a second follower process started with the --id of a live one is
//     refused and says why (Error line with the remedy, the leader counts
//     duplicate_follower) while the first keeps its one connection: no
//     flapping; the first, killed with SIGKILL and restarted, gets its
//     stream back and is ready;
//   - a follower's /readyz turns 503 within --leader-timeout of its leader
//     being frozen with SIGSTOP, naming why, and 200 again after SIGCONT.
func TestRealProcessOperator(t *testing.T) {
	rp := newRealProcs(t, "f1")
	dir, cert := rp.dir, rp.cert

	// Usage errors.
	target := filepath.Join(dir, "never")
	_, e, err := rp.run("follower", "--dir", target, "--id", "f1", "--leader", "127.0.0.1:1", "--insecure", "--no-such-flag")
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != exitUsage ||
		e != "oncewal follower: flag provided but not defined: -no-such-flag\nrun 'oncewal follower -h' for the flags\n" {
		t.Fatalf("bad flag: %v, stderr %q", err, e)
	}
	_, e, err = rp.run("leader", "--dir", target, "--followers", "f1", "--insecure", "--listen", "127.0.0.1:0", "--shards", "0")
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != exitUsage || strings.Count(e, "\n") != 2 ||
		!strings.HasSuffix(e, "run 'oncewal leader -h' for the flags\n") || strings.Contains(e, "usage:") {
		t.Fatalf("bad value: %v, stderr %q", err, e)
	}
	out, e, err := rp.run("follower", "-h")
	if err != nil || e != "" || !strings.HasPrefix(out, "usage: oncewal follower") || !strings.Contains(out, "-leader-timeout") {
		t.Fatalf("-h: %v, stderr %q, stdout:\n%s", err, e, out)
	}
	if _, err := os.Stat(target); !os.IsNotExist(err) {
		t.Fatalf("a usage error created %s", target)
	}

	listen := fmt.Sprintf("127.0.0.1:%d", rp.port)
	ld := &proc{name: "leader", log: filepath.Join(dir, "leader.log"), args: []string{"leader",
		"--dir", filepath.Join(dir, "leader"), "--shards", "1", "--followers", "f1", "--listen", listen,
		"--tls-ca", cert(pki.FileCA), "--tls-cert", cert(pki.FileLeader), "--tls-key", cert(pki.FileLeaderKey),
		"--stats-interval", "200ms"}}
	metricsA := freeAddr(t)
	followerArgs := func(name, metrics string) []string {
		return append([]string{"follower", "--dir", filepath.Join(dir, name), "--id", "f1", "--leader", fmt.Sprintf("localhost:%d", rp.port),
			"--metrics-addr", metrics, "--leader-timeout", "2500ms", "--stats-interval", "1h"}, rp.followerTLS("f1")...)
	}
	a := &proc{name: "a", log: filepath.Join(dir, "a.log"), args: followerArgs("a", metricsA)}
	b := &proc{name: "b", log: filepath.Join(dir, "b.log"), args: followerArgs("b", freeAddr(t))}
	reapProcs(t, []*proc{ld, a, b})
	ld.start(t, rp.bin)
	waitProcLog(t, ld, time.Minute, "oncewal leader: serving")
	a.start(t, rp.bin)
	readyz := "http://" + metricsA + "/readyz"
	waitHTTP(t, "a, connected", readyz, http.StatusOK, 30*time.Second)

	// A second process with a's --id: refused, told why, and a keeps its
	// stream.
	b.start(t, rp.bin)
	line := waitProcLog(t, b, 30*time.Second, "level=ERROR", "the leader refused this follower; retrying in", "reason=duplicate_follower")
	for _, want := range []string{`remedy="another process is using --id f1; give each follower its own --id"`,
		`\"f1\" is already connected from 127.0.0.1:`} {
		if !strings.Contains(line, want) {
			t.Fatalf("b's refusal line lacks %q:\n%s", want, line)
		}
	}
	waitProcLog(t, ld, 10*time.Second, "level=WARN", "refused a follower", "follower=f1", `reason="duplicate follower"`)
	// b keeps trying (at its backoff) and keeps being refused; a is never
	// disturbed: one connection, ready, nothing in its log about it.
	waitProcLog(t, ld, 15*time.Second, "oncewal leader: follower", "follower=f1", "connections=1", "refused_duplicate=3")
	if code, body := get(t, readyz); code != http.StatusOK {
		t.Fatalf("a after b's attempts: %d %s", code, body)
	}
	if l := readFile(t, a.log); strings.Contains(l, "refused") || strings.Contains(l, "replaces") {
		t.Fatalf("a was disturbed:\n%s", l)
	}
	if err := b.stop(t); err != nil {
		t.Fatalf("b: %v", err)
	}

	// a is killed and restarted: it gets its stream back and is ready.
	a.kill(t)
	a.start(t, rp.bin)
	waitHTTP(t, "a, restarted", readyz, http.StatusOK, 30*time.Second)

	// The leader is frozen: a is not ready within --leader-timeout (plus
	// a heartbeat and scheduling slack), saying why; then ready again.
	must(t, ld.cmd.Process.Signal(syscall.SIGSTOP))
	stopped := time.Now()
	body := waitHTTP(t, "a, leader stopped", readyz, http.StatusServiceUnavailable, 10*time.Second)
	if !strings.HasPrefix(body, "not ready: shard 0: not connected to the leader: replication: the leader sent nothing for") ||
		strings.Count(body, "not ready") != 1 {
		t.Fatalf("/readyz with the leader stopped (after %v): %q", time.Since(stopped), body)
	}
	// The follower counts the silence from the last message, which came up
	// to a heartbeat interval (more on a loaded machine) before SIGSTOP:
	// what must hold is that the silence it reports reached the timeout.
	silence := strings.TrimPrefix(body, "not ready: shard 0: not connected to the leader: replication: the leader sent nothing for ")
	if d, err := time.ParseDuration(strings.Fields(silence)[0]); err != nil || d < 2500*time.Millisecond {
		t.Fatalf("not ready after a silence of %q (%v), below --leader-timeout 2.5s: %q", strings.Fields(silence)[0], err, body)
	}
	waitProcLog(t, a, 5*time.Second, "level=WARN", "dropped the connection to a silent leader")
	must(t, ld.cmd.Process.Signal(syscall.SIGCONT))
	waitHTTP(t, "a, leader resumed", readyz, http.StatusOK, 30*time.Second)
}
