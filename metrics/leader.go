package metrics

import (
	"github.com/oncewal/oncewal/leader"
	"github.com/prometheus/client_golang/prometheus"
)

// LeaderCollector exports a Leader's metrics: per shard its log, shipping,
// retention and request ledger, per follower of the shard its stream, and
// the shard's local store (oncewal_leader_store_…).
type LeaderCollector struct {
	l     *leader.Leader
	store *storeDescs

	epoch, lastLSN, accepted, helloRefused                                 *prometheus.Desc
	walFirst, walRetained, walDeleted, retentionErrs, claims, decisions    *prometheus.Desc
	fConnected, fAcked, fSent, fLagEvents, fLagBytes, fDropped             *prometheus.Desc
	fBatches, fResent, fBytes, fAcks, fRefused, fRewinds, fTimeouts, fDisk *prometheus.Desc
	fHelloRefused, snapshotPins, snapshotPinLSN, walBatches, walSyncs      *prometheus.Desc
	all                                                                    []*prometheus.Desc
}

var _ prometheus.Collector = (*LeaderCollector)(nil)

// NewLeaderCollector returns the Collector of l's metrics.
func NewLeaderCollector(l *leader.Leader) *LeaderCollector {
	c := &LeaderCollector{l: l, store: newStoreDescs("oncewal_leader_store_")}
	def := func(name, help string, labels ...string) *prometheus.Desc {
		d := prometheus.NewDesc("oncewal_leader_"+name, help, append([]string{"shard"}, labels...), nil)
		c.all = append(c.all, d)
		return d
	}
	c.epoch = def("epoch", "Epoch stamped on the shard's batches.")
	c.lastLSN = def("last_lsn", "Last LSN of the shard's log.")
	c.accepted = def("connections_accepted_total", "Follower connections accepted.")
	c.helloRefused = def("hello_refusals_total", "Follower connections refused, by reason.", "reason")
	c.walFirst = def("wal_first_lsn", "First LSN the shard's WAL still holds.")
	c.walRetained = def("wal_retained_bytes", "Bytes of the shard's retained WAL segments.")
	c.walDeleted = def("wal_segments_deleted_total", "WAL segments deleted by retention.")
	c.walBatches = def("wal_batches_total", "Batches written to the shard's WAL since it opened.")
	c.walSyncs = def("wal_syncs_total", "Fdatasyncs that made the shard's WAL batches durable since it opened; below wal_batches_total when concurrent appenders share them (group commit).")
	c.snapshotPins = def("wal_snapshot_pins", "Snapshots served from the shard's store that pin its WAL (until ended, superseded or idle).")
	c.snapshotPinLSN = def("wal_snapshot_pin_lsn", "Lowest LSN a snapshot pins the shard's WAL from (0: none).")
	c.retentionErrs = def("retention_errors_total", "Retention passes that failed.")
	c.claims = def("ledger_claims_total", "Request-ledger claim answers, by outcome.", "outcome")
	c.decisions = def("ledger_decisions_total", "Request-ledger owner decisions, by decision (not_owner: refused).", "decision")
	c.fConnected = def("follower_connected", "1 while the follower's stream has a connection.", "follower")
	c.fAcked = def("follower_acked_lsn", "LSN the follower has acknowledged.", "follower")
	c.fSent = def("follower_sent_lsn", "Highest LSN sent to the follower.", "follower")
	c.fLagEvents = def("follower_lag_events", "Events of the log the follower has not acknowledged.", "follower")
	c.fLagBytes = def("follower_lag_bytes", "Bytes of the log the follower has not acknowledged.", "follower")
	c.fDropped = def("follower_slot_dropped", "1 when retention dropped the follower's replication slot.", "follower")
	c.fBatches = def("follower_batches_sent_total", "Batches sent to the follower, resends included.", "follower")
	c.fResent = def("follower_batches_resent_total", "Batches sent again.", "follower")
	c.fBytes = def("follower_sent_bytes_total", "Bytes sent to the follower.", "follower")
	c.fAcks = def("follower_acks_total", "Acks received from the follower.", "follower")
	c.fRefused = def("follower_batches_refused_total", "Batches the follower refused (acks with Refused).", "follower")
	c.fRewinds = def("follower_rewinds_total", "Times the stream's send position moved back.", "follower")
	c.fTimeouts = def("follower_timeouts_total", "Retransmit timer expiries.", "follower")
	c.fDisk = def("follower_disk_reads_total", "Batches the stream read from the WAL instead of the cache.", "follower")
	c.fHelloRefused = def("follower_hello_refusals_total", "The follower's refused connections, by reason.", "follower", "reason")
	return c
}

// Describe implements prometheus.Collector.
func (c *LeaderCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range append(c.all, c.store.all...) {
		ch <- d
	}
}

func (e emitter) refusals(d *prometheus.Desc, r leader.HelloRefusals, labels ...string) {
	for _, c := range []struct {
		reason string
		n      uint64
	}{{"bad_hello", r.BadHello}, {"unknown_follower", r.UnknownFollower}, {"diverged", r.Diverged},
		{"behind_retention", r.BehindRetention}, {"duplicate_follower", r.DuplicateFollower}, {"other", r.Other}} {
		e.counter(d, c.n, append(labels, c.reason)...)
	}
}

// Collect implements prometheus.Collector.
func (c *LeaderCollector) Collect(ch chan<- prometheus.Metric) {
	e := emitter(ch)
	defer func() { _ = recover() }() // a leader closed under the scrape
	for _, st := range c.l.Stats() {
		s := shardLabel(st.Shard)
		e.gauge(c.epoch, float64(st.Epoch), s)
		e.gauge(c.lastLSN, float64(st.NextLSN-1), s)
		e.counter(c.accepted, st.Shipping.Accepted, s)
		e.counter(c.walBatches, st.WALBatches, s)
		e.counter(c.walSyncs, st.WALSyncs, s)
		e.refusals(c.helloRefused, st.Shipping.Refused, s)
		r := st.Retention
		e.gauge(c.walFirst, float64(r.FirstLSN), s)
		e.gauge(c.walRetained, float64(r.RetainedBytes), s)
		e.gauge(c.snapshotPins, float64(r.SnapshotPins), s)
		e.gauge(c.snapshotPinLSN, float64(r.SnapshotPinLSN), s)
		e.counter(c.walDeleted, r.SegmentsDeleted, s)
		e.counter(c.retentionErrs, r.Errors, s)
		dropped := map[string]bool{}
		for _, sl := range r.Slots {
			dropped[sl.ID] = sl.Dropped
		}
		for _, f := range st.Shipping.Followers {
			e.flag(c.fConnected, f.Connected, s, f.ID)
			e.gauge(c.fAcked, float64(f.AckedLSN), s, f.ID)
			e.gauge(c.fSent, float64(f.SentLSN), s, f.ID)
			e.gauge(c.fLagEvents, float64(f.LagEvents), s, f.ID)
			e.gauge(c.fLagBytes, float64(f.LagBytes), s, f.ID)
			e.flag(c.fDropped, dropped[f.ID], s, f.ID)
			e.counter(c.fBatches, f.BatchesSent, s, f.ID)
			e.counter(c.fResent, f.BatchesResent, s, f.ID)
			e.counter(c.fBytes, f.BytesSent, s, f.ID)
			e.counter(c.fAcks, f.Acks, s, f.ID)
			e.counter(c.fRefused, f.Refusals, s, f.ID)
			e.counter(c.fRewinds, f.Rewinds, s, f.ID)
			e.counter(c.fTimeouts, f.Timeouts, s, f.ID)
			e.counter(c.fDisk, f.DiskReads, s, f.ID)
			e.refusals(c.fHelloRefused, f.Refused, s, f.ID)
		}
		sh, err := c.l.Shard(st.Shard)
		if err != nil {
			continue
		}
		ls := sh.Ledger().Stats()
		for _, o := range []struct {
			name string
			n    uint64
		}{{"fresh", ls.Fresh}, {"replay", ls.Replay}, {"in_flight", ls.InFlight}, {"conflict", ls.Conflicts}} {
			e.counter(c.claims, o.n, s, o.name)
		}
		for _, o := range []struct {
			name string
			n    uint64
		}{{"complete", ls.Completed}, {"fail", ls.Failed}, {"release", ls.Released}, {"extend", ls.Extended}, {"not_owner", ls.NotOwner}} {
			e.counter(c.decisions, o.n, s, o.name)
		}
		applied, epoch := sh.Position()
		c.store.emit(e, st.Shard, applied, epoch, sh.StoreStats(), sh.Store().View())
	}
}
