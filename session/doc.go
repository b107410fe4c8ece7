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
// after a failure, tx.Abort, which leaves no trace. A StateTx writes through on
// every op and remembers pending counters so an Add after a Put/Add/Delete of
// the same key in the same batch builds on it.
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
//     sessions); a miss reads Pebble, which is authoritative.
//  4. WAL clock rule: the clock is the largest leader timestamp of any committed
//     Advance/MarkClosed — never the follower's own clock — so every follower
//     fed the same log decides the same. It is persisted at ClockKey in the same
//     batch and restored by OpenTracker. A tx sees its own pending clock.
//  5. Expiry: a session whose last activity (max timestamp of its advanced
//     events) is older than clock − RetentionHorizon is expired and counts as
//     unknown, whether or not CollectGarbage has deleted its row yet. Closing a
//     session does not shorten this: a closed session's events can still be
//     redelivered, and were its row gone, a redelivered seq 1 would be applied
//     as a new session. GC therefore only reclaims space, never changes a
//     decision, and runs inside a TrackerTx so it cannot race an Advance.
//  6. The horizon must exceed the longest redelivery delay (in WAL-clock time):
//     a redelivered event of an expired session has ts <= lastTS < clock −
//     horizon and is refused as TooOld; if redelivery could take longer than the
//     horizon after a session's last activity ... it still would be TooOld, but
//     an event that was never applied and arrives that late would be dropped.
//     Likewise a session idle longer than the horizon is over: its next SeqNo
//     (> 1) checks as Gap forever, so the leader must expire sessions by the same
//     rule (Sequencer.Forget) and clients open a new session.
//
// # Key layout (values start with a format-version byte, 1)
//
//	h/ + ID(16)      → 1 | HWM u64 LE | lastTS i64 LE | flags (bit0 closed)   HWMPrefix
//	h/clock          → 1 | WAL clock i64 LE                                   ClockKey
//	s/ + ID(16) + k  → 1 | user value (Add: i64 LE, 8 bytes)                  StatePrefix
//
// ClockKey is 7 bytes, every HWM key 18, so scans of h/ tell them apart.
package session
