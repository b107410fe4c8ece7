// Package session owns what a follower knows about client sessions: their IDs,
// the leader-side SeqNo Sequencer, the follower-side high-water-mark Tracker,
// and the default session state machine (State).
//
// # Job
//
// Every session event carries (ID, SeqNo, leader timestamp). The leader's
// Sequencer numbers a session's events 1, 2, 3, …. A follower's Tracker keeps,
// per session, the highest SeqNo applied (HWM) and decides for each redelivered
// or new event: Apply (seq == HWM+1), Duplicate (seq <= HWM), Gap (seq > HWM+1:
// refuse the batch, never apply past a hole), Closed (session closed, seq >
// HWM), TooOld (unknown session, timestamp older than WAL clock − horizon).
// SeqNo 0 means "no seqno": such events bypass the Tracker (Check/Advance
// return ErrZeroSeq).
//
// # Transactions
//
// The Tracker and State write into the caller's *pebble.Batch so that the HWM
// commits atomically with the state the event changed. A TrackerTx (one per
// batch; txs are serialized) sees its own pending advances, so several events
// of one session in one batch check against each other. Advance/MarkClosed only
// record pending state; Flush writes one Set per changed session plus the WAL
// clock into the batch and MUST be called before the batch commits. After the
// caller's commit succeeds it calls tx.Commit, which publishes to the cache;
// after a failure, tx.Abort, which leaves no trace. TrackerTx.CollectGarbage
// writes its deletions straight into the batch (no Flush needed for them).
//
// TrackerTx.Prefetch(id) is a hint with no effect on state: a caller that
// holds a whole batch prefetches its sessions before checking them, so the
// cache misses overlap instead of coming one per Check.
//
// # The HWM cache
//
// An exact LRU (cache.go) built like the idempotency window: a linear-probing
// table of 8-byte slots (32-bit hash and entry index) over an array of
// 32-byte entries (ID, HWM with the closed flag in its top bit, last
// activity) with the recency links in a parallel array. No pointers, so the
// GC never scans it; a hit reads one slot and one entry (two cache lines)
// and allocates nothing; about 64 B of heap per cached session, fresh or
// churned (bench.BenchmarkTrackerCacheMemory; golang-lru/v2 held 131 B
// fresh, 165 B churned). Lookups do not refresh recency (a random list
// write costs more than the lookup); filling from Pebble and committing a
// write do. golang-lru/v2 is the reference the cache is tested against.
//
// A StateTx writes through on every op and remembers pending counters, so an
// Add after a Put/Add/Delete of the same key in the same batch builds on it.
//
// # Invariants
//
//  1. The HWM never moves backwards: Advance accepts only HWM+1 (1 for an
//     unknown or expired session), anything else is a typed error and no change.
//  2. The in-memory view (cache, WAL clock, GC cursor) changes only in Commit,
//     i.e. after the caller's batch committed; a batch that fails or is never
//     committed leaves no trace in memory or on disk. Changes never flushed into
//     the batch are not published (their sessions are dropped from the cache,
//     so memory never claims more than disk holds).
//  3. The cache holds only committed records. It is bounded (LRU, default 1M
//     sessions); a miss reads Pebble, which is authoritative. A tx's pending
//     changes live in the tx, never in the cache, so eviction can drop any
//     entry at any time and lose nothing but a Pebble read.
//  4. WAL clock rule: the clock is the largest leader timestamp of any committed
//     Advance/MarkClosed — never the follower's own clock — so every follower
//     fed the same log decides the same. It is persisted at ClockKey in the same
//     batch and restored by OpenTracker. A tx sees its own pending clock.
//  5. Expiry: a session whose last activity (max timestamp of its advanced or
//     closed events) is older than clock − RetentionHorizon is expired and
//     counts as unknown, whether or not CollectGarbage has deleted its row yet,
//     so decisions never depend on when a follower ran GC. Closing a session
//     does not shorten its retention: its applied events can still be
//     redelivered, and were its row gone early, a redelivered seq 1 would be
//     applied again as a new session. GC only reclaims space; it runs inside a
//     TrackerTx (its deletions go into the same batch and reach the cache at
//     Commit) so it cannot race an Advance.
//  6. Horizon rule: RetentionHorizon must exceed the longest redelivery delay,
//     measured on the WAL clock (clock at delivery − the event's timestamp),
//     and the longest pause of a live session. Because lastTS is the session's
//     maximum timestamp, a redelivered event of an expired or collected session
//     always has ts <= lastTS < clock − horizon and is refused as TooOld, never
//     applied as new. What a too-short horizon breaks is the other direction:
//     an event first delivered later than the horizon is refused as TooOld
//     (seq 1) or checks as Gap (seq > 1), and a session that pauses longer than
//     the horizon is over — its next SeqNo checks as Gap, which a receiver must
//     refuse. The leader must therefore expire sessions by the same rule (stop
//     sequencing them, Sequencer.Forget) and clients open a new session.
//
// # Key layout (values start with a format-version byte, 1)
//
//	h/ + ID(16)      → 1 | HWM u64 LE | lastTS i64 LE | flags (bit0 closed)   HWMPrefix
//	h/clock          → 1 | WAL clock i64 LE                                   ClockKey
//	s/ + ID(16) + k  → 1 | user value (Add: i64 LE, 8 bytes)                  StatePrefix
//
// ClockKey is 7 bytes, every HWM key 18, so scans of h/ tell them apart.
//
// # Tests
//
// TestTrackerAgainstModel drives the Tracker (tiny cache, aborts, batches never
// committed, GC, reopen) against a plain map model, checking after every event
// that the cache holds exactly committed records; ONCEWAL_LONG=1 runs it 50x
// longer. TestHWMCacheAgainstLRU checks the cache's answers, contents and
// eviction order against golang-lru/v2. Benchmarks live in
// bench/tracker_test.go.
package session
