package replication

import (
	"encoding/binary"
	"errors"
	"log/slog"

	"github.com/cockroachdb/pebble/v2"
	"github.com/oncewal/oncewal/corruption"
	"github.com/oncewal/oncewal/idempotency"
	"github.com/oncewal/oncewal/keyspace"
)

// The window journal makes the idempotency-key window survive restarts,
// crashes included.
//
// Why: the HWM catches every redelivery of the same (session, SeqNo), but a
// client retry that the leader logged again under a fresh SeqNo with the same
// idempotency key is caught only by the window. An in-memory window that is
// empty after a crash would apply such a retry twice. So every committed batch
// also writes the keys it recorded in the window — new keys and window hits
// (which refresh recency) alike, in recording order — as one Pebble value
// under JournalPrefix + big-endian last LSN of the batch, in the same Pebble
// batch as the state, so the journal is exactly as durable as the state it
// guards. Opening replays every entry, oldest first, into an empty window.
//
// Why the replay is exact: an LRU's contents and order depend only on the
// order of each key's last access, and the journal holds every access since
// its oldest entry. To keep it bounded, once it holds more than twice the
// capacity in keys, the next batch writes a compacted entry — the whole
// window as it stands (oldest to newest) followed by the batch's own keys —
// and deletes every older entry in the same Pebble batch. Pruning by key count
// alone would be wrong: a key recorded many times counts many times but
// occupies one window slot, so a count-pruned journal rebuilds a smaller
// window than the live one. Cost: one extra Pebble key and 16 bytes per keyed
// event, plus a capacity×16-byte snapshot every ~capacity keys.
//
// A journal entry that does not decode fails the open with an error marked
// corruption.Err, naming the key. It is not skipped: a window rebuilt
// without it is smaller than the live one was, and a client retry under a
// fresh SeqNo whose key sat only in the lost entry would apply twice — the
// HWM cannot catch it. Pebble checksums its blocks, so such an entry means a
// bug or a foreign writer in the w/ key space; the store needs repair or a
// rebuild, not a quiet start.

// JournalPrefix is the Pebble key prefix of window journal entries.
var JournalPrefix = []byte(keyspace.Journal)

const journalVersion = 1

type journalEntry struct {
	lsn uint64
	n   int
}

type journal struct {
	entries []journalEntry // entries[head:] are live, oldest first
	head    int            // dropped entries are skipped, not copied away
	total   int            // keys across live entries

	// Staged by the batch being composed; folded in by committed().
	staged    journalEntry
	compacted bool // the staged entry replaces every live entry
	buf       []byte
	snap      []idempotency.Key
}

func journalKey(lsn uint64) []byte {
	k := make([]byte, len(JournalPrefix)+8)
	copy(k, JournalPrefix)
	binary.BigEndian.PutUint64(k[len(JournalPrefix):], lsn)
	return k
}

// loadJournal reads the journal and replays it, oldest first, into window.
func loadJournal(db *pebble.DB, window *idempotency.Store, _ *slog.Logger) (*journal, error) {
	j := &journal{}
	it, err := db.NewIter(&pebble.IterOptions{LowerBound: JournalPrefix, UpperBound: keyspace.UpperBound(keyspace.Journal)})
	if err != nil {
		return nil, err
	}
	for valid := it.First(); valid; valid = it.Next() {
		k, v := it.Key(), it.Value()
		if len(k) != len(JournalPrefix)+8 || len(v) == 0 || v[0] != journalVersion || (len(v)-1)%16 != 0 {
			err := corruption.Errorf("replication: undecodable window journal entry %q (%d bytes)", k, len(v))
			return nil, errors.Join(err, it.Close())
		}
		n := (len(v) - 1) / 16
		for i := 0; i < n; i++ {
			var key idempotency.Key
			copy(key[:], v[1+16*i:])
			window.CheckAndRecord(key)
		}
		j.entries = append(j.entries, journalEntry{lsn: binary.BigEndian.Uint64(k[len(JournalPrefix):]), n: n})
		j.total += n
	}
	if err := it.Close(); err != nil {
		return nil, err
	}
	return j, nil
}

// stage writes this batch's recorded keys into b; when the journal has grown
// past twice the window's capacity, the entry is a compacted one (see above).
// window must still hold its state from before this batch.
func (j *journal) stage(b *pebble.Batch, lsn uint64, keys []idempotency.Key, window *idempotency.Store) error {
	j.staged, j.compacted = journalEntry{}, false
	compact := j.total+len(keys) > 2*window.Capacity()
	if len(keys) == 0 && !compact {
		return nil
	}
	j.buf = append(j.buf[:0], journalVersion)
	n := len(keys)
	if compact {
		j.snap = window.Keys(j.snap[:0])
		for i := range j.snap {
			j.buf = append(j.buf, j.snap[i][:]...)
		}
		n += len(j.snap)
	}
	for i := range keys {
		j.buf = append(j.buf, keys[i][:]...)
	}
	key := journalKey(lsn)
	if compact {
		if err := b.DeleteRange(JournalPrefix, key, nil); err != nil {
			return err
		}
	}
	if err := b.Set(key, j.buf, nil); err != nil {
		return err
	}
	j.staged, j.compacted = journalEntry{lsn: lsn, n: n}, compact
	return nil
}

// committed folds the staged entry in after the batch committed.
func (j *journal) committed() {
	if j.compacted {
		j.entries, j.head, j.total = j.entries[:0], 0, 0
	}
	if j.staged.n > 0 {
		j.entries = append(j.entries, j.staged)
		j.total += j.staged.n
	}
	j.staged, j.compacted = journalEntry{}, false
}
