// Package metrics exports oncewal's figures to Prometheus and answers health
// checks. It owns no state: each Collector reads the Stats of what it
// watches at scrape time (the counters live in the library, which stays
// free of Prometheus), and nothing registers globally — the embedder
// registers the Collectors it wants with its own prometheus.Registry.
//
//	reg := prometheus.NewRegistry()
//	reg.MustRegister(metrics.NewNodeCollector(node))     // or NewFollowerCollector, NewLeaderCollector
//	http.Handle("/", metrics.Handler(reg, metrics.NodeReady(node, 30*time.Second)))
//
// Handler serves /metrics (the Prometheus text format), /healthz (200 while
// the process serves HTTP: liveness) and /readyz (200 when the readiness
// check passes, else 503 with the reason).
//
// A single store that follower.Run serves is reopened after every rebuild:
// give NewFollowerCollectorOf and FollowerReadyOf a CurrentFollower fed by
// Run's hooks, not the first Follower (the CLI does).
//
// # Names
//
// Prometheus conventions: counters end in _total, durations are histograms
// in seconds (_seconds), times are unix seconds (_timestamp_seconds),
// positions are gauges. Every metric of a shard carries the label shard;
// the leader's per-follower metrics also follower. The metrics of a shard's
// store — what its receiver decided — have one name set with two prefixes:
// oncewal_follower_ for a follower's stores, oncewal_leader_store_ for the
// local stores a leader applies its own log to.
//
// Store metrics (prefix oncewal_follower_ or oncewal_leader_store_):
//
//	applied_lsn                     gauge    applied (and acknowledged) LSN
//	epoch                           gauge    highest leader epoch committed
//	applied_wal_time_seconds        gauge    leader timestamp of the newest event applied
//	batches_total                   counter  batches offered to the receiver
//	batches_committed_total         counter  batches committed to Pebble
//	batches_duplicate_total         counter  batches wholly at or below the applied LSN
//	batches_refused_total{reason}   counter  seq_gap, out_of_order, stale_epoch, wrong_shard, corrupt, apply_error
//	received_bytes_total            counter  bytes of the batches offered
//	events_total{outcome}           counter  applied, discarded_position, discarded_hwm, discarded_window,
//	                                         discarded_in_batch, skipped_closed, skipped_too_old, refused
//	                                         (they sum to every event received: the receiver's accounting identity)
//	commit_duration_seconds         histogram Pebble commit of a batch, fsync included
//	wal_fsync_duration_seconds      histogram Pebble's WAL fsyncs (its LogWriter metrics)
//	window_keys                     gauge    idempotency keys in the window
//	window_capacity_keys            gauge    the window's capacity
//	hwm_cache_sessions              gauge    session HWMs cached in memory
//	ledger_records_total{result}    counter  request-ledger records: applied, stale
//	ledger_sweeps_total             counter  ledger expiry sweeps
//	ledger_swept_entries_total      counter  entries the sweeps deleted
//	store_background_errors_total   counter  Pebble background errors (flush, compaction)
//	store_write_stalled             gauge    1 while Pebble holds the store's writes back (follower.Stats.WriteStalled)
//	store_disk_full                 gauge    1 while the disk is below store.Options.MinFreeBytes (nothing applied)
//
// Follower link and node (prefix oncewal_follower_):
//
//	connected                           gauge    1 while a connection to the leader is in service
//	lag_seconds                         gauge    follower.Stats.WALLag: WAL-clock lag while batches arrive
//	last_batch_timestamp_seconds        gauge    when the last batch arrived
//	connection_attempts_total           counter  dials
//	connection_failures_total{kind}     counter  failed attempts: transient, permanent (a refusal no retry fixes)
//	refusals_total{reason}              counter  permanent failures: wrong_shard, fenced, stale_epoch, diverged,
//	                                             behind_retention, unknown_follower, identity_mismatch,
//	                                             bad_follower_id, bad_hello, auth (a certificate either
//	                                             side refused)
//	store_reopens_total                 counter  (node) reopens of a shard whose store failed
//	store_rebuilds_total                counter  times the store was replaced by a donor's snapshot
//	                                             (--rebuild=auto; a follower's and a node's)
//	store_down                          gauge    (node) 1 while the shard's store is failed
//	node_batches_refused_total{reason}  counter  (node, no shard label) wrong_shard, corrupt
//
// Leader (prefix oncewal_leader_):
//
//	epoch, last_lsn                         gauge
//	connections_accepted_total              counter
//	hello_refusals_total{reason}            counter  bad_hello, unknown_follower, diverged, behind_retention, other
//	wal_first_lsn, wal_retained_bytes       gauge
//	wal_segments_deleted_total              counter
//	wal_snapshot_pins, wal_snapshot_pin_lsn gauge    snapshots served that pin the WAL; the lowest LSN pinned
//	retention_errors_total                  counter
//	ledger_claims_total{outcome}            counter  fresh, replay, in_flight, conflict
//	ledger_decisions_total{decision}        counter  complete, fail, release, extend, not_owner
//	follower_connected{follower}            gauge
//	follower_acked_lsn, follower_sent_lsn   gauge
//	follower_lag_events, follower_lag_bytes gauge    log the follower has not acknowledged
//	follower_slot_dropped                   gauge    1 when retention dropped the follower's slot
//	follower_batches_sent_total, follower_batches_resent_total, follower_sent_bytes_total,
//	follower_acks_total, follower_batches_refused_total, follower_rewinds_total,
//	follower_timeouts_total, follower_disk_reads_total                     counter
//	follower_hello_refusals_total{reason}   counter
package metrics
