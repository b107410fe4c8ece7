package main

import (
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/oncewal/oncewal/client"
	"github.com/oncewal/oncewal/idempotency"
	"github.com/oncewal/oncewal/internal/pki"
	"github.com/oncewal/oncewal/leader"
	"github.com/oncewal/oncewal/testutil"
	"github.com/oncewal/oncewal/wal"
)

// TestRealProcessesLoad runs the built binary: a leader, one follower
// serving --client-listen, and oncewal load given only the follower's
// client address (so every request starts with a "not leader" redirect)
// with four concurrent clients, retries of answered requests, majority
// acks and --ack-log, over mutual TLS with a client certificate of
// gencerts' CA naming oncewal://client/loadtest. The load exits 0 with
// every retry answered Replay. After the second run (below) the leader's
// WAL is read: every request in the ack log is there exactly once — one complete
// ledger record of the load's principal naming its request ID, in a batch
// holding its one event — and no request of the run was logged twice. A
// load whose certificate names no client is denied and exits 1 at once. A
// second load is stopped by SIGTERM after the leader was SIGKILLed under
// it: it exits 0, and what it acknowledged up to the kill is in the WAL
// exactly once too.
func TestRealProcessesLoad(t *testing.T) {
	rp := newRealProcs(t, "f1")
	cert := rp.cert
	clientPort := freePort(t)
	leaderDir := filepath.Join(rp.dir, "leader")
	ld := &proc{name: "leader", log: filepath.Join(rp.dir, "leader.log"), args: []string{"leader",
		"--dir", leaderDir, "--followers", "f1", "--listen", fmt.Sprintf("127.0.0.1:%d", rp.port),
		"--tls-ca", cert(pki.FileCA), "--tls-cert", cert(pki.FileLeader), "--tls-key", cert(pki.FileLeaderKey)}}
	f1 := &proc{name: "f1", log: filepath.Join(rp.dir, "f1.log"), args: append(append([]string{"follower",
		"--dir", filepath.Join(rp.dir, "f1"), "--id", "f1", "--leader", fmt.Sprintf("localhost:%d", rp.port)},
		rp.followerTLS("f1")...),
		"--client-listen", fmt.Sprintf("127.0.0.1:%d", clientPort),
		"--client-tls-cert", cert(pki.FileLeader), "--client-tls-key", cert(pki.FileLeaderKey))}
	reapProcs(t, []*proc{ld, f1})
	ld.start(t, rp.bin)
	f1.start(t, rp.bin)
	waitUntil(t, "the leader to serve", func() bool { return strings.Contains(readFile(t, ld.log), "oncewal leader: serving") })
	waitUntil(t, "the follower's client port", func() bool {
		return strings.Contains(readFile(t, f1.log), "oncewal follower: client service (not leader)")
	})
	const principal = "loadtest"
	clientCert, clientKey := writeClientCert(t, rp, principal)
	loadArgs := func(certFile, keyFile string, more ...string) []string {
		return append([]string{"load", "--addrs", fmt.Sprintf("127.0.0.1:%d", clientPort),
			"--tls-ca", cert(pki.FileCA), "--tls-cert", certFile, "--tls-key", keyFile}, more...)
	}

	// A certificate that names no client is denied: a deployment fault,
	// final at the first answer, exit 1.
	fcert, fkey := pki.FollowerFiles("f1")
	_, e, err := rp.run(loadArgs(cert(fcert), cert(fkey), "--duration", "30s")...)
	if exitCode(err) != exitFailure || !strings.Contains(e, client.ErrDenied.Error()) {
		t.Fatalf("load with a follower's certificate: %v, want exit 1 naming %q:\n%s", err, client.ErrDenied, e)
	}

	ackLog := filepath.Join(rp.dir, "acked")
	out, e, err := rp.run(loadArgs(clientCert, clientKey, "--clients", "4", "--rate", "400", "--retry-rate", "0.2",
		"--ack", "majority", "--duration", "2s", "--ack-log", ackLog, "--stats-interval", "500ms")...)
	if err != nil {
		t.Fatalf("load: %v\n%s\n%s", err, out, e)
	}
	t.Log(strings.TrimSpace(out))
	sum := loadCounts(t, out)
	if sum["conflicts"] != 0 || sum["refused"] != 0 || sum["reruns"] != 0 {
		t.Fatalf("load: %s", out)
	}
	if sum["retried"] == 0 || sum["retry_replayed"] != sum["retried"] {
		t.Fatalf("load: every retry of an answered request must be answered Replay: %s", out)
	}
	if !strings.Contains(e, "oncewal load: stats") {
		t.Fatalf("load logged no stats line:\n%s", e)
	}
	// A second run, until SIGTERM: the leader is SIGKILLed while requests
	// are being answered, then the load stopped; it exits 0 (a request
	// whose answer died with the leader is outcome-unknown, not a bug).
	lp := &proc{name: "load", log: filepath.Join(rp.dir, "load.log"), args: loadArgs(clientCert, clientKey,
		"--clients", "4", "--rate", "400", "--retry-rate", "0.2", "--ack-log", ackLog, "--stats-interval", "0")}
	reapProcs(t, []*proc{lp})
	before := len(readFile(t, ackLog))
	lp.start(t, rp.bin)
	waitUntil(t, "the second run's answers", func() bool { return len(readFile(t, ackLog)) >= before+16*200 })
	ld.kill(t)
	if err := lp.stop(t); err != nil {
		t.Fatalf("load stopped by SIGTERM after the leader's kill: %v\n%s", err, readFile(t, lp.log))
	}
	second := loadCounts(t, readFile(t, lp.log))
	if second["conflicts"] != 0 || second["refused"] != 0 || second["reruns"] != 0 {
		t.Fatalf("second load: %s", readFile(t, lp.log))
	}
	must(t, f1.stop(t))
	sum["ok"] += second["ok"]
	sum["replayed"] += second["replayed"]

	acked := ackedKeys(t, ackLog)
	if uint64(len(acked)) != sum["ok"]+sum["replayed"] {
		t.Fatalf("the ack log holds %d requests, the summary says %d were answered: %s", len(acked), sum["ok"]+sum["replayed"], out)
	}
	logged := completedRequests(t, filepath.Join(leaderDir, leader.WALDirName), principal)
	for key, n := range logged {
		if n != 1 {
			t.Fatalf("request %s was logged %d times", key, n)
		}
	}
	seen := map[string]bool{}
	for _, key := range acked {
		if seen[key] {
			t.Fatalf("request %s is twice in the ack log", key)
		}
		seen[key] = true
		if logged[key] != 1 {
			t.Fatalf("request %s was answered to its client but is not in the leader's WAL", key)
		}
	}
	t.Logf("all %d answered requests in the leader's WAL once (%d logged)", len(acked), len(logged))
}

// writeClientCert writes a certificate of gencerts' CA in rp naming
// oncewal://client/name, and its key, and returns their paths.
func writeClientCert(t *testing.T, rp *realProcs, name string) (certFile, keyFile string) {
	t.Helper()
	pair := testutil.ClientCert(t, &pki.Certs{CA: rp.ca(t)}, "oncewal://client/"+name)
	der, err := x509.MarshalPKCS8PrivateKey(pair.PrivateKey)
	must(t, err)
	certFile, keyFile = filepath.Join(rp.dir, "client-"+name+".pem"), filepath.Join(rp.dir, "client-"+name+"-key.pem")
	must(t, os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: pair.Certificate[0]}), 0o644))
	must(t, os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600))
	return certFile, keyFile
}

var loadCount = regexp.MustCompile(`(\w+)=(\d+)`)

// loadCounts reads the counters of oncewal load's summary line.
func loadCounts(t *testing.T, out string) map[string]uint64 {
	t.Helper()
	m := map[string]uint64{}
	for _, kv := range loadCount.FindAllStringSubmatch(out, -1) {
		v, err := strconv.ParseUint(kv[2], 10, 64)
		must(t, err)
		m[kv[1]] = v
	}
	if _, ok := m["ok"]; !ok {
		t.Fatalf("no summary in load's output: %q", out)
	}
	return m
}

// completedRequests reads shard 0 of the WAL in walDir to its end (a torn
// tail ends it) and counts, by client key in hex (idempotency.ClientKey of
// the request ID, as oncewal load's --ack-log writes), the complete ledger
// records of scope — each a request logged, in one batch with its events.
// A complete record's batch must hold exactly one other event: oncewal
// load's payload is one operation.
func completedRequests(t *testing.T, walDir, scope string) map[string]int {
	t.Helper()
	r, err := wal.OpenReader(walDir, 0)
	must(t, err)
	defer r.Close()
	out := map[string]int{}
	var evs []wal.Event
	for {
		_, raw, err := r.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		must(t, err)
		var h wal.Header
		h, evs, err = wal.DecodeBatch(raw, evs)
		must(t, err)
		ops, mine := 0, 0
		for i := range evs {
			if !evs[i].Op.IsLedger() {
				ops++
				continue
			}
			rec, err := evs[i].LedgerRecord()
			must(t, err)
			if rec.Kind == idempotency.RecordComplete && rec.Scope == scope {
				k := idempotency.ClientKey([]byte(rec.Key))
				out[hex.EncodeToString(k[:])]++
				mine++
			}
		}
		if mine > 0 && (mine != 1 || ops != 1) {
			t.Fatalf("batch at LSN %d holds %d complete records of %s and %d events, want 1 and 1", h.FirstLSN, mine, scope, ops)
		}
	}
}
