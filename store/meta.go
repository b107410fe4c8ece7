package store

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/oncewal/oncewal/corruption"
	"github.com/oncewal/oncewal/wal"

	"github.com/cockroachdb/pebble/v2"
	"github.com/oncewal/oncewal/internal/keyspace"
)

// The store's replication metadata (keyspace.Meta keys) and its one codec:
// the Receiver's commits and a leader raising its epoch (OpenLedgerLog) both
// stage these keys through the functions below.
//
// Two value shapes, each led by metaVersion:
//
//	u64:       version | value u64 LE                                   (9 bytes)
//	batch ref: version | LSN u64 LE | epoch u64 LE | header CRC u32 LE  (21 bytes)
//
// A batch ref records the identity (wal.BatchRef) of the batch ending at LSN; the
// LSN lets a reader tell a current value from one left behind by a binary
// that advanced the position without writing the key: such a value, like a
// missing key, means unknown.
var (
	keyPosition = []byte(keyspace.MetaPosition) // u64: applied LSN
	keyEpoch    = []byte(keyspace.MetaEpoch)    // u64: highest committed epoch
	keyFormat   = []byte(keyspace.MetaFormat)   // u64: store format (StoreFormat)
	// keyEpochStart is written by a promoted leader (LedgerLog) when it
	// raises the epoch: u64, first LSN of the new epoch.
	keyEpochStart = []byte(keyspace.MetaEpochStart)
	// keyLastBatch identifies the batch that ends at the applied position,
	// written with it in every commit: a batch ref.
	keyLastBatch = []byte(keyspace.MetaLastBatch)
	// keyEpochPrev is written with keyEpochStart: the identity of the batch
	// ending just before the epoch's first LSN (a batch ref), the
	// EpochBoundary.Prev a promoted leader checks hellos against.
	keyEpochPrev = []byte(keyspace.MetaEpochPrev)
	// keyLeader marks a store a leader made its own: u64, the epoch at
	// which it raised the store's epoch (stageEpoch). Leader-only: a store
	// rebuilt from a snapshot never has it.
	keyLeader = []byte(keyspace.MetaLeader)
)

const metaVersion = 1

// StoreFormat is written at keyFormat by the first commit. A store without it
// is not an oncewal follower store.
const StoreFormat = 1

const (
	metaU64Size   = 1 + 8
	lastBatchSize = 1 + 8 + 8 + 4 // a batch ref
)

func appendMetaU64(dst []byte, v uint64) []byte {
	return binary.LittleEndian.AppendUint64(append(dst, metaVersion), v)
}

func appendBatchRef(dst []byte, lsn uint64, ref wal.BatchRef) []byte {
	dst = append(dst, metaVersion)
	dst = binary.LittleEndian.AppendUint64(dst, lsn)
	dst = binary.LittleEndian.AppendUint64(dst, ref.Epoch)
	return binary.LittleEndian.AppendUint32(dst, ref.CRC)
}

// stageMeta stages what every commit changes: the applied position and the
// batch that ends there, the epoch when it changes, and the store format
// with the first commit.
func (r *Receiver) stageMeta(b *pebble.Batch, lsn, epoch uint64, last wal.BatchRef) error {
	// Pebble copies values into the batch, so r.meta is reused key by key.
	if err := b.Set(keyPosition, appendMetaU64(r.meta[:0], lsn), nil); err != nil {
		return err
	}
	if err := b.Set(keyLastBatch, appendBatchRef(r.meta[:0], lsn, last), nil); err != nil {
		return err
	}
	if epoch != r.epoch || r.applied == 0 {
		if err := b.Set(keyEpoch, appendMetaU64(r.meta[:0], epoch), nil); err != nil {
			return err
		}
	}
	if r.applied == 0 {
		return b.Set(keyFormat, appendMetaU64(r.meta[:0], StoreFormat), nil)
	}
	return nil
}

// stageEpoch stages a leader's new epoch over a store that applied up to
// applied, the last batch being prev: the epoch (which fences the older
// ones), where its history starts and which batch it continues, and the
// deletion of the old epoch's leader-only rows. A store without metadata
// gets its format too.
func stageEpoch(b *pebble.Batch, db pebble.Reader, epoch, applied uint64, prev wal.BatchRef) error {
	if err := b.Set(keyEpoch, appendMetaU64(nil, epoch), nil); err != nil {
		return err
	}
	if err := stageEpochStart(b, applied+1, prev); err != nil {
		return err
	}
	// The rows of an earlier epoch's leader (its replication slots) are not
	// this one's: its followers get fresh ones (keyspace.LeaderOnly).
	for _, p := range keyspace.LeaderOnly {
		if err := b.DeleteRange([]byte(p), keyspace.UpperBound(p), nil); err != nil {
			return err
		}
	}
	// The store is now a leader's (set after the deletion: later in the
	// batch wins).
	if err := b.Set(keyLeader, appendMetaU64(nil, epoch), nil); err != nil {
		return err
	}
	if _, _, ok, err := ReadMeta(db); err != nil || ok {
		return err
	}
	return stageFormat(b)
}

// stageEpochStart stages where the current epoch's history starts: its
// first LSN and prev, the batch ending just before it.
func stageEpochStart(b *pebble.Batch, start uint64, prev wal.BatchRef) error {
	// A follower that applied start or later under an older epoch has
	// diverged.
	if err := b.Set(keyEpochStart, appendMetaU64(nil, start), nil); err != nil {
		return err
	}
	// A follower stopped exactly at start-1 can be verified (CheckHello).
	return b.Set(keyEpochPrev, appendBatchRef(nil, start-1, prev), nil)
}

// stageFormat stages the store format marker (keyFormat) into b: what makes
// a Pebble store an oncewal store.
func stageFormat(b *pebble.Batch) error {
	return b.Set(keyFormat, appendMetaU64(nil, StoreFormat), nil)
}

// getMeta returns a copy of the value at key, nil when absent.
func getMeta(r pebble.Reader, key []byte) ([]byte, error) {
	v, closer, err := r.Get(key)
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("store: reading %s: %w", key, err)
	}
	defer closer.Close()
	return append([]byte(nil), v...), nil
}

// readMetaU64 reads a u64 metadata value; absent means 0.
func readMetaU64(r pebble.Reader, key []byte) (uint64, error) {
	v, err := getMeta(r, key)
	if err != nil || v == nil {
		return 0, err
	}
	if len(v) != metaU64Size || v[0] != metaVersion {
		return 0, corruption.Errorf("store: %s: unrecognised value %x", key, v)
	}
	return binary.LittleEndian.Uint64(v[1:]), nil
}

// readBatchRef reads a batch ref at key for the batch ending at lsn; the
// zero wal.BatchRef when there is none or it was recorded for another LSN.
func readBatchRef(r pebble.Reader, key []byte, lsn uint64) (wal.BatchRef, error) {
	v, err := getMeta(r, key)
	if err != nil || v == nil {
		return wal.BatchRef{}, err
	}
	if len(v) != lastBatchSize || v[0] != metaVersion {
		return wal.BatchRef{}, corruption.Errorf("store: %s: unrecognised value %x", key, v)
	}
	if binary.LittleEndian.Uint64(v[1:]) != lsn {
		return wal.BatchRef{}, nil
	}
	return wal.BatchRef{Epoch: binary.LittleEndian.Uint64(v[9:]), CRC: binary.LittleEndian.Uint32(v[17:])}, nil
}

// readLastBatch reads keyLastBatch and returns the identity of the batch
// ending at applied, or the zero wal.BatchRef when the store does not know it
// (no key, or a key written for another position).
func readLastBatch(r pebble.Reader, applied uint64) (wal.BatchRef, error) {
	return readBatchRef(r, keyLastBatch, applied)
}

// ReadLastBatch returns the store's applied position and the identity of the
// batch that ends there (zero when the store does not know it: nothing
// applied, or a store written before keyLastBatch existed). A leader promoted
// from this store reads it before its first append: it is the boundary of
// its epoch (EpochBoundary.Prev), which CheckHello needs to verify a
// follower that stopped exactly where the new epoch starts.
func ReadLastBatch(db pebble.Reader) (appliedLSN uint64, ref wal.BatchRef, err error) {
	if appliedLSN, err = readMetaU64(db, keyPosition); err != nil {
		return 0, wal.BatchRef{}, err
	}
	ref, err = readLastBatch(db, appliedLSN)
	return appliedLSN, ref, err
}

// readLeaderMark returns the epoch at which a leader made db's store its
// own (keyLeader); ok is false for a store no leader raised: a follower's,
// or one written before the mark existed.
func readLeaderMark(db pebble.Reader) (epoch uint64, ok bool, err error) {
	v, err := getMeta(db, keyLeader)
	if err != nil || v == nil {
		return 0, false, err
	}
	epoch, err = readMetaU64(db, keyLeader)
	return epoch, err == nil, err
}

// ReadMeta reads the applied position and epoch persisted in db, e.g. from a
// read-only store; ok is false when db holds no oncewal metadata at all.
func ReadMeta(db pebble.Reader) (appliedLSN, epoch uint64, ok bool, err error) {
	format, err := readMetaU64(db, keyFormat)
	if err != nil || format == 0 {
		return 0, 0, false, err
	}
	if appliedLSN, err = readMetaU64(db, keyPosition); err != nil {
		return 0, 0, false, err
	}
	if epoch, err = readMetaU64(db, keyEpoch); err != nil {
		return 0, 0, false, err
	}
	return appliedLSN, epoch, true, nil
}
