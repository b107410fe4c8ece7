// Package follower is the embeddable oncewal follower node for one shard: it
// opens a Pebble v2 store, wires the session HWM tracker, the idempotency-key
// window and the segment receiver, serves a transport, and recovers after a
// restart or a crash.
//
//	f, err := follower.Open(dir, &follower.Options{Shard: 3})
//	go f.Serve(ctx, dialer)      // redials, resumes from the durable position
//	...
//	f.Close()                    // stops Serve, flushes, closes the store
//
// # Recovery
//
// Everything the receiver decides commits in one Pebble batch per shipped
// batch: the applied state, the HWM advances, the window journal, the applied
// LSN and the leader epoch. Reopening the directory therefore resumes from a
// consistent cut: the position and epoch come from the m/ keys, HWMs are read
// through from h/ on demand, and the window is rebuilt from the journal (w/j/),
// after a clean Close and after a crash alike. No snapshot is needed: the
// journal is written with each batch, so the window a follower restarts with
// is exactly the window it had at its last commit.
//
// # Store failure
//
// Pebble v2 treats a failed WAL write or sync as fatal and reports it through
// Logger.Fatalf, whose default implementation exits the process. The follower
// installs replication.FatalLogger, which panics with *replication.FatalError
// on the committing goroutine; the receiver recovers it, returns
// replication.ErrStoreFailed, and refuses every later batch. Serve returns that
// error. The embedder must Close the follower and Open it again: the reopened
// store holds either the whole failed batch or none of it, and the leader
// resends from the position the follower reports in its handshake.
//
// # Pebble key layout
//
// One store per follower shard. Every value begins with a one-byte format
// version (currently 1).
//
//	h/<session ID:16>              session HWM record (package session)
//	h/...                          the tracker's WAL clock (package session)
//	s/<session ID:16><user key>    session state rows (package session)
//	m/position                     applied LSN, u64 LE
//	m/epoch                        highest committed leader epoch, u64 LE
//	m/format                       store format (1); marks an oncewal store
//	w/j/<last LSN:8 BE>            window journal: the batch's recorded keys
//
// # Invariants
//
//  1. An event is applied at most once: after its batch commits, its SeqNo is
//     at or below its session's HWM, its LSN at or below the applied position,
//     and its key in the journal; none of them moves backwards.
//  2. No event is skipped: batches apply in LSN order (a batch beyond
//     position+1 is refused) and a SeqNo gap refuses the whole batch.
//  3. State, HWMs, journal, position and epoch change in one Pebble batch.
//  4. In-memory HWMs, window, position and epoch change only after that batch
//     committed.
//  5. A batch from an epoch below the highest committed one is refused before
//     it touches anything.
package follower
