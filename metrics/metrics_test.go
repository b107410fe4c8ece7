package metrics_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oncewal/oncewal/replication/inprocess"

	"github.com/oncewal/oncewal/store"

	"github.com/oncewal/oncewal/follower"
	"github.com/oncewal/oncewal/leader"
	"github.com/oncewal/oncewal/metrics"
	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/session"
	oncetest "github.com/oncewal/oncewal/testutil"
	"github.com/oncewal/oncewal/wal"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil" // GatherAndLint; oncewal's is oncetest
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
)

var quiet = slog.New(slog.DiscardHandler)

// family returns the gathered family name, or nil.
func family(fams []*dto.MetricFamily, name string) *dto.MetricFamily {
	for _, f := range fams {
		if f.GetName() == name {
			return f
		}
	}
	return nil
}

// value is the value of the sample of family name whose labels include
// want (counter, gauge, or a histogram's count).
func value(t *testing.T, fams []*dto.MetricFamily, name string, want map[string]string) float64 {
	t.Helper()
	f := family(fams, name)
	require.NotNil(t, f, "no family %s", name)
outer:
	for _, m := range f.GetMetric() {
		for k, v := range want {
			found := false
			for _, lp := range m.GetLabel() {
				if lp.GetName() == k && lp.GetValue() == v {
					found = true
				}
			}
			if !found {
				continue outer
			}
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
	t.Fatalf("no sample of %s with %v", name, want)
	return 0
}

// TestLeaderAndNodeMetrics runs a leader of two shards and a follower node
// over the in-process transport, and checks that the collectors export the
// libraries' own figures under Prometheus-clean names (promlint), that the
// follower's event outcomes add up to every event it received, and that the
// leader sees the follower caught up.
func TestLeaderAndNodeMetrics(t *testing.T) {
	dir := t.TempDir()
	trs := []*inprocess.Transport{inprocess.New(inprocess.FaultsNone, 1), inprocess.New(inprocess.FaultsNone, 2)}
	for _, tr := range trs {
		defer tr.Close()
	}
	l, err := leader.Open(dir+"/leader", &leader.Options{
		Shards: 2, Followers: []string{"f1"}, Logger: quiet, Store: store.Options{Logger: quiet},
		Listener: func(s uint32) replication.Listener { return trs[s] },
		Shipping: leader.ShipperOptions{RetransmitTimeout: 20 * time.Millisecond, PollInterval: time.Millisecond},
	})
	require.NoError(t, err)
	defer l.Close()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait() // after cancel (defers run last first)
	defer cancel()
	wg.Go(func() { _ = l.Run(ctx) })

	n, err := follower.OpenNode(dir+"/node", []uint32{0, 1}, &follower.NodeOptions{
		Follower: follower.Options{Store: store.Options{ID: "f1", Logger: quiet}, ReconnectBackoff: time.Millisecond}})
	require.NoError(t, err)
	defer n.Close()
	wg.Go(func() { _ = n.Serve(ctx, func(s uint32) replication.Dialer { return trs[s] }) })

	rng := rand.New(rand.NewPCG(1, 2))
	ids := []session.ID{oncetest.SessionID(rng), oncetest.SessionID(rng), oncetest.SessionID(rng), oncetest.SessionID(rng)}
	for i := range 200 {
		id := ids[i%len(ids)]
		_, err := l.Append(wal.Event{Op: wal.OpAdd, Session: id, Key: []byte("n"), Delta: 1})
		require.NoError(t, err)
	}
	sh0, _ := l.Shard(0)
	c, err := sh0.Ledger().Claim("ops", "req-1", []byte("p"))
	require.NoError(t, err)
	_, err = sh0.Commit(c, []byte("done"), wal.Event{Op: wal.OpPut, Session: ids[0], Key: []byte("k"), Value: []byte("v")})
	if err != nil { // ids[0] may route to shard 1; the claim was still counted
		require.NoError(t, sh0.Ledger().Release(c))
	}
	wctx, wcancel := context.WithTimeout(ctx, time.Minute)
	defer wcancel()
	require.NoError(t, l.WaitAcked(wctx, leader.AckAll))

	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(metrics.NewLeaderCollector(l), metrics.NewNodeCollector(n))
	problems, err := testutil.GatherAndLint(reg)
	require.NoError(t, err)
	require.Empty(t, problems, "metric names break Prometheus conventions")
	fams, err := reg.Gather()
	require.NoError(t, err)

	st := n.Stats()
	for _, ss := range st.Shards {
		shard := map[string]string{"shard": string(rune('0' + ss.Shard))}
		r := ss.Receiver
		var sum float64
		for _, outcome := range []string{"applied", "discarded_position", "discarded_hwm", "discarded_window",
			"discarded_in_batch", "skipped_closed", "skipped_too_old", "refused"} {
			sum += value(t, fams, "oncewal_follower_events_total", map[string]string{"shard": shard["shard"], "outcome": outcome})
		}
		require.Equal(t, float64(r.Events), sum, "event outcomes add up to the events received")
		require.Equal(t, float64(r.Applied), value(t, fams, "oncewal_follower_events_total", map[string]string{"shard": shard["shard"], "outcome": "applied"}))
		require.Equal(t, float64(ss.AppliedLSN), value(t, fams, "oncewal_follower_applied_lsn", shard))
		require.Equal(t, float64(r.BatchesCommitted), value(t, fams, "oncewal_follower_commit_duration_seconds", shard))
		require.Positive(t, value(t, fams, "oncewal_follower_wal_fsync_duration_seconds", shard))
		require.Equal(t, float64(ss.WindowLen), value(t, fams, "oncewal_follower_window_keys", shard))
		require.Equal(t, 1.0, value(t, fams, "oncewal_follower_connected", shard))
		require.Equal(t, float64(ss.Rebuilds), value(t, fams, "oncewal_follower_store_rebuilds_total", shard))

		ls := l.Stats()[ss.Shard]
		f1 := map[string]string{"shard": shard["shard"], "follower": "f1"}
		require.Equal(t, float64(ls.NextLSN-1), value(t, fams, "oncewal_leader_last_lsn", shard))
		require.Equal(t, float64(ss.AppliedLSN), value(t, fams, "oncewal_leader_follower_acked_lsn", f1))
		require.Equal(t, 0.0, value(t, fams, "oncewal_leader_follower_lag_events", f1))
		require.Equal(t, float64(ls.NextLSN-1), value(t, fams, "oncewal_leader_store_applied_lsn", shard))
		require.Equal(t, float64(ls.Retention.SnapshotPins), value(t, fams, "oncewal_leader_wal_snapshot_pins", shard))
		require.Equal(t, float64(ls.WALBatches), value(t, fams, "oncewal_leader_wal_batches_total", shard))
		require.Equal(t, float64(ls.WALSyncs), value(t, fams, "oncewal_leader_wal_syncs_total", shard))
		require.Positive(t, ls.WALSyncs)
	}
	require.Equal(t, 1.0, value(t, fams, "oncewal_leader_ledger_claims_total", map[string]string{"shard": "0", "outcome": "fresh"}))

	// Health: alive, and ready once every shard is connected and caught up.
	srv := httptest.NewServer(metrics.Handler(reg, metrics.NodeReady(n, time.Minute)))
	defer srv.Close()
	get := func(path string) (int, string) {
		resp, err := http.Get(srv.URL + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(b)
	}
	code, _ := get("/healthz")
	require.Equal(t, http.StatusOK, code)
	code, body := get("/readyz")
	require.Equal(t, http.StatusOK, code, body)
	code, body = get("/metrics")
	require.Equal(t, http.StatusOK, code)
	require.True(t, strings.Contains(body, "oncewal_follower_events_total{"), body[:min(len(body), 500)])

	// A node whose link is down is not ready.
	cancel()
	wg.Wait()
	code, body = get("/readyz")
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Contains(t, body, "not connected")
	require.Equal(t, 1, strings.Count(body, "not ready"), "said once: %q", body)
	require.Equal(t, 1, strings.Count(body, "\n"), "one line for every shard: %q", body)
}

// TestReadyzBody: /readyz says "not ready: " once, then the reasons — of a
// check built with NotReady, of several shards, and of an embedder's check
// that wrapped ErrNotReady itself. (It said "not ready: not ready: shard
// 0: …".)
func TestReadyzBody(t *testing.T) {
	for _, tc := range []struct {
		name  string
		ready func() error
		code  int
		body  string
	}{
		{"ready", func() error { return nil }, http.StatusOK, "ready\n"},
		{"NotReady", func() error { return metrics.NotReady("shard %d: not connected to the leader", 0) },
			http.StatusServiceUnavailable, "not ready: shard 0: not connected to the leader\n"},
		{"wrapped by the embedder", func() error { return fmt.Errorf("%w: draining", metrics.ErrNotReady) },
			http.StatusServiceUnavailable, "not ready: draining\n"},
		{"other error", func() error { return errors.New("no leader elected") },
			http.StatusServiceUnavailable, "not ready: no leader elected\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			metrics.Handler(prometheus.NewRegistry(), tc.ready).ServeHTTP(rec, httptest.NewRequest("GET", "/readyz", nil))
			require.Equal(t, tc.code, rec.Code)
			require.Equal(t, tc.body, rec.Body.String())
		})
	}
	err := metrics.NotReady("shard 3: store down: %w", store.ErrFailed)
	require.ErrorIs(t, err, metrics.ErrNotReady)
	require.ErrorIs(t, err, store.ErrFailed)
	require.Equal(t, "shard 3: store down: "+store.ErrFailed.Error(), err.Error())
}

// TestFollowerReadyLag: the readiness check refuses a follower that applies
// batches logged longer ago than the threshold, and passes an idle one.
func TestFollowerReadyLag(t *testing.T) {
	f, err := follower.Open(t.TempDir(), &follower.Options{Store: store.Options{Logger: quiet}})
	require.NoError(t, err)
	defer f.Close()
	st := f.Stats()
	now := time.Now()
	st.Link.Connected = true
	st.Link.LastBatch = now.UnixNano()
	st.AppliedWALTime = now.Add(-time.Minute).UnixNano()
	require.Equal(t, time.Minute, st.WALLag(now, metrics.LagIdle).Round(time.Second))
	st.Link.LastBatch = now.Add(-time.Hour).UnixNano()
	require.Zero(t, st.WALLag(now, metrics.LagIdle), "idle: no batch for longer than the idle window")
	require.ErrorIs(t, metrics.FollowerReady(f, time.Second)(), metrics.ErrNotReady, "not connected")
}
