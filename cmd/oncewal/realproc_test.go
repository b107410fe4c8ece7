package main

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/oncewal/oncewal/store"

	"github.com/oncewal/oncewal/internal/pki"
	"github.com/oncewal/oncewal/leader"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/wal"
)

// proc is one oncewal process of the real-process test.
type proc struct {
	name string
	args []string
	log  string // stderr and stdout, appended across restarts
	cmd  *exec.Cmd
	done chan error
}

func (p *proc) start(t *testing.T, bin string) {
	t.Helper()
	f, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(f, "=== start %s %s\n", p.name, time.Now().Format(time.RFC3339Nano))
	p.cmd = exec.Command(bin, p.args...)
	p.cmd.Stdout, p.cmd.Stderr = f, f
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p.done = make(chan error, 1)
	go func() { p.done <- p.cmd.Wait(); f.Close() }()
}

// kill sends SIGKILL and waits for the process to be gone.
func (p *proc) kill(t *testing.T) {
	t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// stop sends SIGTERM (a clean stop) and returns the exit error.
func (p *proc) stop(t *testing.T) error {
	t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.done:
		return err
	case <-time.After(60 * time.Second):
		t.Fatalf("%s did not stop on SIGTERM in 60s", p.name)
		return nil
	}
}

// reapProcs makes the end of the test SIGKILL every process of all still
// running and, if the test failed, log the tail of each one's output.
func reapProcs(t *testing.T, all []*proc) {
	t.Cleanup(func() {
		for _, p := range all {
			if p.cmd != nil && p.cmd.ProcessState == nil {
				_ = p.cmd.Process.Signal(syscall.SIGKILL)
				<-p.done
			}
		}
		if t.Failed() {
			for _, p := range all {
				b, _ := os.ReadFile(p.log)
				if len(b) > 20000 {
					b = b[len(b)-20000:]
				}
				t.Logf("--- %s (tail):\n%s", p.name, b)
			}
		}
	})
}

// realProcs is the setup of a real-process test: the oncewal binary built
// into a temporary directory, gencerts' certificates (the leader's and, for
// each follower ID newRealProcs was given, that follower's), a free port.
type realProcs struct {
	dir, bin string
	port     int
}

func newRealProcs(t *testing.T, followers ...string) *realProcs {
	t.Helper()
	rp := &realProcs{dir: t.TempDir()}
	rp.bin = filepath.Join(rp.dir, "oncewal")
	build := exec.Command("go", "build", "-o", rp.bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	if _, e, err := rp.run("gencerts", filepath.Join(rp.dir, "certs"), "--followers", strings.Join(followers, ",")); err != nil {
		t.Fatalf("gencerts: %v %s", err, e)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	rp.port = lis.Addr().(*net.TCPAddr).Port
	lis.Close()
	return rp
}

// startLeader starts `oncewal leader` of shards shards, with follower f1
// registered (none need run: ack leader answers), on rp.port under the
// certificates of gencerts' CA in rp, after adding a client certificate
// for each of clients with that CA; it waits until the leader serves.
func (rp *realProcs) startLeader(t *testing.T, shards int, clients ...string) *proc {
	t.Helper()
	if len(clients) > 0 {
		if _, e, err := rp.run("gencerts", filepath.Join(rp.dir, "certs"), "--clients", strings.Join(clients, ",")); err != nil {
			t.Fatalf("gencerts --clients %s: %v %s", strings.Join(clients, ","), err, e)
		}
	}
	ld := &proc{name: "leader", log: filepath.Join(rp.dir, "leader.log"), args: []string{"leader",
		"--dir", filepath.Join(rp.dir, "leader"), "--shards", fmt.Sprint(shards), "--followers", "f1",
		"--listen", fmt.Sprintf("127.0.0.1:%d", rp.port),
		"--tls-ca", rp.cert(pki.FileCA), "--tls-cert", rp.cert(pki.FileLeader), "--tls-key", rp.cert(pki.FileLeaderKey)}}
	reapProcs(t, []*proc{ld})
	ld.start(t, rp.bin)
	waitUntil(t, "the leader to serve", func() bool { return strings.Contains(readFile(t, ld.log), "oncewal leader: serving") })
	return ld
}

// run runs the binary to its end: stdout, stderr, the exit error.
func (rp *realProcs) run(args ...string) (string, string, error) {
	var o, e strings.Builder
	c := exec.Command(rp.bin, args...)
	c.Stdout, c.Stderr = &o, &e
	err := c.Run()
	return o.String(), e.String(), err
}

// cert is the path of one of gencerts' files.
func (rp *realProcs) cert(name string) string { return filepath.Join(rp.dir, "certs", name) }

// followerTLS are the TLS flags of follower id: the CA and the certificate
// gencerts issued for id.
func (rp *realProcs) followerTLS(id string) []string {
	cert, key := pki.FollowerFiles(id)
	return []string{"--tls-ca", rp.cert(pki.FileCA), "--tls-cert", rp.cert(cert), "--tls-key", rp.cert(key)}
}

// realProcKills is the number of kills of a real-process test: long under
// ONCEWAL_LONG=1, a short run otherwise (CI runs every real-process test in
// its short form, so no change lands untested against the real binary);
// ONCEWAL_KILLS sets it.
func realProcKills(t *testing.T, long, short int) int {
	t.Helper()
	if s := os.Getenv("ONCEWAL_KILLS"); s != "" {
		v, err := strconv.Atoi(s)
		must(t, err)
		return v
	}
	if os.Getenv("ONCEWAL_LONG") != "" {
		return long
	}
	return short
}

// realProcSeed is a real-process test's schedule seed: ONCEWAL_SEED, or the
// clock.
func realProcSeed(t *testing.T) uint64 {
	t.Helper()
	if s := os.Getenv("ONCEWAL_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		must(t, err)
		return v
	}
	return uint64(time.Now().UnixNano())
}

// TestRealProcessesKilled runs the built oncewal binary as
// separate processes over mutual TLS on 127.0.0.1: a leader of two shards
// generating a workload with retried requests and majority acks from four
// concurrent clients (--clients 4: appends share the WAL's sync), and three
// follower nodes. It SIGKILLs followers and the leader at random moments,
// many times, restarting each; checks that a second leader on the live
// directory exits 1 at once naming it; then lets the followers catch up
// with a serving-only leader, stops everything cleanly and checks every
// follower store, and the leader's own, against the oracle of the leader's
// WAL (oncewal waldump --json, oncewal inspect --json). ONCEWAL_SEED
// replays a run; ONCEWAL_KILLS sets the number of kills (default 8; 40 with
// ONCEWAL_LONG=1).
func TestRealProcessesKilled(t *testing.T) {
	seed, kills := realProcSeed(t), realProcKills(t, 40, 8)
	t.Logf("seed %d (ONCEWAL_SEED=%d replays the schedule), %d kills", seed, seed, kills)
	rng := rand.New(rand.NewPCG(seed, 11))

	rp := newRealProcs(t, "f1", "f2", "f3")
	dir, bin, run, cert, port := rp.dir, rp.bin, rp.run, rp.cert, rp.port

	ids := []string{"f1", "f2", "f3"}
	leaderDir := filepath.Join(dir, "leader")
	ackLog := filepath.Join(dir, "acked")
	leaderArgs := func(rate int) []string {
		args := []string{"leader", "--dir", leaderDir, "--shards", "2", "--followers", strings.Join(ids, ","),
			"--listen", fmt.Sprintf("127.0.0.1:%d", port),
			"--tls-ca", cert(pki.FileCA), "--tls-cert", cert(pki.FileLeader), "--tls-key", cert(pki.FileLeaderKey),
			"--generate", strconv.Itoa(rate), "--sessions", "30", "--clients", "4", "--batch", "64", "--retry-rate", "0.03",
			"--ack", "majority", "--stats-interval", "500ms"}
		if rate > 0 {
			// Every request a client was told is done (a majority
			// acknowledged it), for the check at the end.
			args = append(args, "--ack-log", ackLog)
		}
		return args
	}
	ld := &proc{name: "leader", args: leaderArgs(2000), log: filepath.Join(dir, "leader.log")}
	fs := map[string]*proc{}
	for _, id := range ids {
		fs[id] = &proc{name: id, log: filepath.Join(dir, id+".log"), args: append([]string{"follower",
			"--dir", filepath.Join(dir, id), "--shards", "2", "--id", id, "--leader", fmt.Sprintf("localhost:%d", port),
			"--stats-interval", "100ms"}, rp.followerTLS(id)...)}
	}
	all := []*proc{ld, fs["f1"], fs["f2"], fs["f3"]}
	reapProcs(t, all)
	for _, p := range all {
		p.start(t, bin)
	}
	waitFor := func(what string, cond func() bool) { t.Helper(); waitUntil(t, what, cond) }
	waitFor("the leader to serve", func() bool { return strings.Contains(readFile(t, ld.log), "oncewal leader: serving") })
	if !strings.Contains(readFile(t, ld.log), " clients=4 ") {
		t.Fatalf("the leader does not run 4 generator clients:\n%s", readFile(t, ld.log))
	}

	// A second leader on the live directory: exit 1 at once, naming it.
	start := time.Now()
	_, e, err := run(append(leaderArgs(0), "--listen", "127.0.0.1:0")...)
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != exitFailure || time.Since(start) > 10*time.Second ||
		!strings.Contains(e, filepath.Join(leaderDir, leader.LockFileName)) || !strings.Contains(e, wal.ErrLocked.Error()) {
		t.Fatalf("second leader: %v after %v:\n%s", err, time.Since(start), e)
	}

	leaderKills := 0
	for i := range kills {
		time.Sleep(time.Duration(100+rng.IntN(700)) * time.Millisecond)
		var p *proc
		if rng.IntN(4) == 0 {
			p, leaderKills = ld, leaderKills+1
		} else {
			p = fs[ids[rng.IntN(len(ids))]]
		}
		p.kill(t)
		time.Sleep(time.Duration(rng.IntN(300)) * time.Millisecond)
		p.start(t, bin)
		if i%10 == 9 {
			t.Logf("%d kills (%d of the leader)", i+1, leaderKills)
		}
	}
	// The leader dies once more and comes back serving only: the log stops
	// growing, and every follower catches up with it.
	ld.kill(t)
	ld.args = leaderArgs(0)
	served := strings.Count(readFile(t, ld.log), "oncewal leader: serving")
	ld.start(t, bin)
	waitFor("the serving-only leader", func() bool {
		return strings.Count(readFile(t, ld.log), "oncewal leader: serving") > served
	})
	ends := []uint64{0, 0}
	dumped, e, err := run("waldump", "--json", filepath.Join(leaderDir, leader.WALDirName))
	if err != nil {
		t.Fatalf("waldump: %v %s", err, e)
	}
	logged := map[string]bool{} // client keys in the leader's WAL
	eachEvent(t, dumped, func(ev eventJSON) {
		ends[ev.Shard] = max(ends[ev.Shard], ev.LSN)
		if ev.Idem != nil {
			logged[*ev.Idem] = true
		}
	})
	// Nothing acknowledged to a client is lost, however often the leader
	// was killed: each key in the ack log is in the WAL the followers
	// match below.
	acked := ackedKeys(t, ackLog)
	for _, key := range acked {
		if !logged[key] {
			t.Fatalf("request %s was acknowledged to its client but is not in the leader's WAL", key)
		}
	}
	for _, id := range ids {
		waitFor(id+" to catch up", func() bool {
			got := lastApplied(readFile(t, fs[id].log))
			return got[0] >= ends[0] && got[1] >= ends[1]
		})
	}
	for _, p := range all {
		if err := p.stop(t); err != nil {
			t.Fatalf("%s: clean stop: %v", p.name, err)
		}
	}

	o := newWALOracle()
	events, retried := o.feed(t, dumped, nil)
	if retried == 0 {
		t.Errorf("no retried request in %d events", events)
	}
	router, _ := leader.NewShardRouter(2)
	inspectBin := func(d string) string {
		out, e, err := run("inspect", "--json", d)
		if err != nil {
			t.Fatalf("inspect %s: %v %s", d, err, e)
		}
		return out
	}
	for s := range uint32(2) {
		of := func(id session.ID) bool { return router.Shard(id) == s }
		o.check(t, "leader", inspectBin(store.ShardDir(leaderDir, s)), of)
		for _, id := range ids {
			o.check(t, id, inspectBin(store.ShardDir(filepath.Join(dir, id), s)), of)
		}
	}
	out, e, err := run("inspect", "--json", filepath.Join(dir, "f1"), filepath.Join(dir, "f2"), filepath.Join(dir, "f3"))
	if err != nil {
		t.Fatalf("inspect: %v %s", err, e)
	}
	var p positions
	must(t, json.Unmarshal([]byte(out), &p))
	for _, s := range p.Stores {
		if !s.MostAdvanced || s.AppliedLSN != ends[*s.Shard] {
			t.Fatalf("after catching up: %s", out)
		}
	}
	t.Logf("%d events (%d retried requests), shards end at %v; %d kills, %d of the leader; all %d acknowledged requests in the WAL",
		events, retried, ends, kills, leaderKills, len(acked))
}

// waitUntil polls cond until it holds, failing the test after 2 minutes.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// eachEvent calls fn with every event of waldump --json output.
func eachEvent(t *testing.T, dump string, fn func(eventJSON)) {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(dump))
	for dec.More() {
		var ev eventJSON
		must(t, dec.Decode(&ev))
		fn(ev)
	}
}

// ackedKeys is the client keys, in hex, of every request the generator's
// --ack-log FILE says was acknowledged; a kill can cut its last write
// short. None at all fails the test: the check would prove nothing.
func ackedKeys(t *testing.T, path string) []string {
	t.Helper()
	b := []byte(readFile(t, path))
	b = b[:len(b)-len(b)%16]
	if len(b) == 0 {
		t.Fatal("the generator acknowledged no request")
	}
	var keys []string
	for ; len(b) > 0; b = b[16:] {
		keys = append(keys, hex.EncodeToString(b[:16]))
	}
	return keys
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return string(b)
}

var appliedLine = regexp.MustCompile(`oncewal follower: stats" shard=(\d+) applied_lsn=(\d+)`)

// lastApplied is each shard's applied LSN in the follower's last stats
// lines.
func lastApplied(log string) map[uint64]uint64 {
	out := map[uint64]uint64{}
	for _, m := range appliedLine.FindAllStringSubmatch(log, -1) {
		s, _ := strconv.ParseUint(m[1], 10, 32)
		v, _ := strconv.ParseUint(m[2], 10, 64)
		out[s] = v
	}
	return out
}
