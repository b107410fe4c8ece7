package session

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/cockroachdb/pebble/v2"
	"github.com/oncewal/oncewal/keyspace"
)

// The HWM delta log: instead of one row per changed session, a batch writes
// one value listing its sessions' new records. See doc.go ("Amortised HWM
// persistence") for the design and its invariants.
//
//	HWMLogPrefix + seq u64 BE → version(1) | entries, each 33 bytes:
//	                             ID(16) | HWM u64 LE | lastTS i64 LE | flags(1)
//
// flags: bit 0 closed, bit 1 deleted (a tombstone written by garbage
// collection: the session's row was deleted in the same batch).
const (
	HWMLogPrefix = keyspace.HWMLog

	logKeyLen   = len(HWMLogPrefix) + 8
	logEntryLen = len(ID{}) + 8 + 8 + 1
	flagDeleted = 1 << 1
)

func logKey(buf *[logKeyLen]byte, seq uint64) []byte {
	copy(buf[:], HWMLogPrefix)
	binary.BigEndian.PutUint64(buf[len(HWMLogPrefix):], seq)
	return buf[:]
}

func appendLogEntry(dst []byte, id *ID, r record, exists bool) []byte {
	var flags byte
	switch {
	case !exists:
		flags, r = flagDeleted, record{}
	case r.closed:
		flags = flagClosed
	}
	dst = append(dst, id[:]...)
	dst = binary.LittleEndian.AppendUint64(dst, uint64(r.hwm))
	dst = binary.LittleEndian.AppendUint64(dst, uint64(r.lastTS))
	return append(dst, flags)
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
		if len(key) != logKeyLen || len(v) == 0 || v[0] != formatVersion || (len(v)-1)%logEntryLen != 0 {
			return nil, 0, 0, fmt.Errorf("%w: delta %x", ErrCorrupt, key)
		}
		seq := binary.BigEndian.Uint64(key[len(HWMLogPrefix):])
		if !found {
			first, found = seq, true
		}
		next = seq + 1
		for e := v[1:]; len(e) > 0; e = e[logEntryLen:] {
			var id ID
			copy(id[:], e)
			flags := e[logEntryLen-1]
			if flags&^(flagClosed|flagDeleted) != 0 || SeqNo(binary.LittleEndian.Uint64(e[16:])) > MaxSeqNo {
				return nil, 0, 0, fmt.Errorf("%w: delta %x", ErrCorrupt, key)
			}
			latest[id] = loggedRecord{
				rec: record{
					hwm:    SeqNo(binary.LittleEndian.Uint64(e[16:])),
					lastTS: int64(binary.LittleEndian.Uint64(e[24:])),
					closed: flags&flagClosed != 0,
				},
				exists: flags&flagDeleted == 0,
				seq:    seq,
			}
		}
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
