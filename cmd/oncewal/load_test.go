package main

import (
	"context"
	"encoding/binary"
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/oncewal/oncewal/client"
	"github.com/oncewal/oncewal/internal/pki"
	"github.com/oncewal/oncewal/replication/grpctransport"
	"github.com/oncewal/oncewal/testutil"
)

// TestLoadUsage: load's flags are checked before anything is dialled, every
// bad one named in one usage error (exit 2).
func TestLoadUsage(t *testing.T) {
	base := []string{"load", "--addrs", "127.0.0.1:7070", "--insecure", "--principal", "p"}
	with := func(more ...string) []string { return append(append([]string(nil), base...), more...) }
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"load", "--insecure", "--principal", "p"}, []string{"--addrs is required"}},
		{with("--addrs", "127.0.0.1"), []string{`--addrs "127.0.0.1" is not host:port`}},
		{with("--addrs", "a:1,:7070"), []string{`--addrs ":7070" names no host`}},
		{with("--rate", "-1"), []string{"--rate -1 is out of range"}},
		{with("--rate", "NaN"), []string{"--rate NaN is out of range"}},
		{with("--clients", "0"), []string{"--clients 0 is out of range [1, 1024]"}},
		{with("--retry-rate", "1.5"), []string{"--retry-rate 1.5 is out of range [0, 1]"}},
		{with("--keys", "-1"), []string{"--keys -1 is out of range [0, 1048576]"}},
		{with("--ack", "none"), []string{`--ack "none" is not one of leader, one, majority, all`}},
		{with("--duration", "-1s"), []string{"--duration -1s must be >= 0s"}},
		{with("--stats-interval", "-1s"), []string{"--stats-interval -1s must be >= 0s"}},
		{[]string{"load", "--addrs", "a:1", "--insecure"}, []string{"--insecure needs --principal NAME"}},
		{[]string{"load", "--addrs", "a:1", "--principal", "p", "--tls-ca", "c", "--tls-cert", "c", "--tls-key", "k"},
			[]string{"--principal is only for --insecure"}},
		{[]string{"load", "--addrs", "a:1"}, []string{"mutual TLS needs --tls-ca, --tls-cert and --tls-key"}},
		{with("--tls-ca", "ca.pem"), []string{"--insecure excludes --tls-ca/--tls-cert/--tls-key"}},
		{with("extra"), []string{`unexpected argument "extra"`}},
		{with("--rate", "-1", "--clients", "0", "--ack", "x"), []string{"--rate -1", "--clients 0", `--ack "x"`}},
	} {
		_, errOut, code := runCmd(t, tc.args...)
		if code != exitUsage {
			t.Errorf("%q: exit %d, want %d:\n%s", tc.args, code, exitUsage, errOut)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(errOut, w) {
				t.Errorf("%q: stderr lacks %q:\n%s", tc.args, w, errOut)
			}
		}
		if !strings.Contains(errOut, "run 'oncewal load -h' for the flags") {
			t.Errorf("%q: no help hint:\n%s", tc.args, errOut)
		}
	}
}

// TestLoadConflictEndsRun: a request ID of the run already used for
// another request (another payload) is a bug in a load run: the run stops
// at that answer and returns the conflict, counted, with nothing answered.
// A real leader serves the client service over mutual TLS in-process.
func TestLoadConflictEndsRun(t *testing.T) {
	dir := t.TempDir()
	certs := filepath.Join(dir, "certs")
	server, _ := tlsPair(t, certs)
	r := startLeader(t, leaderConfig{dir: filepath.Join(dir, "leader"), followers: []string{"f1"}, tls: server()})
	ca := gencertsCA(t, certs)
	pair := testutil.ClientCert(t, &pki.Certs{CA: ca}, "oncewal://client/loadtest")
	opts := func() *client.Options {
		return &client.Options{Addrs: []string{r.dialAddr()}, TLS: grpctransport.ClientTLSConfig(ca.Pool(), pair, ""),
			Ack: client.AckLeader, Logger: slog.New(slog.DiscardHandler)}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a hang guard, not a measure
	defer cancel()
	c, err := client.New(opts())
	must(t, err)
	_, err = c.Submit(ctx, loadRequestID("run", 0, 0), client.Ops(client.Put([]byte("another"), []byte("request"))))
	must(t, err)
	must(t, c.Close())

	sum, err := runLoadWith(ctx, slog.New(slog.DiscardHandler), loadConfig{client: opts(), clients: 1, runID: "run"})
	if !errors.Is(err, client.ErrConflict) || sum == nil || sum.conflicts != 1 || sum.requests != 1 || sum.answered() != 0 {
		t.Fatalf("load over a used request ID: %v, %s", err, sum)
	}
}

// TestLoadKeysSpreadOverShards: with --keys, one principal's requests are
// transactions on its key space, each in its key's shard: over a leader
// of 4 shards every shard takes requests (the summary's per_shard), and
// every key's counter is the number of distinct requests to it, retries
// (replays) not counted twice.
func TestLoadKeysSpreadOverShards(t *testing.T) {
	dir := t.TempDir()
	certs := filepath.Join(dir, "certs")
	server, _ := tlsPair(t, certs)
	r := startLeader(t, leaderConfig{dir: filepath.Join(dir, "leader"), shards: 4, followers: []string{"f1"}, tls: server()})
	ca := gencertsCA(t, certs)
	pair := testutil.ClientCert(t, &pki.Certs{CA: ca}, "oncewal://client/loadtest")
	opts := &client.Options{Addrs: []string{r.dialAddr()}, TLS: grpctransport.ClientTLSConfig(ca.Pool(), pair, ""),
		Ack: client.AckLeader, Logger: slog.New(slog.DiscardHandler)}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	sum, err := runLoadWith(ctx, slog.New(slog.DiscardHandler), loadConfig{client: opts, clients: 4, keys: 32, retryRate: 0.2, runID: "keys"})
	must(t, err)
	if sum.answered() == 0 || sum.retryReplay != sum.retries || sum.reruns != 0 || len(sum.perShard) != 4 {
		t.Fatalf("summary: %s", sum)
	}
	for s, n := range sum.perShard {
		if n == 0 {
			t.Errorf("shard %d took none of %d requests: %s", s, sum.answered(), sum)
		}
	}
	if !strings.Contains(sum.String(), "per_shard=[") {
		t.Errorf("the summary does not say the spread: %s", sum)
	}
	// Each client's request n adds 1 to key n mod 32: the counters sum to
	// the distinct requests answered, whatever was retried.
	c, err := client.New(opts)
	must(t, err)
	defer c.Close()
	kvs, _, err := c.Range(context.Background(), []byte("load/"), 0)
	must(t, err)
	var total int64
	for _, kv := range kvs {
		total += int64(binary.LittleEndian.Uint64(kv.Value))
	}
	if uint64(total) < sum.answered() || uint64(total) > sum.requests {
		t.Fatalf("counters sum to %d; %d requests answered of %d sent (%s)", total, sum.answered(), sum.requests, sum)
	}
}
