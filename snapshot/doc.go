// Package snapshot rebuilds a shard store from a consistent cut of another
// replica's store: the way a new follower, one behind the leader's retained
// WAL, a diverged follower or a deposed leader comes back without an
// operator copying files by hand (PostgreSQL's pg_basebackup, Raft's
// InstallSnapshot).
//
//	d, err := snapshot.NewDonor(db, &snapshot.DonorOptions{FS: fs, Dir: work, Describe: store.Describe})
//	m, st, err := snapshot.Fetch(ctx, d, fs, storeDir, want, nil) // into StagingDir(storeDir), verified
//	err = snapshot.Install(fs, storeDir)                          // atomic replace (Rebuild: both)
//	...
//	err = snapshot.Recover(fs, storeDir) // at every open: finish or undo an install a crash interrupted
//
// # The cut
//
// A snapshot is a Pebble checkpoint (DB.Checkpoint with its WAL flushed:
// hard links to the immutable sstables, copies of the rest) of the donor's
// store. Everything a shard store decides with lives in that one Pebble DB
// — the applied state (s/), the HWM table and HWM log (h/, hd/), the window
// journal (w/j/), the request ledger (l/), the applied LSN, epoch and last
// batch reference (m/), the store identity (m/identity) — and every batch
// writes them in one Pebble commit, so a checkpoint is a cut at a batch
// boundary: the rebuilt store reopens with the exact HWMs, window and
// ledger the donor had at the snapshot's LSN. Nothing the follower decides
// with is held only in memory: the in-memory window is rebuilt from the
// journal and the HWM cache is read through from h/ after replaying hd/.
// What only a leader keeps about its own followers (its replication slots,
// keyspace.LeaderOnly) is in the checkpoint too; follower.Rebuild deletes it
// from the staged store before the install, so a rebuilt store never
// inherits a donor's slots (promoted later, it would pin or release the WAL
// by another leader's followers' positions).
//
// # The manifest
//
// A Manifest names the cut (shard, epoch, applied LSN, the store identity as
// the donor recorded it), the Begin that took it (Serial: the donor's random
// name and a count) and every file with its size and BLAKE3 sum; its own
// BLAKE3 over all of that is the snapshot's ID. Two cuts of an idle store
// hold the same bytes, so without the Serial two fetchers beginning at once
// would share an ID, and one End would release one of their two pins while
// the other stayed for good. Fetch checks the manifest
// against what the caller wants (Want) before it writes anything: another
// shard or identity (ErrMismatch), an older epoch (ErrOlderEpoch), a donor
// whose cut is below the LSN the caller needs (ErrDonorBehind), a manifest
// whose sum does not match (ErrCorrupt).
//
// # The transfer
//
// Fetch reads every file in chunks (Options.ChunkSize) from a Source — a
// Donor in process, or the gRPC client of package grpctransport — paced to
// Options.RateLimit bytes per second (the knob that keeps a rebuild from
// starving replication on the donor; the Donor paces what it serves too,
// DonorOptions.RateLimit). A failed chunk read is retried from the same
// offset (Options.Retries, with backoff), so a dropped connection resumes
// where it stopped; if the donor no longer holds the snapshot
// (ErrUnknownSnapshot) Fetch starts over from a new one. Every file's sum is
// checked as it completes (a corrupted chunk: ErrCorrupt; a transfer that
// ends short: ErrTruncated), then the staged store is opened read-only and
// its applied LSN, epoch and identity are checked against the manifest
// (Want.Describe). A chunk is hashed before it is written: a filesystem may
// scribble on a written buffer (Pebble's MemFS does in race builds).
//
// A snapshot the donor holds pins a checkpoint and, for a leader, the log
// from its LSN on (invariant 4) until it is released: by its fetcher's End,
// by the fetcher's next Begin (a HeldSource — Donor, Router, grpctransport's
// client — releases the snapshots it still serves to the same
// Options.Holder first: a Begin whose answer was lost, the fetch of a
// killed process that restarted), or after DonorOptions.IdleTimeout unread
// (2 min: a fetcher that never came back). DonorStats counts each
// (Ended, Superseded, IdledOut) and shows the oldest unread; a leader
// reports its pins in RetentionStats.SnapshotPins.
//
// # The install
//
// Install replaces the store directory D with the verified staging directory
// S (D.rebuild) in renames, with a marker file as the commit point:
//
//  1. S complete, every file and S synced (Fetch).
//  2. Marker D.rebuild-marker written and synced as D.rebuild-marker.tmp,
//     renamed into place; parent synced.
//     From here on the install rolls forward.
//  3. D renamed to D.rebuild-old; parent synced.
//  4. S renamed to D; parent synced.
//  5. D.rebuild-old removed, then the marker; parent synced.
//
// Recover, run by every open of a shard store before it reads the directory,
// finishes an install whose marker exists (steps 3–5, each idempotent) and
// otherwise removes a leftover staging directory: after a crash at any
// point the store opens as the old one or the new one, never a mix, and a
// half-written staging directory is never opened as a store.
//
// # Invariants
//
//  1. Nothing in the store directory changes until the snapshot is complete
//     and verified; every refusal (a typed error) leaves the old store as it was.
//  2. The marker exists exactly while the install is committed but unfinished.
//  3. A snapshot's applied LSN, epoch and identity are those of its own files,
//     never of the donor's memory.
//  4. A Donor pins its store's retained log (DonorOptions.Pin) from before
//     the cut until the transfer ends, its holder begins another, or it
//     idles out, so the rebuilt store can replicate on from the snapshot's
//     LSN + 1.
//  5. A Donor never cuts a closed store: its owner's Hold refuses the Begin
//     (ErrClosed wrapping leader.ErrClosed), and a store closed under
//     it gives ErrClosed wrapping pebble.ErrClosed, not Pebble's panic.
//     Fetch does not retry a closed donor's Begin: it returns at once.
package snapshot
