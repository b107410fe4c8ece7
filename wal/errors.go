package wal

import (
	"errors"

	"github.com/oncewal/oncewal/corruption"
)

// Sentinel errors. Every failure to decode or recover returns one of these,
// usually wrapped with context (segment name, offset, field) via fmt.Errorf("%w");
// test with errors.Is. Every decode failure (ErrCorrupt, ErrChecksum,
// ErrTruncated, ErrVersion, and ErrTooLarge when it is read rather than
// written) also matches corruption.Err.
var (
	// ErrCorrupt: the bytes are structurally invalid (bad magic, unknown op
	// kind, reserved bits set, non-minimal varint, LSN or shard mismatch,
	// trailing bytes, ...).
	ErrCorrupt = corruption.Mark(errors.New("wal: corrupt"))
	// ErrChecksum: a header or body CRC-32C does not match.
	ErrChecksum = corruption.Mark(errors.New("wal: checksum mismatch"))
	// ErrTruncated: the buffer or file ends before the length it announces.
	ErrTruncated = corruption.Mark(errors.New("wal: truncated"))
	// ErrTooLarge: a length exceeds MaxBodySize or MaxPayloadSize.
	ErrTooLarge = errors.New("wal: too large")
	// ErrVersion: the batch format version is not Version.
	ErrVersion = corruption.Mark(errors.New("wal: unsupported version"))
	// ErrBadSegmentName: a file name that claims to be a segment (".wal"
	// suffix) does not parse exactly.
	ErrBadSegmentName = errors.New("wal: bad segment name")
	// ErrInvalidEvent: a caller asked to encode an event or batch that the
	// format cannot represent canonically (unknown op, fields that do not
	// belong to the op, empty batch).
	ErrInvalidEvent = errors.New("wal: invalid event")
	// ErrNotWAL: the path is not a WAL directory: a regular file, or a
	// directory holding files that are neither segments nor lock files.
	ErrNotWAL = errors.New("wal: not a WAL directory")
	// ErrShardMismatch: a segment named for one shard holds a batch of
	// another. Always joined with ErrCorrupt.
	ErrShardMismatch = errors.New("wal: shard mismatch")
	// ErrLocked: another Writer — in this process or another — holds the
	// log of the shard in the directory (see LockName). The message names
	// the directory and the shard.
	ErrLocked = errors.New("wal: log locked by another writer")
	// ErrCompacted: the LSN asked for is below the first one the log still
	// retains (deleted by Writer.DeleteBelow, or the log starts above it);
	// a Reader never skips ahead silently.
	ErrCompacted = errors.New("wal: LSN compacted")
	// ErrNoBatchBoundary: no batch of the log ends exactly at the LSN asked
	// for (Reader.BatchEndingAt).
	ErrNoBatchBoundary = errors.New("wal: no batch ends at LSN")
	// ErrWriterFailed: an earlier write or sync of the Writer failed. The
	// Writer refuses all further work with the same error, which also wraps
	// the I/O error that caused it; reopening recovers (an fsync cannot be
	// retried safely: the kernel may have dropped the unsynced pages).
	ErrWriterFailed = errors.New("wal: writer failed (reopen to recover)")
	// ErrBadOptions: OpenWriter was given invalid WriterOptions (every
	// problem is listed in the joined error).
	ErrBadOptions = errors.New("wal: bad writer options")
	// ErrClosed: the Writer or Reader was closed.
	ErrClosed = errors.New("wal: closed")
)
