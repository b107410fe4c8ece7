package session

import (
	"sync"
	"unsafe"

	"github.com/oncewal/oncewal/internal/lrutable"
)

// hwmCache is the Tracker's cache of committed HWM records, an
// lrutable.Table as the idempotency window (idempotency.Store) is, so that a
// hit costs two or three cache lines — a slot of an open-addressing table
// and a 40-byte entry — instead of golang-lru's walk from a Go map to a
// heap-allocated list element.
//
// Layout: the table's entries hold a session's ID, record and place in a
// list; logSeq[i] holds entry i's state and carries[i]
// how often its logged record was carried forward unchanged (kept apart, so
// a lookup never drags them into cache). Nothing holds a pointer. The
// arrays grow (the entries as append would, the index by doubling before
// it passes its load bound), so a follower with few sessions does not pay
// for a large CacheSize up front.
//
// Two kinds of entry. A clean entry's record is also its row in Pebble: it
// is an exact LRU of at most capacity entries (put, checked against
// golang-lru/v2), and evicting it costs only a Pebble read later. A dirty
// entry's latest change is only in the delta log (hwmlog.go), so the cache
// is the only place a lookup finds it: it is pinned — never evicted, not
// counted against capacity — in a list ordered by the delta of its latest
// change, oldest first, until the Tracker checkpoints it into its row
// (markClean). The Tracker bounds the dirty entries (TrackerOptions).
//
// Recency: put makes a session the most recently used clean entry; peek and
// get do not refresh it, because a recency update is a random write to the
// list (two neighbours and the head), which costs more than the lookup
// itself at 100K+ sessions. The Tracker puts a session when it fills it from
// Pebble and when a commit writes or checkpoints it, so the cache keeps the
// sessions that are writing.
//
// Concurrency: only the goroutine running the current TrackerTx changes the
// cache (txs are serialized), and it does so under mu; it reads without mu,
// being the only writer. Readers on other goroutines (Tracker.Get, Expired)
// take mu.
//
// The cache holds only committed records (doc.go, invariant 3): a tx's
// pending changes live in the tx until Commit.
type hwmCache struct {
	mu sync.Mutex

	t        lrutable.Table[ID, cacheVal]
	logSeq   []uint64 // logSeq[i]: 0 if entry i is clean, else its delta
	carries  []uint8  // carries[i]: times entry i's logged record was carried forward unchanged
	capacity int32    // bound on clean entries

	ndirty int32         // dirty entries
	lru    lrutable.List // clean entries; head = most recently put
	dirty  lrutable.List // dirty entries; head = oldest logged change
}

const (
	nilIdx = lrutable.Nil
	// closedBit marks a closed session in cacheVal.hwm, so a record is 16
	// bytes (an entry 40 with its key and links). No HWM reaches it
	// (MaxSeqNo).
	closedBit = 1 << 63
	// minSlots is the table's first size; it doubles from there.
	minSlots = 1 << 10
	// maxCacheCapacity bounds CacheSize (lrutable.MaxEntries); larger
	// CacheSizes are clamped.
	maxCacheCapacity = lrutable.MaxEntries
)

// cacheVal is a cached record.
type cacheVal struct {
	hwm    uint64 // record.hwm | closedBit if closed
	lastTS int64
}

func newHWMCache(capacity int) *hwmCache {
	c := &hwmCache{
		capacity: int32(min(max(capacity, 1), maxCacheCapacity)),
		lru:      lrutable.NewList(),
		dirty:    lrutable.NewList(),
	}
	c.t.Init(minSlots, 0)
	return c
}

// idAt returns the ID of live entry i.
func (c *hwmCache) idAt(i int32) ID { return c.t.At(i).Key }

// peek returns the cached record of id without changing recency. Only the
// goroutine that changes the cache may call it without holding mu.
func (c *hwmCache) peek(id *ID) (record, bool) {
	i := c.find(id)
	if i == nilIdx {
		return record{}, false
	}
	return c.at(i), true
}

// find returns the entry of id, or nilIdx, under peek's rule.
func (c *hwmCache) find(id *ID) int32 {
	_, i := c.t.Find(id, c.t.Hash(id))
	return i
}

// findAll is find for a batch (lrutable's FindAll), under peek's rule.
// found[j] names ids[j]'s entry for as long as removed is unchanged.
func (c *hwmCache) findAll(ids []ID, found []int32) { c.t.FindAll(ids, found) }

// removed counts the entries the cache removed (evicted or deleted) so far.
func (c *hwmCache) removed() uint64 { return c.t.Removed() }

// at returns the record of live entry i.
func (c *hwmCache) at(i int32) record {
	v := &c.t.At(i).Val
	return record{hwm: SeqNo(v.hwm &^ closedBit), lastTS: v.lastTS, closed: v.hwm&closedBit != 0}
}

// get is peek for any goroutine.
func (c *hwmCache) get(id *ID) (record, bool) {
	c.mu.Lock()
	r, ok := c.peek(id)
	c.mu.Unlock()
	return r, ok
}

// len returns the number of cached sessions.
func (c *hwmCache) len() int {
	c.mu.Lock()
	n := c.t.Len()
	c.mu.Unlock()
	return int(n)
}

// put caches r as id's committed record, clean (its row in Pebble holds r),
// and makes it the most recently put clean entry, evicting the least
// recently put clean entry if CacheSize clean entries are cached. A dirty
// entry of id becomes clean. Caller holds mu.
func (c *hwmCache) put(id *ID, r record) {
	c.set(id, r, 0, 0)
}

// putDirty caches r as id's committed record whose latest change is only in
// the delta log, in delta seq (> 0): the entry is pinned (never evicted)
// until markClean. It goes to the newest end of the dirty list. carries
// counts how often r was re-logged unchanged (carried forward) since it
// last changed. Caller holds mu.
func (c *hwmCache) putDirty(id *ID, r record, seq uint64, carries uint8) {
	c.set(id, r, seq, carries)
}

// set inserts or updates id with r; seq 0 makes it clean (LRU front), else
// dirty (dirty list's newest end).
func (c *hwmCache) set(id *ID, r record, seq uint64, carries uint8) {
	v := cacheVal{hwm: uint64(r.hwm), lastTS: r.lastTS}
	if r.closed {
		v.hwm |= closedBit
	}
	h := c.t.Hash(id)
	slot, i := c.t.Find(id, h)
	if i != nilIdx {
		c.t.At(i).Val = v
		c.carries[i] = carries
		if c.logSeq[i] == 0 && seq == 0 && i == c.lru.Head {
			return
		}
		c.unlink(i)
		c.link(i, seq)
		c.evictOverCapacity()
		return
	}
	var victim *lrutable.List
	if seq == 0 && c.t.Len()-c.ndirty == c.capacity {
		victim = &c.lru
	}
	i = c.t.Insert(id, h, slot, victim)
	if int(i) == len(c.logSeq) {
		c.logSeq = append(c.logSeq, 0)
		c.carries = append(c.carries, 0)
	}
	c.t.At(i).Val = v
	c.carries[i] = carries
	c.link(i, seq)
}

// markClean makes id's dirty entry clean (its row now holds its record), as
// the most recently put clean entry. Clean entries beyond CacheSize are then
// evicted, least recently put first. Caller holds mu.
func (c *hwmCache) markClean(id *ID) {
	_, i := c.t.Find(id, c.t.Hash(id))
	if i == nilIdx || c.logSeq[i] == 0 {
		return
	}
	c.unlink(i)
	c.link(i, 0)
	c.carries[i] = 0
	c.evictOverCapacity()
}

// evictOverCapacity evicts clean entries, least recently put first, while
// there are more than capacity (a logged entry that turned clean adds one).
// A clean entry's logSeq and carries are already 0.
func (c *hwmCache) evictOverCapacity() {
	for c.t.Len()-c.ndirty > c.capacity {
		c.t.Evict(&c.lru)
	}
}

// oldestDirty returns the dirty entry with the oldest logged change, or
// nilIdx; nextDirty the one after i; carried how often i's record was
// carried forward unchanged. The tx goroutine reads them without mu.
func (c *hwmCache) oldestDirty() int32      { return c.dirty.Head }
func (c *hwmCache) nextDirty(i int32) int32 { return c.t.Next(i) }
func (c *hwmCache) carried(i int32) uint8   { return c.carries[i] }

// dirtyLen returns the number of dirty entries (tx goroutine only).
func (c *hwmCache) dirtyLen() int { return int(c.ndirty) }

// remove drops id from the cache, if present. Caller holds mu.
func (c *hwmCache) remove(id *ID) {
	slot, i := c.t.Find(id, c.t.Hash(id))
	if i == nilIdx {
		return
	}
	c.unlink(i)
	c.t.Delete(slot, i)
	c.logSeq[i] = 0
	c.carries[i] = 0
}

// unlink takes live entry i out of its list (clean or dirty).
func (c *hwmCache) unlink(i int32) {
	l := &c.lru
	if c.logSeq[i] != 0 {
		l = &c.dirty
		c.ndirty--
	}
	c.t.Unlink(l, i)
}

// link puts entry i, in no list, at the front of the clean list (seq 0) or
// at the newest end of the dirty list.
func (c *hwmCache) link(i int32, seq uint64) {
	c.logSeq[i] = seq
	if seq == 0 {
		c.t.PushFront(&c.lru, i)
		return
	}
	c.ndirty++
	c.t.PushBack(&c.dirty, i)
}

// prefetch pulls in the table slots and, if the home slots hold a
// candidate, the entry a lookup of id will read and the entry's log state
// and links, which the commit of an advance reads (set: logSeq, then
// unlink). The CPU overlaps the cache misses of many calls; the lookups
// that follow then hit. Only the goroutine that changes the cache may call
// it.
//
// The log state and links were left out once: then the first read of
// logSeq in set was a cache miss per advanced session, about half of set's
// time (go test ./bench -bench 'Receiver/dup100-window$' -cpuprofile).
func (c *hwmCache) prefetch(id *ID) {
	i := c.t.ResidentHint(c.t.Hash(id))
	if i == nilIdx {
		return
	}
	c.t.PrefetchEntry(i)
	c.prefetchLog(i)
}

// prefetchLog pulls in live entry i's log state, which the commit of an
// advance reads (set). A TrackerTx calls it for every session it indexes
// from the cache (lookup): those are the ones it may advance, while a
// batch's sure duplicates, peeked but never indexed, do not need it.
func (c *hwmCache) prefetchLog(i int32) {
	lrutable.Prefetch(unsafe.Pointer(&c.logSeq[i]))
}
