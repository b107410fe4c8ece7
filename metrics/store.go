package metrics

import (
	"strconv"
	"time"

	"github.com/oncewal/oncewal/store"

	"github.com/oncewal/oncewal/follower"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// emitter sends const metrics to a Collect channel.
type emitter chan<- prometheus.Metric

func (e emitter) counter(d *prometheus.Desc, v uint64, labels ...string) {
	e <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
}

func (e emitter) gauge(d *prometheus.Desc, v float64, labels ...string) {
	e <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
}

func (e emitter) flag(d *prometheus.Desc, v bool, labels ...string) {
	f := 0.0
	if v {
		f = 1
	}
	e.gauge(d, f, labels...)
}

// latency sends a replication.LatencySnapshot as a histogram in seconds.
func (e emitter) latency(d *prometheus.Desc, s store.LatencySnapshot, labels ...string) {
	buckets := make(map[float64]uint64, len(store.LatencyBounds))
	var cum uint64
	for i, b := range store.LatencyBounds {
		cum += s.Counts[i]
		buckets[b.Seconds()] = cum
	}
	e <- prometheus.MustNewConstHistogram(d, s.Count(), s.Sum.Seconds(), buckets, labels...)
}

// unixSeconds is a unix-nanosecond time in seconds (0 stays 0).
func unixSeconds(ns int64) float64 { return float64(ns) / 1e9 }

func shardLabel(s uint32) string { return strconv.FormatUint(uint64(s), 10) }

// storeDescs are the metrics of one shard store (see the package doc), with
// a prefix: oncewal_follower_ or oncewal_leader_store_.
type storeDescs struct {
	appliedLSN, epoch, walTime                               *prometheus.Desc
	batches, committed, duplicate, refused, bytes, events    *prometheus.Desc
	commit, fsync                                            *prometheus.Desc
	window, windowCap, hwmCache                              *prometheus.Desc
	ledgerRecords, ledgerSweeps, ledgerSwept, backgroundErrs *prometheus.Desc
	writeStalled, diskFull                                   *prometheus.Desc
	all                                                      []*prometheus.Desc
}

func newStoreDescs(prefix string) *storeDescs {
	d := &storeDescs{}
	def := func(name, help string, labels ...string) *prometheus.Desc {
		desc := prometheus.NewDesc(prefix+name, help, append([]string{"shard"}, labels...), nil)
		d.all = append(d.all, desc)
		return desc
	}
	d.appliedLSN = def("applied_lsn", "Applied (and acknowledged) LSN of the shard's store.")
	d.epoch = def("epoch", "Highest leader epoch the store has committed.")
	d.walTime = def("applied_wal_time_seconds", "Leader timestamp (WAL clock, unix seconds) of the newest event applied.")
	d.batches = def("batches_total", "Batches offered to the receiver.")
	d.committed = def("batches_committed_total", "Batches committed to the store.")
	d.duplicate = def("batches_duplicate_total", "Batches wholly at or below the applied LSN (redeliveries).")
	d.refused = def("batches_refused_total", "Batches refused as a whole, by reason.", "reason")
	d.bytes = def("received_bytes_total", "Bytes of the batches offered to the receiver.")
	d.events = def("events_total", "Events received, by outcome (they sum to every event received).", "outcome")
	d.commit = def("commit_duration_seconds", "Time to commit a batch to Pebble, fsync included.")
	d.fsync = def("wal_fsync_duration_seconds", "Pebble WAL fsync latency.")
	d.window = def("window_keys", "Idempotency keys held in the window.")
	d.windowCap = def("window_capacity_keys", "Capacity of the idempotency-key window.")
	d.hwmCache = def("hwm_cache_sessions", "Session HWMs cached in memory.")
	d.ledgerRecords = def("ledger_records_total", "Request-ledger records applied to the store, by result.", "result")
	d.ledgerSweeps = def("ledger_sweeps_total", "Request-ledger expiry sweeps.")
	d.ledgerSwept = def("ledger_swept_entries_total", "Request-ledger entries deleted by sweeps.")
	d.backgroundErrs = def("store_background_errors_total", "Pebble background errors (flushes, compactions) of the store.")
	d.diskFull = def("store_disk_full", "1 while the store's disk has less free space than the follower keeps (MinFreeBytes): no batch is applied.")
	d.writeStalled = def("store_write_stalled", "1 while Pebble holds the store's writes back (flushes or compactions behind; with background errors: a disk that cannot take a flush).")
	return d
}

// emit sends one store's metrics; db, if not nil, is read for Pebble's
// fsync latency.
func (d *storeDescs) emit(e emitter, shard uint32, applied, epoch uint64, st store.Stats, db *store.View) {
	s := shardLabel(shard)
	r := st.Receiver
	e.gauge(d.appliedLSN, float64(applied), s)
	e.gauge(d.epoch, float64(epoch), s)
	e.gauge(d.walTime, unixSeconds(st.AppliedWALTime), s)
	e.counter(d.batches, r.Batches, s)
	e.counter(d.committed, r.BatchesCommitted, s)
	e.counter(d.duplicate, r.DuplicateBatches, s)
	for _, c := range []struct {
		reason string
		n      uint64
	}{{"seq_gap", r.SeqGaps}, {"out_of_order", r.OutOfOrder}, {"stale_epoch", r.StaleEpochs},
		{"wrong_shard", r.WrongShard}, {"corrupt", r.Corrupt}, {"apply_error", r.ApplyErrors}} {
		e.counter(d.refused, c.n, s, c.reason)
	}
	e.counter(d.bytes, r.Bytes, s)
	for _, c := range []struct {
		outcome string
		n       uint64
	}{{"applied", r.Applied}, {"discarded_position", r.DiscardedPosition}, {"discarded_hwm", r.DiscardedHWM},
		{"discarded_window", r.DiscardedWindow}, {"discarded_in_batch", r.DiscardedInBatch},
		{"skipped_closed", r.SkippedClosed}, {"skipped_too_old", r.SkippedTooOld}, {"refused", r.RefusedEvents}} {
		e.counter(d.events, c.n, s, c.outcome)
	}
	e.latency(d.commit, r.CommitLatency, s)
	if db != nil {
		if m, ok := fsyncHistogram(db, d.fsync, s); ok {
			e <- m
		}
	}
	e.gauge(d.window, float64(st.WindowLen), s)
	e.gauge(d.windowCap, float64(st.WindowCapacity), s)
	e.gauge(d.hwmCache, float64(st.HWMCacheLen), s)
	e.counter(d.ledgerRecords, st.Ledger.Applied, s, "applied")
	e.counter(d.ledgerRecords, st.Ledger.Stale, s, "stale")
	e.counter(d.ledgerSweeps, st.Ledger.Sweeps, s)
	e.counter(d.ledgerSwept, st.Ledger.Swept, s)
	e.counter(d.backgroundErrs, st.BackgroundErrors, s)
	stalled := 0.0
	if st.WriteStalled {
		stalled = 1
	}
	e.gauge(d.writeStalled, stalled, s)
	full := 0.0
	if st.DiskFull {
		full = 1
	}
	e.gauge(d.diskFull, full, s)
}

// fsyncHistogram converts Pebble's WAL fsync histogram (nanoseconds, 100
// buckets) into seconds, keeping for each of replication.LatencyBounds the
// largest of Pebble's bounds at or below it (cumulative counts stay exact;
// each bucket is labelled with Pebble's own bound). ok is false when the
// store is closed or keeps no such histogram.
func fsyncHistogram(db *store.View, desc *prometheus.Desc, labels ...string) (m prometheus.Metric, ok bool) {
	defer func() {
		if recover() != nil { // a store closed under the scrape
			m, ok = nil, false
		}
	}()
	h := db.Metrics().LogWriter.FsyncLatency
	if h == nil {
		return nil, false
	}
	var pm dto.Metric
	if err := h.Write(&pm); err != nil || pm.Histogram == nil {
		return nil, false
	}
	buckets := make(map[float64]uint64, len(store.LatencyBounds))
	src := pm.Histogram.GetBucket()
	j := 0
	for _, want := range store.LatencyBounds {
		limit := float64(want.Nanoseconds())
		for j+1 < len(src) && src[j+1].GetUpperBound() <= limit {
			j++
		}
		if j < len(src) && src[j].GetUpperBound() <= limit {
			buckets[src[j].GetUpperBound()/float64(time.Second)] = src[j].GetCumulativeCount()
		}
	}
	return prometheus.MustNewConstHistogram(desc, pm.Histogram.GetSampleCount(),
		pm.Histogram.GetSampleSum()/float64(time.Second), buckets, labels...), true
}

// linkDescs are a follower's connection metrics.
type linkDescs struct {
	connected, lag, lastBatch, attempts, failures, refusals *prometheus.Desc
	all                                                     []*prometheus.Desc
}

func newLinkDescs() *linkDescs {
	d := &linkDescs{}
	def := func(name, help string, labels ...string) *prometheus.Desc {
		desc := prometheus.NewDesc("oncewal_follower_"+name, help, append([]string{"shard"}, labels...), nil)
		d.all = append(d.all, desc)
		return desc
	}
	d.connected = def("connected", "1 while a connection to the leader is in service.")
	d.lag = def("lag_seconds", "WAL-clock lag behind the leader while batches arrive (0 when none arrived for the idle window).")
	d.lastBatch = def("last_batch_timestamp_seconds", "When the last batch arrived (unix seconds; 0: none yet).")
	d.attempts = def("connection_attempts_total", "Connection attempts (dials) to the leader.")
	d.failures = def("connection_failures_total", "Failed connection attempts, by kind: transient, or permanent (a refusal no retry fixes).", "kind")
	d.refusals = def("refusals_total", "Permanent connection failures by reason (follower.PermanentReasons).", "reason")
	return d
}

// LagIdle is the idle window of the lag estimate (follower.Stats.WALLag):
// with no batch for this long, a follower counts as caught up.
const LagIdle = 10 * time.Second

func (d *linkDescs) emit(e emitter, shard uint32, st follower.Stats, now time.Time) {
	s := shardLabel(shard)
	l := st.Link
	e.flag(d.connected, l.Connected, s)
	e.gauge(d.lag, st.WALLag(now, LagIdle).Seconds(), s)
	e.gauge(d.lastBatch, unixSeconds(l.LastBatch), s)
	e.counter(d.attempts, l.Attempts, s)
	e.counter(d.failures, l.Failures-l.Permanent, s, "transient")
	e.counter(d.failures, l.Permanent, s, "permanent")
	for _, reason := range follower.PermanentReasons() {
		e.counter(d.refusals, l.Refusals[reason], s, reason)
	}
}
