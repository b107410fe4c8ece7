package main

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/oncewal/oncewal/store"

	"github.com/oncewal/oncewal/internal/pki"
	"github.com/oncewal/oncewal/leader"
	"github.com/oncewal/oncewal/session"
)

// TestRealProcessesPromotionRecipe runs the README's two-follower promotion
// recipe with the built binary, as an operator would: a leader of two
// shards and followers f1 and f2; f2 stops, the leader goes on (f1
// acknowledges), the leader is SIGKILLed; inspect names f1 the most
// advanced; promote f1 with f2 as its peer; a leader on f1; f2 started
// again as it was — no copy by hand: the new leader refuses it (its log
// starts after f2's position) and f2 rebuilds from the new leader's
// snapshot. At the end every request acknowledged to a client before the
// failover is in the promoted history, and f1 and f2 both equal the oracle
// of that history: the old log up to the promoted positions, then the new
// leader's log.
func TestRealProcessesPromotionRecipe(t *testing.T) {
	rp := newRealProcs(t, "f1", "f2")
	dir := rp.dir
	addr := fmt.Sprintf("127.0.0.1:%d", rp.port)
	tlsLeader := []string{"--tls-ca", rp.cert(pki.FileCA), "--tls-cert", rp.cert(pki.FileLeader), "--tls-key", rp.cert(pki.FileLeaderKey)}
	oldLeader, f1Dir, f2Dir := filepath.Join(dir, "n0"), filepath.Join(dir, "f1"), filepath.Join(dir, "f2")
	ackLog := filepath.Join(dir, "acked")
	leaderArgs := func(ldir, followers string, rate int) []string {
		args := append([]string{"leader", "--dir", ldir, "--shards", "2", "--followers", followers, "--listen", addr,
			"--generate", strconv.Itoa(rate), "--sessions", "20", "--batch", "16", "--retry-rate", "0.05",
			"--ack", "one", "--stats-interval", "200ms"}, tlsLeader...)
		if rate > 0 && ldir == oldLeader {
			args = append(args, "--ack-log", ackLog)
		}
		return args
	}
	followerProc := func(id, fdir string) *proc {
		return &proc{name: id, log: filepath.Join(dir, id+".log"), args: append([]string{"follower", "--dir", fdir, "--shards", "2",
			"--id", id, "--leader", fmt.Sprintf("localhost:%d", rp.port), "--stats-interval", "100ms"}, rp.followerTLS(id)...)}
	}
	ld := &proc{name: "leader", args: leaderArgs(oldLeader, "f1,f2", 1000), log: filepath.Join(dir, "leader.log")}
	f1, f2 := followerProc("f1", f1Dir), followerProc("f2", f2Dir)
	all := []*proc{ld, f1, f2}
	reapProcs(t, all)
	waitFor := func(what string, cond func() bool) { t.Helper(); waitUntil(t, what, cond) }
	applied := func(p *proc) map[uint64]uint64 { return lastApplied(readFile(t, p.log)) }
	runOK := func(args ...string) string {
		t.Helper()
		out, e, err := rp.run(args...)
		if err != nil {
			t.Fatalf("oncewal %s: %v\n%s%s", strings.Join(args, " "), err, out, e)
		}
		return out
	}

	for _, p := range all {
		p.start(t, rp.bin)
	}
	waitFor("both followers to apply", func() bool {
		a1, a2 := applied(f1), applied(f2)
		return a1[0] > 50 && a1[1] > 50 && a2[0] > 50 && a2[1] > 50
	})
	if err := f2.stop(t); err != nil {
		t.Fatalf("f2: clean stop: %v", err)
	}
	behind := applied(f2)
	waitFor("f1 to go past f2", func() bool {
		a1 := applied(f1)
		return a1[0] > behind[0]+100 && a1[1] > behind[1]+100
	})
	ld.kill(t)
	if err := f1.stop(t); err != nil {
		t.Fatalf("f1: clean stop: %v", err)
	}

	// The recipe: inspect, promote, the leader on f1, f2 as it was.
	var pos positions
	must(t, json.Unmarshal([]byte(runOK("inspect", "--json", f1Dir, f2Dir)), &pos))
	if pos.MostAdvanced != f1Dir {
		t.Fatalf("inspect names %q the most advanced, want %s", pos.MostAdvanced, f1Dir)
	}
	promoted := []uint64{0, 0}
	for _, s := range pos.Stores {
		if s.Dir == store.ShardDir(f1Dir, *s.Shard) {
			promoted[*s.Shard] = s.AppliedLSN
		}
	}
	out := runOK("promote", "--dir", f1Dir, "--peers", f2Dir)
	if !strings.Contains(out, "at epoch 2") {
		t.Fatalf("promote: %s", out)
	}
	ld = &proc{name: "leader2", args: leaderArgs(f1Dir, "f2", 1000), log: filepath.Join(dir, "leader2.log")}
	f2.args = followerProc("f2", f2Dir).args
	all = append(all, ld)
	reapProcs(t, []*proc{ld})
	ld.start(t, rp.bin)
	f2.start(t, rp.bin)
	waitFor("f2 to be rebuilt and to apply the new leader's log", func() bool {
		a2 := applied(f2)
		return a2[0] > promoted[0]+20 && a2[1] > promoted[1]+20
	})
	if !strings.Contains(readFile(t, f2.log), "rebuil") {
		t.Fatalf("f2 went on without a rebuild:\n%s", readFile(t, f2.log))
	}
	// The new leader stops generating; f2 catches up with its log's end.
	ld.kill(t)
	ld.args = leaderArgs(f1Dir, "f2", 0)
	served := strings.Count(readFile(t, ld.log), "oncewal leader: serving")
	ld.start(t, rp.bin)
	waitFor("the serving-only leader", func() bool {
		return strings.Count(readFile(t, ld.log), "oncewal leader: serving") > served
	})
	newLog := runOK("waldump", "--json", filepath.Join(f1Dir, leader.WALDirName))
	ends := append([]uint64(nil), promoted...)
	eachEvent(t, newLog, func(ev eventJSON) { ends[ev.Shard] = max(ends[ev.Shard], ev.LSN) })
	waitFor("f2 to catch up", func() bool {
		a2 := applied(f2)
		return a2[0] >= ends[0] && a2[1] >= ends[1]
	})
	for _, p := range []*proc{ld, f2} {
		if err := p.stop(t); err != nil {
			t.Fatalf("%s: clean stop: %v", p.name, err)
		}
	}

	// Every request acknowledged before the failover is in the promoted
	// history (--ack one with f2 stopped: f1 acknowledged them).
	oldLog := runOK("waldump", "--json", filepath.Join(oldLeader, leader.WALDirName))
	at := map[string]eventJSON{}
	eachEvent(t, oldLog, func(ev eventJSON) {
		// A retried request is logged again under the same key (the
		// followers' window drops the copy): where it took effect is its
		// first logging, not a later copy the promoted history may lack.
		if ev.Idem == nil {
			return
		}
		if _, seen := at[*ev.Idem]; !seen {
			at[*ev.Idem] = ev
		}
	})
	acked := ackedKeys(t, ackLog)
	for _, key := range acked {
		ev, ok := at[key]
		if !ok || ev.LSN > promoted[ev.Shard] {
			t.Fatalf("request %s was acknowledged (shard %d, LSN %d) but is not in the promoted history (ends at %v)",
				key, ev.Shard, ev.LSN, promoted)
		}
	}

	o := newWALOracle()
	o.feed(t, oldLog, promoted)
	o.feed(t, newLog, nil)
	router, _ := leader.NewShardRouter(2)
	for s := range uint32(2) {
		of := func(id session.ID) bool { return router.Shard(id) == s }
		for _, d := range []string{f1Dir, f2Dir} {
			o.check(t, d, runOK("inspect", "--json", store.ShardDir(d, s)), of)
		}
	}
	t.Logf("promoted at %v, the new log ends at %v; all %d acknowledged requests survived", promoted, ends, len(acked))
}
