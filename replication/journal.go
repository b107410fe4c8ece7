package replication

import (
	"encoding/binary"

	"github.com/cockroachdb/pebble/v2"
	"github.com/oncewal/oncewal/idempotency"
)

// The window journal makes the idempotency-key window survive restarts,
// crashes included.
//
// Why: the HWM catches every redelivery of the same (session, SeqNo), but a
// client retry that the leader logged again under a fresh SeqNo with the same
// idempotency key is caught only by the window. An in-memory window that is
// empty after a crash would apply such a retry twice. So every committed batch
// also writes the keys it recorded in the window, in recording order, as one
// Pebble value under JournalPrefix + big-endian last LSN of the batch — in the
// same Pebble batch as the state, so the journal is exactly as durable as
// the state it guards. Entries older than the newest `capacity` keys are
// deleted in the same batch that pushes them out. Opening replays the newest
// `capacity` keys oldest-first, which rebuilds the window the follower had.
// Cost: one extra Pebble key and 16 bytes per keyed event.
//
// A journal entry that does not decode is skipped with a log line: the HWM
// still guarantees exactly-once for every (session, SeqNo) redelivery.

// JournalPrefix is the Pebble key prefix of window journal entries.
var JournalPrefix = []byte("w/j/")

const journalVersion = 1

type journalEntry struct {
	lsn uint64
	n   int
}

type journal struct {
	entries []journalEntry // entries[head:] are live, oldest first
	head    int            // pruned entries are skipped, not copied away
	total   int            // keys across live entries

	// Staged by the batch being composed; folded in by committed().
	staged      journalEntry
	stagedPrune int
	buf         []byte
}

func journalKey(lsn uint64) []byte {
	k := make([]byte, len(JournalPrefix)+8)
	copy(k, JournalPrefix)
	binary.BigEndian.PutUint64(k[len(JournalPrefix):], lsn)
	return k
}

// loadJournal reads the journal and records its newest window.Capacity() keys,
// oldest first, into window.
func loadJournal(db *pebble.DB, window *idempotency.Store, logf func(string, ...any)) (*journal, error) {
	j := &journal{}
	upper := append([]byte(nil), JournalPrefix...)
	upper[len(upper)-1]++
	it, err := db.NewIter(&pebble.IterOptions{LowerBound: JournalPrefix, UpperBound: upper})
	if err != nil {
		return nil, err
	}
	var keys []idempotency.Key
	for valid := it.First(); valid; valid = it.Next() {
		k, v := it.Key(), it.Value()
		if len(k) != len(JournalPrefix)+8 || len(v) == 0 || v[0] != journalVersion || (len(v)-1)%16 != 0 {
			logf("oncewal: ignoring undecodable window journal entry %q (%d bytes)", k, len(v))
			continue
		}
		n := (len(v) - 1) / 16
		for i := 0; i < n; i++ {
			var key idempotency.Key
			copy(key[:], v[1+16*i:])
			keys = append(keys, key)
		}
		j.entries = append(j.entries, journalEntry{lsn: binary.BigEndian.Uint64(k[len(JournalPrefix):]), n: n})
		j.total += n
	}
	if err := it.Close(); err != nil {
		return nil, err
	}
	if c := window.Capacity(); len(keys) > c {
		keys = keys[len(keys)-c:]
	}
	for _, k := range keys {
		window.CheckAndRecord(k)
	}
	return j, nil
}

// stage writes this batch's recorded keys and the deletion of entries they
// push out of the newest `capacity` keys into b.
func (j *journal) stage(b *pebble.Batch, lsn uint64, keys []idempotency.Key, capacity int) error {
	j.staged, j.stagedPrune = journalEntry{}, 0
	if len(keys) == 0 {
		return nil
	}
	j.buf = append(j.buf[:0], journalVersion)
	for i := range keys {
		j.buf = append(j.buf, keys[i][:]...)
	}
	if err := b.Set(journalKey(lsn), j.buf, nil); err != nil {
		return err
	}
	j.staged = journalEntry{lsn: lsn, n: len(keys)}
	total := j.total + len(keys)
	for _, e := range j.entries[j.head:] {
		if total-e.n < capacity {
			break
		}
		if err := b.Delete(journalKey(e.lsn), nil); err != nil {
			return err
		}
		total -= e.n
		j.stagedPrune++
	}
	return nil
}

// committed folds the staged entry and deletions in after the batch committed.
func (j *journal) committed() {
	for _, e := range j.entries[j.head : j.head+j.stagedPrune] {
		j.total -= e.n
	}
	j.head += j.stagedPrune
	// Compact only when the dead prefix dominates, so a commit costs O(1)
	// amortised even when every batch carries a single key.
	if j.head > 1024 && j.head > len(j.entries)/2 {
		j.entries = append(j.entries[:0], j.entries[j.head:]...)
		j.head = 0
	}
	if j.staged.n > 0 {
		j.entries = append(j.entries, j.staged)
		j.total += j.staged.n
	}
	j.staged, j.stagedPrune = journalEntry{}, 0
}
