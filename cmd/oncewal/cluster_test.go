package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oncewal/oncewal/internal/pki"
	"github.com/oncewal/oncewal/leader"
	"github.com/oncewal/oncewal/replication/grpctransport"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/sim"
	"github.com/oncewal/oncewal/testutil"
	"github.com/oncewal/oncewal/wal"
)

// tlsPair is the leader's and the followers' TLS configuration from the
// certificates oncewal gencerts writes into dir for the follower IDs
// followers: client(id) is follower id's, which the leader serves only as
// id.
func tlsPair(t *testing.T, dir string, followers ...string) (server func() *tls.Config, client func(id string) *tls.Config) {
	t.Helper()
	if _, errOut, code := runCmd(t, "gencerts", dir, "--followers", strings.Join(followers, ",")); code != exitOK {
		t.Fatalf("gencerts: %d %s", code, errOut)
	}
	p := func(n string) string { return filepath.Join(dir, n) }
	server = func() *tls.Config {
		c, err := grpctransport.LoadServerTLS(p(pki.FileCA), p(pki.FileLeader), p(pki.FileLeaderKey))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	client = func(id string) *tls.Config {
		cert, key := pki.FollowerFiles(id)
		c, err := grpctransport.LoadClientTLS(p(pki.FileCA), p(cert), p(key))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	return server, client
}

// runningLeader is serveLeader running in the test process.
type runningLeader struct {
	addr string
	l    *leader.Leader
	log  *testutil.SyncBuffer
	stop func() error // stops it as SIGINT would and returns serveLeader's error
}

func startLeader(t *testing.T, c leaderConfig) *runningLeader {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &runningLeader{log: &testutil.SyncBuffer{}}
	ready := make(chan struct{})
	c.ready = func(addr string, l *leader.Leader) { r.addr, r.l = addr, l; close(ready) }
	if c.listen == "" {
		c.listen = "127.0.0.1:0"
	}
	if c.shards == 0 {
		c.shards = 1
	}
	if c.maxRetained == 0 {
		c.maxRetained = leader.DefaultMaxRetainedBytes
	}
	if c.retainEvery == 0 {
		c.retainEvery = 50 * time.Millisecond
	}
	if c.segmentSize == 0 {
		c.segmentSize = wal.DefaultSegmentSize
	}
	if c.gen.batch == 0 {
		c.gen.batch = 64
	}
	if c.gen.sessions == 0 {
		c.gen.sessions = 20
	}
	done := make(chan error, 1)
	go func() { done <- serveLeader(ctx, newLogger(r.log, "text", slog.LevelInfo), c) }()
	select {
	case <-ready:
	case err := <-done:
		cancel()
		t.Fatalf("leader did not start: %v\n%s", err, r.log)
	case <-time.After(30 * time.Second):
		t.Fatalf("leader did not start in 30s:\n%s", r.log)
	}
	var once sync.Once
	var err error
	r.stop = func() error {
		once.Do(func() { cancel(); err = <-done })
		return err
	}
	t.Cleanup(func() { _ = r.stop() })
	return r
}

// dialAddr is the leader's address as a follower dials it: the
// certificate names localhost.
func (r *runningLeader) dialAddr() string {
	return strings.Replace(r.addr, "127.0.0.1", "localhost", 1)
}

// ends returns each shard's last LSN.
func (r *runningLeader) ends() []uint64 {
	var out []uint64
	for _, st := range r.l.Stats() {
		out = append(out, st.NextLSN-1)
	}
	return out
}

// runningFollower is serveFollower running in the test process.
type runningFollower struct {
	applied func(shard uint32) uint64
	log     *testutil.SyncBuffer
	stop    func() error
}

func startFollower(t *testing.T, c followerConfig) *runningFollower {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &runningFollower{log: &testutil.SyncBuffer{}}
	opened := make(chan struct{})
	c.opened = func(applied func(uint32) uint64) { r.applied = applied; close(opened) }
	if c.statsEvery == 0 {
		c.statsEvery = time.Hour
	}
	done := make(chan error, 1)
	go func() { done <- serveFollower(ctx, newLogger(r.log, "text", slog.LevelInfo), c) }()
	select {
	case <-opened:
	case err := <-done:
		cancel()
		t.Fatalf("follower %s did not start: %v\n%s", c.id, err, r.log)
	}
	var once sync.Once
	var err error
	r.stop = func() error {
		once.Do(func() { cancel(); err = <-done })
		return err
	}
	t.Cleanup(func() { _ = r.stop() })
	return r
}

// waitCaughtUp waits until every follower applied each shard's log to its
// end.
func waitCaughtUp(t *testing.T, ends []uint64, fs ...*runningFollower) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for _, f := range fs {
		for s, end := range ends {
			for f.applied(uint32(s)) < end {
				if time.Now().After(deadline) {
					t.Fatalf("follower stuck at %d of shard %d's %d:\n%s", f.applied(uint32(s)), s, end, f.log)
				}
				time.Sleep(5 * time.Millisecond)
			}
		}
	}
}

// walOracle is the state every follower must hold, computed from the
// leader's logs as oncewal waldump --json prints them: every distinct
// request (idempotency key) applied once, in LSN order; and each
// session's last SeqNo. upTo, when set, cuts shard s's log after upTo[s].
type walOracle struct {
	*sim.Oracle
	hwm  map[session.ID]uint64
	seen map[string]bool
}

func newWALOracle() *walOracle {
	return &walOracle{Oracle: sim.NewOracle(), hwm: map[session.ID]uint64{}, seen: map[string]bool{}}
}

// feed applies waldump --json output; events of shard s beyond upTo[s]
// (when upTo is not nil) are left out.
func (o *walOracle) feed(t *testing.T, dump string, upTo []uint64) (events, retried int) {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(dump))
	for dec.More() {
		var e eventJSON
		if err := dec.Decode(&e); err != nil {
			t.Fatalf("waldump --json: %v", err)
		}
		if upTo != nil && e.LSN > upTo[e.Shard] {
			continue
		}
		events++
		op, err := wal.ParseOp(e.Op)
		if err != nil {
			t.Fatal(err)
		}
		if op.IsLedger() {
			continue // ledger records carry no session state
		}
		var id session.ID
		if b, err := hex.DecodeString(e.Session); err != nil || copy(id[:], b) != len(id) {
			t.Fatalf("session %q", e.Session)
		}
		o.hwm[id] = max(o.hwm[id], e.Seq)
		if e.Idem == nil {
			t.Fatalf("LSN %d: event without an idempotency key", e.LSN)
		}
		if o.seen[*e.Idem] {
			retried++
			continue // a client's retry: the followers' window drops it
		}
		o.seen[*e.Idem] = true
		ev := wal.Event{Op: op, Session: id, Key: e.Key, Value: e.Value}
		if e.Delta != nil {
			ev.Delta = *e.Delta
		}
		o.Apply(&ev)
	}
	return events, retried
}

// inspected is a store as oncewal inspect --json prints it.
type inspected struct {
	AppliedLSN uint64 `json:"applied_lsn"`
	Epoch      uint64 `json:"epoch"`
	Sessions   []struct {
		ID    string            `json:"id"`
		HWM   uint64            `json:"hwm"`
		State map[string]string `json:"state"`
	} `json:"sessions"`
}

// check compares a store's inspect --json output with the oracle: every
// session's state and HWM, and no session the log does not have.
func (o *walOracle) check(t *testing.T, name, inspectJSON string, shardOf func(session.ID) bool) {
	t.Helper()
	var got inspected
	if err := json.Unmarshal([]byte(inspectJSON), &got); err != nil {
		t.Fatalf("%s: inspect --json: %v", name, err)
	}
	for _, s := range got.Sessions {
		var id session.ID
		b, _ := hex.DecodeString(s.ID)
		copy(id[:], b)
		if _, ok := o.hwm[id]; !ok {
			t.Fatalf("%s: session %s is not in the log", name, s.ID)
		}
		if s.HWM != o.hwm[id] {
			t.Fatalf("%s: session %s HWM %d, the log's last SeqNo is %d", name, s.ID, s.HWM, o.hwm[id])
		}
		want := o.Expect(id)
		if len(s.State) != len(want) {
			t.Fatalf("%s: session %s has %d keys, want %d", name, s.ID, len(s.State), len(want))
		}
		for k, v := range s.State {
			kb, _ := base64.StdEncoding.DecodeString(k)
			vb, _ := base64.StdEncoding.DecodeString(v)
			if w, ok := want[string(kb)]; !ok || !bytes.Equal(w, vb) {
				t.Fatalf("%s: session %s key %q = %x, want %x (present %v)", name, s.ID, kb, vb, w, ok)
			}
		}
	}
	for id := range o.hwm {
		if shardOf(id) && !hasSession(got, id) {
			t.Fatalf("%s: session %s of the log is missing", name, id)
		}
	}
}

func hasSession(got inspected, id session.ID) bool {
	h := hex.EncodeToString(id[:])
	for _, s := range got.Sessions {
		if s.ID == h {
			return true
		}
	}
	return false
}

// dump runs oncewal waldump --json on a WAL directory.
func dump(t *testing.T, walDir string) string {
	t.Helper()
	out, errOut, code := runCmd(t, "waldump", "--json", walDir)
	if code != exitOK {
		t.Fatalf("waldump %s: exit %d: %s", walDir, code, errOut)
	}
	return out
}

// inspectStore runs oncewal inspect --json on a store.
func inspectStore(t *testing.T, dir string) string {
	t.Helper()
	out, errOut, code := runCmd(t, "inspect", "--json", dir)
	if code != exitOK {
		t.Fatalf("inspect %s: exit %d: %s", dir, code, errOut)
	}
	return out
}
