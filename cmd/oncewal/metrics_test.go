package main

import (
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/oncewal/oncewal/follower"
	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/wal"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// scrape fetches url's /metrics and parses it with the Prometheus text
// parser.
func scrape(t *testing.T, addr string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/metrics: %s", resp.Status)
	}
	// common v0.67 (with client_golang 1.23, which etcd requires) panics on
	// a zero TextParser: it must be told which metric names are valid.
	// oncewal's names are legacy (classic Prometheus) names.
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("/metrics does not parse: %v", err)
	}
	return fams
}

// sample is the value of family name's sample with exactly labels.
func sample(t *testing.T, fams map[string]*dto.MetricFamily, name string, labels ...string) float64 {
	t.Helper()
	f := fams[name]
	if f == nil {
		t.Fatalf("no metric %s", name)
	}
	for _, m := range f.GetMetric() {
		got := map[string]string{}
		for _, lp := range m.GetLabel() {
			got[lp.GetName()] = lp.GetValue()
		}
		match := len(got) == len(labels)/2
		for i := 0; match && i+1 < len(labels); i += 2 {
			match = got[labels[i]] == labels[i+1]
		}
		if !match {
			continue
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue()
		case m.Gauge != nil:
			return m.Gauge.GetValue()
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount())
		}
	}
	t.Fatalf("no sample of %s with %v", name, labels)
	return 0
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// waitStatus polls url until it answers code, for at most limit.
func waitStatus(t *testing.T, what, url string, code int, limit time.Duration) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		got, body := get(t, url)
		if got == code {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s %s: %d %s, want %d", what, url, got, body, code)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestMetricsEndpoints starts a leader and a follower node over mutual TLS
// with --metrics-addr on loopback, scrapes /metrics with the Prometheus text
// parser and checks the follower's counters against its Stats() and the
// leader's view of it, and checks /healthz and /readyz on both — /readyz of
// the follower turns 503 once its leader is gone.
func TestMetricsEndpoints(t *testing.T) {
	dir := t.TempDir()
	serverTLS, clientTLS := tlsPair(t, filepath.Join(dir, "certs"), "f1")
	leaderMetrics := make(chan string, 1)
	ld := startLeader(t, leaderConfig{dir: filepath.Join(dir, "leader"), shards: 2, followers: []string{"f1"},
		tls: serverTLS(), metricsAddr: "127.0.0.1:0", metrics: func(a string) { leaderMetrics <- a }})
	rng := rand.New(rand.NewPCG(7, 8))
	var ids []session.ID
	for range 8 {
		var id session.ID
		for i := range id {
			id[i] = byte(rng.Uint32())
		}
		ids = append(ids, id)
	}
	for i := range 300 {
		if _, err := ld.l.Append(wal.Event{Op: wal.OpAdd, Session: ids[i%len(ids)], Key: []byte("n"), Delta: 1}); err != nil {
			t.Fatal(err)
		}
	}

	followerMetrics := make(chan string, 1)
	var rows func() []follower.ShardStats
	fl := startFollower(t, followerConfig{dir: filepath.Join(dir, "node"), leader: ld.dialAddr(), id: "f1", shards: 2,
		tls: clientTLS("f1"), metricsAddr: "127.0.0.1:0", readyMaxLag: time.Hour,
		metricsServing: func(a string) { followerMetrics <- a },
		openedRows:     func(r func() []follower.ShardStats) { rows = r }})
	faddr, laddr := <-followerMetrics, <-leaderMetrics
	waitCaughtUp(t, ld.ends(), fl)

	for _, addr := range []string{faddr, laddr} {
		if code, body := get(t, "http://"+addr+"/healthz"); code != http.StatusOK {
			t.Fatalf("%s /healthz: %d %s", addr, code, body)
		}
	}
	waitStatus(t, "follower", "http://"+faddr+"/readyz", http.StatusOK, 30*time.Second)
	if code, body := get(t, "http://"+laddr+"/readyz"); code != http.StatusOK {
		t.Fatalf("leader /readyz: %d %s", code, body)
	}

	ff, lf := scrape(t, faddr), scrape(t, laddr)
	for _, ss := range rows() {
		s := strconv.Itoa(int(ss.Shard))
		r := ss.Receiver
		for outcome, want := range map[string]uint64{"applied": r.Applied, "discarded_position": r.DiscardedPosition,
			"discarded_hwm": r.DiscardedHWM, "discarded_window": r.DiscardedWindow, "discarded_in_batch": r.DiscardedInBatch,
			"skipped_closed": r.SkippedClosed, "skipped_too_old": r.SkippedTooOld, "refused": r.RefusedEvents} {
			if got := sample(t, ff, "oncewal_follower_events_total", "shard", s, "outcome", outcome); got != float64(want) {
				t.Errorf("shard %s events %s: metric %v, Stats %d", s, outcome, got, want)
			}
		}
		if r.Applied == 0 || r.Events != r.Accounted() {
			t.Errorf("shard %s: stats %+v", s, r)
		}
		for name, want := range map[string]float64{
			"oncewal_follower_applied_lsn":             float64(ss.AppliedLSN),
			"oncewal_follower_batches_committed_total": float64(r.BatchesCommitted),
			"oncewal_follower_commit_duration_seconds": float64(r.CommitLatency.Count()),
			"oncewal_follower_received_bytes_total":    float64(r.Bytes),
			"oncewal_follower_window_keys":             float64(ss.WindowLen),
			"oncewal_follower_connected":               1,
		} {
			if got := sample(t, ff, name, "shard", s); got != want {
				t.Errorf("shard %s %s: metric %v, want %v", s, name, got, want)
			}
		}
		if got := sample(t, ff, "oncewal_follower_wal_fsync_duration_seconds", "shard", s); got == 0 {
			t.Errorf("shard %s: no WAL fsync observed", s)
		}
		for _, reason := range follower.PermanentReasons() {
			if got := sample(t, ff, "oncewal_follower_refusals_total", "shard", s, "reason", reason); got != 0 {
				t.Errorf("shard %s refused %s %v times", s, reason, got)
			}
		}
		if got := sample(t, lf, "oncewal_leader_follower_acked_lsn", "shard", s, "follower", "f1"); got != float64(ss.AppliedLSN) {
			t.Errorf("shard %s: leader sees f1 at %v, follower at %d", s, got, ss.AppliedLSN)
		}
		if got := sample(t, lf, "oncewal_leader_follower_lag_events", "shard", s, "follower", "f1"); got != 0 {
			t.Errorf("shard %s: leader sees f1 %v events behind", s, got)
		}
		if got := sample(t, lf, "oncewal_leader_last_lsn", "shard", s); got != float64(ss.AppliedLSN) {
			t.Errorf("shard %s: leader's last LSN %v, follower applied %d", s, got, ss.AppliedLSN)
		}
	}
	if sample(t, ff, "go_goroutines") == 0 {
		t.Error("no Go runtime metrics")
	}

	// The leader goes away: the follower stays alive but is not ready.
	if err := ld.stop(); err != nil {
		t.Fatal(err)
	}
	waitStatus(t, "follower without its leader", "http://"+faddr+"/readyz", http.StatusServiceUnavailable, 30*time.Second)
	if code, _ := get(t, "http://"+faddr+"/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz: %d", code)
	}
}

// TestMetricsAfterRebuild: a single-store follower (--shard, --rebuild=auto)
// joins after retention deleted its log's start, is rebuilt — follower.Run
// closes its store and opens the rebuilt one — and its /metrics and /readyz
// follow the store it serves now: the rebuilt store's applied LSN, one
// rebuild counted, connected and ready. (They stayed bound to the first,
// closed store.)
func TestMetricsAfterRebuild(t *testing.T) {
	dir := t.TempDir()
	serverTLS, clientTLS := tlsPair(t, filepath.Join(dir, "certs"), "late")
	ld := startLeader(t, leaderConfig{dir: filepath.Join(dir, "leader"), followers: []string{"late"},
		tls: serverTLS(), segmentSize: minSegmentSize, maxRetained: 32 << 10, retainEvery: 10 * time.Millisecond})
	id := session.NewID()
	deadline := time.Now().Add(60 * time.Second)
	for ld.l.Stats()[0].Retention.FirstLSN == 1 {
		if time.Now().After(deadline) {
			t.Fatalf("retention never deleted the log's start: %+v", ld.l.Stats()[0].Retention)
		}
		for range 50 {
			if _, err := ld.l.Append(wal.Event{Op: wal.OpAdd, Session: id, Key: []byte("n"), Delta: 1}); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(time.Millisecond)
	}
	end := ld.ends()[0]

	faddr := make(chan string, 1)
	fl := startFollower(t, followerConfig{dir: filepath.Join(dir, "late"), leader: ld.dialAddr(), id: "late",
		tls: clientTLS("late"), rebuild: follower.RebuildAuto, rebuildRate: -1, metricsAddr: "127.0.0.1:0", readyMaxLag: time.Hour,
		metricsServing: func(a string) { faddr <- a }})
	addr := <-faddr
	waitLog(t, fl.log, "oncewal follower: rebuilt", "reason=")
	waitCaughtUp(t, []uint64{end}, fl)
	waitStatus(t, "rebuilt follower", "http://"+addr+"/readyz", http.StatusOK, 30*time.Second)
	ff := scrape(t, addr)
	for name, want := range map[string]float64{
		"oncewal_follower_applied_lsn":          float64(end),
		"oncewal_follower_store_rebuilds_total": 1,
		"oncewal_follower_connected":            1,
	} {
		if got := sample(t, ff, name, "shard", "0"); got != want {
			t.Errorf("%s: %v, want %v", name, got, want)
		}
	}
	if err := fl.stop(); err != nil {
		t.Fatal(err)
	}
}

// TestFollowerStopOnRefusal: with --stop-on-refusal a follower the leader
// refuses for good (here an ID it does not register) stops with the typed
// refusal instead of redialling for ever.
func TestFollowerStopOnRefusal(t *testing.T) {
	dir := t.TempDir()
	ld := startLeader(t, leaderConfig{dir: filepath.Join(dir, "leader"), followers: []string{"f1"}})
	done := make(chan error, 1)
	go func() {
		done <- serveFollower(t.Context(), newLogger(io.Discard, "text", slog.LevelInfo), followerConfig{dir: filepath.Join(dir, "f"), leader: ld.addr,
			id: "stranger", stopOnRefusal: true, statsEvery: time.Hour})
	}()
	select {
	case err := <-done:
		if !errors.Is(err, follower.ErrPermanentRefusal) || !errors.Is(err, replication.ErrUnknownFollower) {
			t.Fatalf("follower stopped with %v, want the unknown-follower refusal", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("follower still running after a minute of refusals")
	}
}
