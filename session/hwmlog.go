package session

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/cockroachdb/pebble/v2"
	"github.com/oncewal/oncewal/internal/keyspace"
)

// The HWM delta log: instead of one row per changed session, a batch writes
// one value listing its sessions' new records. See doc.go ("Amortised HWM
// persistence") for the design and its invariants.
//
// Version 2 (written since 2026-11-23): entries are compact, about 21 bytes
// for a session that just changed.
//
//	HWMLogPrefix + seq u64 BE → 2 | base i64 LE | entries, each:
//	    ID(16) | uvarint(HWM<<1 | closed) | varint(base − lastTS)
//	    ID(16) | uvarint(0)                      (a tombstone)
//
// base is the writing tx's WAL clock, which no lastTS exceeds, so the
// zigzag varint of the difference is 3–4 bytes for sessions active within
// the last few seconds. A live record's HWM is at least 1 (Advance starts
// a session at 1), so HWM 0 marks a tombstone — written by garbage
// collection: the session's row was deleted in the same batch — and it
// carries no time.
//
// Version 1 (read, never written any more): fixed 33-byte entries,
//
//	HWMLogPrefix + seq u64 BE → 1 | entries: ID(16) | HWM u64 LE | lastTS i64 LE | flags(1)
//
// flags: bit 0 closed, bit 1 deleted. A store written by an older binary
// replays as before; a binary that predates version 2 refuses a version-2
// delta with ErrCorrupt naming its key (it does not misread it).
const (
	HWMLogPrefix = keyspace.HWMLog

	logKeyLen     = len(HWMLogPrefix) + 8
	logVersion1   = 1
	logVersion2   = 2
	logHeaderLen  = 1 + 8 // version, base (version 2)
	logEntryLenV1 = len(ID{}) + 8 + 8 + 1
	flagDeleted   = 1 << 1
)

func logKey(buf *[logKeyLen]byte, seq uint64) []byte {
	copy(buf[:], HWMLogPrefix)
	binary.BigEndian.PutUint64(buf[len(HWMLogPrefix):], seq)
	return buf[:]
}

// appendLogHeader starts a version-2 delta in dst (which it resets) whose
// entries' times are relative to base, the tx's WAL clock.
func appendLogHeader(dst []byte, base int64) []byte {
	dst = append(dst[:0], logVersion2)
	return binary.LittleEndian.AppendUint64(dst, uint64(base))
}

// appendLogEntry appends id's record to v, a delta begun by
// appendLogHeader: r, or a tombstone when !exists. A live record with HWM 0
// cannot be encoded (HWM 0 means a tombstone): ErrCorrupt.
func appendLogEntry(v []byte, id *ID, r record, exists bool) ([]byte, error) {
	v = append(v, id[:]...)
	if !exists {
		return append(v, 0), nil
	}
	if r.hwm == 0 {
		return v, fmt.Errorf("%w: session %s: live HWM record with HWM 0", ErrCorrupt, *id)
	}
	x := uint64(r.hwm) << 1
	if r.closed {
		x |= 1
	}
	v = binary.AppendUvarint(v, x)
	base := int64(binary.LittleEndian.Uint64(v[1:logHeaderLen]))
	return binary.AppendVarint(v, base-r.lastTS), nil
}

// decodeDelta calls fn for every entry of delta value v, in order; a value
// that does not decode is ErrCorrupt (the caller names the key).
func decodeDelta(v []byte, fn func(id *ID, l loggedRecord)) error {
	if len(v) == 0 {
		return ErrCorrupt
	}
	var id ID
	switch v[0] {
	case logVersion1:
		if (len(v)-1)%logEntryLenV1 != 0 {
			return ErrCorrupt
		}
		for e := v[1:]; len(e) > 0; e = e[logEntryLenV1:] {
			copy(id[:], e)
			flags := e[logEntryLenV1-1]
			hwm := SeqNo(binary.LittleEndian.Uint64(e[16:]))
			if flags&^(flagClosed|flagDeleted) != 0 || hwm > MaxSeqNo {
				return ErrCorrupt
			}
			fn(&id, loggedRecord{
				rec:    record{hwm: hwm, lastTS: int64(binary.LittleEndian.Uint64(e[24:])), closed: flags&flagClosed != 0},
				exists: flags&flagDeleted == 0,
			})
		}
		return nil
	case logVersion2:
		if len(v) < logHeaderLen {
			return ErrCorrupt
		}
		base := int64(binary.LittleEndian.Uint64(v[1:]))
		for e := v[logHeaderLen:]; len(e) > 0; {
			if len(e) < len(id)+1 {
				return ErrCorrupt
			}
			copy(id[:], e)
			e = e[len(id):]
			x, n := binary.Uvarint(e)
			if n <= 0 {
				return ErrCorrupt
			}
			e = e[n:]
			if x == 0 {
				fn(&id, loggedRecord{})
				continue
			}
			if x>>1 == 0 {
				return ErrCorrupt // closed with HWM 0
			}
			d, n := binary.Varint(e)
			if n <= 0 {
				return ErrCorrupt
			}
			e = e[n:]
			fn(&id, loggedRecord{rec: record{hwm: SeqNo(x >> 1), lastTS: base - d, closed: x&1 != 0}, exists: true})
		}
		return nil
	}
	return ErrCorrupt
}

// loggedRecord is a session's latest state in the log and the delta that
// holds it.
type loggedRecord struct {
	rec    record
	exists bool // false: a tombstone
	seq    uint64
}

// replayLog reads every delta in r, oldest first, and returns each logged
// session's latest state, and the log's bounds: deltas first..next-1 exist
// (first == next: the log is empty). A delta that does not decode is an
// error wrapping ErrCorrupt that names its key.
func replayLog(r pebble.Reader) (latest map[ID]loggedRecord, first, next uint64, err error) {
	lower := []byte(HWMLogPrefix)
	it, err := r.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: prefixEnd(lower)})
	if err != nil {
		return nil, 0, 0, err
	}
	defer it.Close()
	latest = make(map[ID]loggedRecord)
	first, next = 1, 1
	found := false
	for valid := it.First(); valid; valid = it.Next() {
		key := it.Key()
		v, err := it.ValueAndErr()
		if err != nil {
			return nil, 0, 0, err
		}
		if len(key) != logKeyLen {
			return nil, 0, 0, fmt.Errorf("%w: delta %x", ErrCorrupt, key)
		}
		seq := binary.BigEndian.Uint64(key[len(HWMLogPrefix):])
		if err := decodeDelta(v, func(id *ID, l loggedRecord) {
			l.seq = seq
			latest[*id] = l
		}); err != nil {
			return nil, 0, 0, fmt.Errorf("%w: delta %x", err, key)
		}
		if !found {
			first, found = seq, true
		}
		next = seq + 1
	}
	return latest, first, next, it.Error()
}

// loggedSession is a session's entry of a replayed log.
type loggedSession struct {
	id ID
	loggedRecord
}

// sortedLogged returns m's sessions ordered by the delta of their latest
// change (bySeq), else by ID.
func sortedLogged(m map[ID]loggedRecord, bySeq bool) []loggedSession {
	out := make([]loggedSession, 0, len(m))
	for id, l := range m {
		out = append(out, loggedSession{id, l})
	}
	slices.SortFunc(out, func(a, b loggedSession) int {
		if bySeq {
			if c := cmp.Compare(a.seq, b.seq); c != 0 {
				return c
			}
		}
		return slices.Compare(a.id[:], b.id[:])
	})
	return out
}
