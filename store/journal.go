package store

import (
	"encoding/binary"
	"errors"
	"log/slog"

	"github.com/cockroachdb/pebble/v2"
	"github.com/oncewal/oncewal/corruption"
	"github.com/oncewal/oncewal/idempotency"
	"github.com/oncewal/oncewal/internal/keyspace"
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
// under journalPrefix + big-endian last LSN of the batch, in the same Pebble
// batch as the state, so the journal is exactly as durable as the state it
// guards. Opening replays every entry, oldest first, into an empty window.
//
// Why the replay is exact: an LRU's contents and order depend only on the
// order of each key's last access, and the journal holds every access since
// its oldest entry. Replaying any suffix of the accesses that still holds
// the last access of every key in the window rebuilds the same window: those
// keys are the most recently accessed distinct ones, so no key the suffix
// adds besides them can outrank them.
//
// So the oldest entry is deleted (in the batch being staged) once none of
// its keys can still be in the window because of it: once the window has
// evicted Capacity keys since the entry's keys were recorded. Each eviction
// takes the least recently seen key, and fewer than Capacity keys are ever
// behind a key that is not seen again, so by then every key of the entry
// was either evicted or seen again in a later entry (idempotency.Store
// Evictions). With a full window of mostly new keys, an entry lives about
// Capacity keys, and the journal holds about one window's worth.
//
// Hits evict nothing, so a window that mostly sees its own keys again keeps
// old entries alive. To keep the journal bounded anyway, once it holds more
// than maxJournalWindows (3) times the capacity in keys, the next batch
// writes a compacted entry — the whole window as it stands (oldest to
// newest) followed by the batch's own keys — and deletes every older entry
// in the same Pebble batch. Three, not two: a compacted entry itself lives
// until Capacity evictions after it, while about a window of new entries
// piles up behind it; at twice the capacity that pile would trigger the
// next snapshot, and a journal of new keys would go from snapshot to
// snapshot instead of back to one window's worth. Pruning
// by key count alone would be wrong: a key recorded many times counts many
// times but occupies one window slot, so a count-pruned journal rebuilds a
// smaller window than the live one. Cost: one extra Pebble key and 16 bytes
// per keyed event, one deletion per entry, and, only when hits dominate, a
// capacity×16-byte snapshot every ~capacity keys. (Before eviction pruning,
// every journal reached the snapshot: 32 bytes per fresh event instead of
// 16, all of it flushed and compacted.)
//
// A journal entry that does not decode fails the open with an error marked
// corruption.Err, naming the key. It is not skipped: a window rebuilt
// without it is smaller than the live one was, and a client retry under a
// fresh SeqNo whose key sat only in the lost entry would apply twice — the
// HWM cannot catch it. Pebble checksums its blocks, so such an entry means a
// bug or a foreign writer in the w/ key space; the store needs repair or a
// rebuild, not a quiet start.

// journalPrefix is the Pebble key prefix of window journal entries.
var journalPrefix = []byte(keyspace.Journal)

const journalVersion = 1

// maxJournalWindows bounds the journal, in windows' worth of keys, before
// the next entry is a compacted one (see above).
const maxJournalWindows = 3

type journalEntry struct {
	lsn uint64
	n   int
	// evicted is the window's Evictions once the entry's keys were
	// recorded: Capacity evictions later, the entry can go.
	evicted uint64
}

type journal struct {
	entries []journalEntry // entries[head:] are live, oldest first
	head    int            // dropped entries are skipped, not copied away
	total   int            // keys across live entries

	// Staged by the batch being composed; folded in by committed().
	staged    journalEntry
	compacted bool // the staged entry replaces every live entry
	pruned    int  // oldest live entries the staged batch deletes
	buf       []byte
	snap      []idempotency.Key
}

func journalKey(lsn uint64) []byte {
	k := make([]byte, len(journalPrefix)+8)
	copy(k, journalPrefix)
	binary.BigEndian.PutUint64(k[len(journalPrefix):], lsn)
	return k
}

// loadJournal reads the journal and replays it, oldest first, into window.
func loadJournal(db *pebble.DB, window *idempotency.Store, _ *slog.Logger) (*journal, error) {
	j := &journal{}
	it, err := db.NewIter(&pebble.IterOptions{LowerBound: journalPrefix, UpperBound: keyspace.UpperBound(keyspace.Journal)})
	if err != nil {
		return nil, err
	}
	for valid := it.First(); valid; valid = it.Next() {
		k, v := it.Key(), it.Value()
		if len(k) != len(journalPrefix)+8 || len(v) == 0 || v[0] != journalVersion || (len(v)-1)%16 != 0 {
			err := corruption.Errorf("store: undecodable window journal entry %q (%d bytes)", k, len(v))
			return nil, errors.Join(err, it.Close())
		}
		n := (len(v) - 1) / 16
		for i := 0; i < n; i++ {
			var key idempotency.Key
			copy(key[:], v[1+16*i:])
			window.CheckAndRecord(key)
		}
		j.entries = append(j.entries, journalEntry{lsn: binary.BigEndian.Uint64(k[len(journalPrefix):]), n: n,
			evicted: window.Evictions()})
		j.total += n
	}
	if err := it.Close(); err != nil {
		return nil, err
	}
	return j, nil
}

// journalPlan is what one batch does to the journal.
type journalPlan struct {
	// compact: the batch's entry holds the whole window before its own
	// keys, and replaces every live entry.
	compact bool
	// prune: how many of the oldest live entries the batch deletes (0 when
	// compact).
	prune int
}

// plan decides, purely, what a batch recording keys keys does to the
// journal, with the window's capacity and its Evictions before the batch:
// compact once the journal would hold more than maxJournalWindows windows'
// worth of keys; else delete the oldest entries the window has evicted
// Capacity keys since (see above).
func (j *journal) plan(keys int, evictions uint64, capacity int) journalPlan {
	if j.total+keys > maxJournalWindows*capacity {
		return journalPlan{compact: true}
	}
	var p journalPlan
	for _, e := range j.entries[j.head:] {
		if evictions-e.evicted < uint64(capacity) {
			break
		}
		p.prune++
	}
	return p
}

// stage writes this batch's recorded keys into b as its plan says: the
// entry (a compacted one: the window first), and the deletions of the
// entries it replaces or prunes. window must still hold its state from
// before this batch.
func (j *journal) stage(b *pebble.Batch, lsn uint64, keys []idempotency.Key, window *idempotency.Store) error {
	j.staged, j.compacted, j.pruned = journalEntry{}, false, 0
	p := j.plan(len(keys), window.Evictions(), window.Capacity())
	for _, e := range j.entries[j.head : j.head+p.prune] {
		if err := b.Delete(journalKey(e.lsn), nil); err != nil {
			return err
		}
	}
	if len(keys) == 0 && !p.compact {
		j.note(p, lsn, 0)
		return nil
	}
	j.buf = append(j.buf[:0], journalVersion)
	n := len(keys)
	if p.compact {
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
	if p.compact {
		if err := b.DeleteRange(journalPrefix, key, nil); err != nil {
			return err
		}
	}
	if err := b.Set(key, j.buf, nil); err != nil {
		return err
	}
	j.note(p, lsn, n)
	return nil
}

// note records what stage wrote — plan p, and an entry of n keys at lsn
// (none when n is 0) — for committed to fold in.
func (j *journal) note(p journalPlan, lsn uint64, n int) {
	j.compacted, j.pruned = p.compact, p.prune
	if n > 0 {
		j.staged = journalEntry{lsn: lsn, n: n}
	}
}

// committed folds the staged batch in after it committed and its keys were
// recorded in the window, whose Evictions are now evictions.
func (j *journal) committed(evictions uint64) {
	if j.compacted {
		j.entries, j.head, j.total = j.entries[:0], 0, 0
	}
	for ; j.pruned > 0; j.pruned-- {
		j.total -= j.entries[j.head].n
		j.head++
	}
	if j.head > len(j.entries)/2 { // amortised O(1) per entry
		j.entries = j.entries[:copy(j.entries, j.entries[j.head:])]
		j.head = 0
	}
	if j.staged.n > 0 {
		j.staged.evicted = evictions
		j.entries = append(j.entries, j.staged)
		j.total += j.staged.n
	}
	j.staged, j.compacted = journalEntry{}, false
}
