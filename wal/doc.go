// Package wal defines oncewal's log format — events, batches and segment
// files — and the Writer and Reader that append and iterate them.
//
// The leader appends session events through a Writer; the shipper reads raw
// batches with a Reader and ships them; the follower decodes them with
// DecodeBatch. A batch is the unit that is shipped and applied atomically.
//
// # Batch format (version 2)
//
// All integers are little-endian. A batch is a 44-byte header followed by a
// body of Count encoded events:
//
//	 0       4       6       8              12                      20
//	+-------+-------+-------+---------------+-----------------------+
//	| magic |version| flags |    shard      |        epoch          |
//	| "OWAL"|  u16  |  u16  |     u32       |         u64           |
//	+-------+-------+-------+---------------+-----------------------+
//	20                      28      32      36      40      44
//	+-----------------------+-------+-------+-------+-------+
//	|       first LSN       | count |bodylen|bodycrc|hdrcrc |
//	|          u64          |  u32  |  u32  |  u32  |  u32  |
//	+-----------------------+-------+-------+-------+-------+
//	44                                        44+bodylen
//	+--------------------- ... ----------------------+
//	| event 0 | event 1 | ...          | event n-1   |
//	+--------------------- ... ----------------------+
//
// Header fields:
//   - magic: bytes 'O' 'W' 'A' 'L' (0x4C41574F as u32).
//   - version: 2. Magic and version stay at bytes 0–5 in every future
//     version, because the version decides how the rest is read.
//   - flags: reserved, must be 0 (ErrCorrupt otherwise).
//   - shard: shard ID of the log the batch belongs to.
//   - epoch: leader epoch that wrote the batch.
//   - first LSN: LSN of event 0; event i has LSN first+i. LSN 0 is never used:
//     the first LSN of a log is 1.
//   - count: number of events, ≥ 1 and ≤ bodylen/27 (the smallest event).
//   - bodylen: body bytes, ≤ MaxBodySize (64 MiB).
//   - bodycrc: CRC-32C (Castagnoli) of the body.
//   - hdrcrc: CRC-32C of header bytes 0–39, so a length is trusted only
//     after the header that carries it checks out.
//
// # Event format
//
//	 0    1      2                 18                26
//	+----+------+-----------------+-----------------+---------+-------------+---------+
//	| op |flags |   session ID    |  time (int64)   | seq     | [idem key]  | payload |
//	| u8 |  u8  |    16 bytes     |  unix nanos     | uvarint | 16 B if f&1 | per op  |
//	+----+------+-----------------+-----------------+---------+-------------+---------+
//
// Event fields:
//   - op: 1 open, 2 put, 3 delete, 4 add, 5 close; request-ledger records 6
//     claim, 7 complete, 8 release, 9 fail, 10 extend; key-space ops
//     (package kv) 11 kvput, 12 kvdelete. 0 and 13–255 are rejected with
//     ErrCorrupt (13–15 reserved for future core ops, 16–255 for extension
//     ops).
//   - flags: bit 0 = idempotency key present. An explicit flag, never "zero key
//     means absent". Bits 1–7 reserved, must be 0.
//   - seq: session SeqNo (0 = no seqno), minimal uvarint.
//   - payload: open, close: nothing. put: uvarint keylen, key, uvarint vallen,
//     value. delete: uvarint keylen, key. add: uvarint keylen, key, zigzag
//     varint delta. claim, complete, release, fail, extend: uvarint length + the
//     ledgerrecord.Record body (Record.AppendBody), which must itself be
//     canonical (ledgerrecord.Check; a bad body is ErrCorrupt, and
//     ErrInvalidEvent when encoding). kvput: uvarint keylen, key, uvarint
//     vallen, value, uvarint version (the key's new version, 1..2^63-1,
//     carried in Event.Delta). kvdelete: uvarint keylen, key. Both need a
//     key of at least one byte (the principal-scoped key, kv.Scoped); an
//     empty key or a version of 0 is ErrCorrupt (ErrInvalidEvent when
//     encoding). keylen+vallen ≤ MaxPayloadSize (16 MiB).
//
// Ledger events carry the decision's WAL time as the event time, session ID
// zero, SeqNo 0 and no idempotency key (LedgerEvent): a follower admits them
// by position only, the ledger table's apply rules make a redelivered record
// harmless, and the window's slots stay for operations (keys on ledger
// events written by older leaders are ignored by the receiver). A
// leader puts an operation's data events and its complete record in one
// batch, so every node records the outcome atomically with the effect.
//
// Varints must be minimal (an overlong encoding is ErrCorrupt), so every event
// has exactly one encoding. The events must fill the body exactly. op followed
// by the payload is also what Event.AppendOpBytes returns, the canonical op
// bytes hashed by idempotency.DeriveKey.
//
// # Decoding untrusted bytes
//
// Batches arrive from the network, so decoding assumes nothing: every length is
// checked against the maxima and against the bytes actually present before it
// is used; no allocation is sized by a length read from the input (DecodeBatch
// grows the event slice by Count only after checking Count ≤ BodyLen/27 and
// BodyLen ≤ len(buf)). Failures are the sentinel errors ErrCorrupt,
// ErrChecksum, ErrTruncated, ErrTooLarge and ErrVersion, wrapped with context;
// nothing panics. Decoded Key/Value slices alias the input buffer.
//
// # Segments
//
// A segment is an append-only file of consecutive batches of one shard,
// followed by zeros written ahead (below), with no file header (each batch
// header carries magic, shard and LSNs). Its name is SegmentName(shard,
// firstLSN): "SSSSSSSSSS-LLLLLLLLLLLLLLLLLLLL.wal", the
// shard as 10 decimal digits and the LSN of its first batch as 20 decimal
// digits (both the full range of their types), so names of one shard sort by
// LSN and several shards can share a directory. ParseSegmentName accepts only
// that exact form (ErrBadSegmentName).
//
// A WAL directory holds segments, lock files (LockName, below) and, after a
// crash during recovery, a segment's temporary copy (the segment's name plus
// ".tmp", removed by the next OpenWriter of its shard), and nothing else. A
// ".wal" file with a malformed name is ErrBadSegmentName, not a guess; any
// other entry makes it a non-WAL directory, and OpenWriter, OpenReader and
// ListShards refuse it with ErrNotWAL, as they refuse a regular file, so a
// misconfigured path is never written into or served. ListShards tells which
// shards' segments a directory holds.
//
// Segment invariants: the first batch of a segment starts at the LSN in its
// name; each batch starts at the LSN after the previous batch; the next
// segment starts at the LSN after the last batch of the previous one; all
// batches carry the segment's shard.
//
// # Writer
//
// The Writer appends each batch with one write to the last segment and rolls
// to a new segment when the batch would push a non-empty segment past
// SegmentSize (a larger batch gets a segment of its own). A finished segment
// is synced before the next one is created, so only the last segment can
// have a torn tail.
//
// # Zeros written ahead
//
// The Writer fills the active segment with zeros ahead of its appends
// (WriterOptions.ZeroAhead: 1 MiB at a time by default, never past
// SegmentSize), as PostgreSQL fills its WAL segments: an append then writes
// over bytes the file already has, and its fdatasync writes data pages
// only, with no file size or block allocation to commit — on ext4 about
// half the CPU and wall time of a sync that grows the file. A segment is
// thus its batches followed by zeros, and a rolled segment keeps the zeros
// it did not use. A batch never starts with a zero byte (the magic), so a
// header of zeros after the last batch is the end of a segment's data.
// Segments and RetainedBytes count the batches' bytes, not the zeros. A log
// written without zeros ahead (ZeroAhead < 0, or an older binary) is the
// case of none, and reads and recovers the same.
//
// # Recovery
//
// OpenWriter recovers the log: it walks the batch headers of every segment
// (checking framing, shard and LSN continuity without reading bodies; a
// non-last segment must end with its last batch, followed by nothing but
// zeros) and verifies the last segment fully, body CRCs included. What
// follows the last valid batch of the last segment is judged up to its data
// end, past the last non-zero byte of the file: zeros beyond it were
// written ahead, or are pages that never reached the disk, which is the
// same to the log. Nothing before the data end means the log ends there
// (zeros written ahead: kept, and written over by the next append).
// Otherwise those bytes are a torn tail — an append that the crash cut
// short, which was never acknowledged (SyncEveryBatch) — and are cut, iff:
//
//   - fewer than HeaderSize bytes remain before the file's end or the data
//     end (a partial header), or
//   - a valid header announces a batch that runs past the end of the file, or
//   - the remaining bytes are one batch whose header is valid but whose body
//     CRC fails, and an all-zero 512-byte sector at a sector-aligned file
//     offset overlaps it (a write that reached the file but not all its
//     pages: etcd's torn-write rule; the sector holding its end runs into
//     the zeros after it, so a lost last page that holds only the end of
//     the batch shows too), or
//   - the header at the end of the last valid batch does not decode, the
//     remaining bytes are no longer than one batch (HeaderSize+MaxBodySize),
//     they show pages that never reached the disk — they start with zeros up
//     to a sector boundary, or contain an all-zero sector-aligned 512-byte
//     sector — and no valid header of a later batch of this log (the shard,
//     first LSN above the expected one) appears anywhere in them (the same
//     torn write, with the page holding its header lost; a later batch would
//     mean the damaged one had been acknowledged), or
//   - the remaining bytes are no more than MaxUnsyncedBytes (1 MiB) and start
//     with a batch whose header does not decode or whose body CRC fails, with
//     pages that never reached the disk — zeros from its start up to a sector
//     boundary, or an all-zero sector-aligned sector overlapping it —
//     whatever follows: the batches of one group commit (below), written
//     together and never synced, reach the disk in any order, so an intact
//     later batch of the group proves nothing. The bound counts a later
//     batch whole, also where it ends in zeros of its own past the data end.
//
// With SyncEveryBatch what is unsynced at a crash is one append, or the
// batches of a group commit: appenders that write while a sync is in flight
// and wait for the next, at most MaxUnsyncedBytes together (the Writer syncs
// before going past it), so these rules cover every crash image (proved by
// a crash sweep with Pebble's crashable MemFS at every file operation of a
// workload with rolls, retention and reopens, and at every operation of the
// recovery itself, and by crash images of groups of unsynced batches with
// holes). The price of the last rule: a zeroed sector in synced data within
// the last MiB of the log reads as a torn tail and is cut, as in Pebble
// before its WAL recorded the synced offset (this format has no room for it)
// and in PostgreSQL. Under SyncManual several unsynced appends may have
// holes beyond that bound, and a crash image can be refused as corrupt.
//
// The tail is cut by copying the valid prefix to the segment's temporary
// file, syncing it, renaming it over the segment and syncing the directory
// (vfs.File has no Truncate): a crash at any point leaves the old segment,
// cut again on the next open, or the new one.
//
// Anything else is corruption and OpenWriter fails with a typed error naming
// the segment and offset: a bad batch followed by more data, a complete batch
// with a bad CRC and no sign of a torn write, any defect in a non-last
// segment, a gap or overlap in LSNs, a batch of another shard than the
// segment's name says (ErrShardMismatch, with ErrCorrupt).
//
// OpenWriter validates all of this before it creates the lock file or cuts
// anything, so a refused open (ErrNotWAL, ErrBadSegmentName, corruption)
// leaves the directory byte for byte as it was. Where the shard's lock file
// already exists it takes the lock first (so a held lock is ErrLocked at
// once, without reading the log) and validates under it; where it does not,
// it validates read-only, creates the lock file and takes the lock, and scans
// again only if the log changed in between (segment names or the last
// segment's size) or had a torn tail. OpenReader checks the directory and
// the first batch header of every segment (decodes, shard, LSN in the name);
// defects further in surface from Next.
//
// The Writer serializes writes with a mutex, so it may be shared by
// goroutines; each Append is one batch with consecutive LSNs. Syncs are
// group commits, as in Pebble's LogWriter and PostgreSQL: Append is Write
// then SyncTo; a sync runs outside the mutex and covers every batch written
// before it started; an appender whose batch a sync in flight does not cover
// waits for it and then syncs, for every batch written meanwhile (one
// fdatasync for all of them); no SyncTo, hence no Append, returns before the
// sync that covers its batch. The active segment is neither rolled nor
// closed under a sync in flight. Write returns the batch's encoded bytes —
// those in the log — so a caller applies and ships them without encoding the
// batch again. After a failed
// write, sync or segment creation it refuses all further work with the same
// error, which wraps ErrWriterFailed and the cause (an fsync error cannot be
// retried safely): a failed sync fails every batch it was to cover and every
// later one, while batches an earlier sync covered stay durable; Close
// returns it too and still releases the lock. What
// part of a failed append reached the file is a torn tail: a Reader stops
// there with io.EOF, and the reopen that recovers cuts it (or keeps the
// batch, if it is whole: it was never acknowledged, but is valid).
//
// # Epochs never go back
//
// A log never holds a batch of an older epoch after a newer one (invariant
// 5 of the design): the Writer knows its last batch's epoch, also after
// recovery (LastEpoch), and refuses an older one (ErrEpochRegression)
// before writing anything. A log found with a regression — written by a
// binary without this check — is corrupt: OpenWriter, Check and InspectFS
// refuse it with an *EpochRegressionError naming the segment, offset, LSN
// and both epochs, and changes nothing. Which epoch may write is the
// caller's to fence; that the log only moves forward is the Writer's.
//
// CutEpochRegression is the way out for such a log: it moves the first
// regressing batch and everything after it, verbatim, into a side file and
// cuts the log before it. That loses nothing acknowledged. A batch reaches
// the log after a batch of a newer epoch only from a leader that serves
// below the epoch its own log already holds, and such a batch is refused
// everywhere it could count: the leader applies its own batch to its store
// before answering (leader.LedgerLog: that store has applied the
// newer batches, so it refuses it with replication.ErrStaleEpoch, the
// append fails and the log is failed for every later append — nothing more
// of that leader is acknowledged); a follower applies in LSN order, so it
// has applied the newer batch before it is offered the stale one and
// refuses it the same way (store.Receiver's epoch fence), and no
// follower acknowledges what it refused; a snapshot is cut from a store,
// which never holds it. Everything after the first regressing batch was
// written by the same failed leader, and is refused for the same reason.
//
// # Filesystem
//
// Every file operation — segment create, open, read, write, sync, rename,
// remove, directory listing and sync, lock — goes through a Pebble vfs.FS
// (WriterOptions.FS, OpenReaderFS, ListShardsFS; default vfs.Default), so
// tests crash the log with vfs.NewCrashableMem and CrashClone and inject I/O
// errors with vfs/errorfs. OpenWriter syncs the parent of every directory it
// creates. Segment data is made durable with File.SyncData (fdatasync on
// Linux: the file size, needed to read appended data, is flushed with it).
//
// # Lock
//
// Only one Writer may have a shard's log open at a time. OpenWriter takes an
// exclusive lock (vfs.FS.Lock: fcntl on Unix) on the shard's lock file in the
// directory, LockName(shard) = "SSSSSSSSSS.lock", and holds it until Close.
// A second OpenWriter of the same shard and directory — from this process,
// under any spelling of the path, or from another process — fails at once
// with ErrLocked naming the directory and shard; it never waits. Shards
// sharing a directory lock independently. A failed OpenWriter releases the
// lock. The lock file is never removed (removing it could let two openers
// lock two different files of one name). Readers do not lock.
//
// # Retention
//
// A log need not start at LSN 1: it starts at the first LSN of its oldest
// segment (Writer.FirstLSN), either because it was created there
// (WriterOptions.FirstLSN) or because Writer.DeleteBelow deleted older
// segments. DeleteBelow(lsn) removes whole segments all of whose LSNs are
// below lsn, oldest first, never the active (last) segment, and syncs the
// directory after each removal, so a crash or an error part-way leaves a
// contiguous suffix of the log. Writer.RetainedBytes is the size of all
// retained segments.
//
// Nothing below the first retained LSN is ever skipped silently: a Reader
// asked for such an LSN (Seek, or Next from such a position) returns
// ErrCompacted; Seek(0) means "from the oldest retained batch". A Reader
// reading a segment that is deleted under it keeps reading that segment (an
// open file stays readable on Unix) and continues into the next one if it is
// still there; a Reader that must open a deleted segment returns
// ErrCompacted. OpenReader does not fail when DeleteBelow deletes segments
// it listed before it could check them: they are compacted, like any other.
//
// A batch's identity is its Header: the header CRC (Header.HeaderCRC)
// covers shard, epoch, LSNs, count, length and body CRC. Reader.BatchEndingAt
// finds the batch that ends at an LSN by headers alone (ErrNoBatchBoundary
// when none does), so a leader can check that a follower's last applied
// batch is in its log.
//
// # Readers tailing a live writer
//
// A Reader returns io.EOF when the bytes after its position are an incomplete
// batch or nothing, and resumes from the same position on the next call, so
// it can follow a Writer in the same directory. It trusts that the bytes below
// the file size it observed are written (true for write(2) on Linux) and that
// a header of zeros is the end of what was appended, and it only moves to
// the next segment after the current one is complete. Over zeros written
// ahead, a batch being written can be seen in part: a Reader in the
// Writer's process is bounded by its NextLSN (Writer.OpenReader,
// Reader.Bound) and never reads one; an unbounded Reader reports it as a
// header that does not decode or a body whose CRC fails, and reads it
// whole on a later call. A Reader
// can see a batch before the Writer has synced it; Writer.DurableLSN says
// what is durable. A Reader never truncates: on a crashed log that no Writer
// has recovered yet, a torn tail reads as io.EOF (incomplete batch) or as a
// typed error (garbage or zeroed header, torn body).
//
// # Long tests
//
// Set ONCEWAL_LONG=1 to run the exhaustive bit-flip and torn-tail tests on
// larger batches, and the crash sweep with 8 random crash images per file
// operation and unsynced share and more of their recoveries crashed, for
// each of three ZeroAhead settings (30,440 images and ~195,000 crashed
// recoveries, ~95 s beside other work). Fuzz longer with, e.g.,
// go test -fuzz FuzzDecodeBatch -fuzztime 5m ./wal/
package wal
