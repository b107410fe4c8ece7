package session

import (
	"encoding/binary"
	"math/bits"
	"math/rand/v2"
	"sync"
)

// hwmCache is the Tracker's cache of committed HWM records, built like the
// idempotency window (idempotency.Store) so that a hit costs two cache lines
// — a slot of an open-addressing table and a 32-byte entry — instead of
// golang-lru's walk from a Go map to a heap-allocated list element.
//
// Layout: entries[i] holds a session's ID and record; links[i] its place in
// a doubly linked list, logSeq[i] its state and carries[i] how often its
// logged record was carried forward unchanged (kept apart, so a lookup
// never drags them into cache); table is a linear-probing table of uint64
// slots, each the 32-bit hash of an ID and its entry index + 1. The hash in
// the slot lets a miss finish without touching an entry. Deletion shifts the
// rest of a probe cluster back instead of leaving tombstones, so churn never
// degrades probing. Nothing holds a pointer: the arrays are noscan
// allocations the GC never traverses. They grow (entries by append, the
// table by doubling and rehashing at half load), so a follower with few
// sessions does not pay for a large CacheSize up front.
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

	table    []uint64 // 0 = empty; else uint64(hash32)<<32 | uint64(index+1)
	entries  []cacheEntry
	links    []cacheLinks // links[i] belongs to entries[i]
	logSeq   []uint64     // logSeq[i]: 0 if entries[i] is clean, else its delta
	carries  []uint8      // carries[i]: times entries[i]'s logged record was carried forward unchanged
	seed0    uint64
	seed1    uint64
	mask     uint32
	shift    uint8 // home slot = hash32 >> shift
	capacity int32 // bound on clean entries

	n      int32     // live entries, clean and dirty
	ndirty int32     // of which dirty
	lru    cacheList // clean entries; head = most recently put
	dirty  cacheList // dirty entries; head = oldest logged change
	free   int32     // free list (via links.next) of removed entries, or nilIdx
}

type cacheList struct{ head, tail int32 }

const (
	nilIdx = -1
	// closedBit marks a closed session in cacheEntry.hwm, so an entry is 32
	// bytes and two fit a cache line. No HWM reaches it (MaxSeqNo).
	closedBit = 1 << 63
	// minSlots is the table's first size; it doubles from there.
	minSlots = 1 << 10
	// maxCacheCapacity keeps entry indexes (+1) in the 32 low bits of a slot
	// and table sizes in int; larger CacheSizes are clamped.
	maxCacheCapacity = 1 << 30
)

type cacheEntry struct {
	id     ID
	hwm    uint64 // record.hwm | closedBit if closed
	lastTS int64
}

type cacheLinks struct {
	prev, next int32 // prev is toward the most recently put (head)
}

func newHWMCache(capacity int) *hwmCache {
	c := &hwmCache{
		capacity: int32(min(max(capacity, 1), maxCacheCapacity)),
		lru:      cacheList{nilIdx, nilIdx},
		dirty:    cacheList{nilIdx, nilIdx},
		free:     nilIdx,
		// IDs arrive in shipped events; a per-cache random seed keeps anyone
		// who can choose IDs from aiming them at one probe cluster.
		seed0: rand.Uint64(),
		seed1: rand.Uint64() | 1,
	}
	c.setTable(minSlots)
	return c
}

func (c *hwmCache) setTable(slots int) {
	c.table = make([]uint64, slots)
	c.mask = uint32(slots - 1)
	c.shift = uint8(32 - bits.TrailingZeros(uint(slots)))
}

// hash32 mixes the whole ID with the cache's seed (a wyhash-style
// multiply-fold, as idempotency.Store does for keys). A slot word is never 0
// because the index part is index+1.
func (c *hwmCache) hash32(id *ID) uint32 {
	lo := binary.LittleEndian.Uint64(id[0:8])
	hi := binary.LittleEndian.Uint64(id[8:16])
	h1, h0 := bits.Mul64(lo^c.seed0, hi^c.seed1)
	return uint32((h1 ^ h0) >> 32)
}

// find returns the table slot and entry index of id, or the empty slot where
// the probe stopped and nilIdx.
func (c *hwmCache) find(id *ID, h uint32) (slot uint32, idx int32) {
	slot = h >> c.shift
	for {
		v := c.table[slot]
		if v == 0 {
			return slot, nilIdx
		}
		if uint32(v>>32) == h {
			i := int32(uint32(v)) - 1
			if c.entries[i].id == *id {
				return slot, i
			}
		}
		slot = (slot + 1) & c.mask
	}
}

// peek returns the cached record of id without changing recency. Only the
// goroutine that changes the cache may call it without holding mu.
func (c *hwmCache) peek(id *ID) (record, bool) {
	_, i := c.find(id, c.hash32(id))
	if i == nilIdx {
		return record{}, false
	}
	e := &c.entries[i]
	return record{hwm: SeqNo(e.hwm &^ closedBit), lastTS: e.lastTS, closed: e.hwm&closedBit != 0}, true
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
	n := c.n
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
	hwm := uint64(r.hwm)
	if r.closed {
		hwm |= closedBit
	}
	h := c.hash32(id)
	slot, i := c.find(id, h)
	if i != nilIdx {
		c.entries[i].hwm, c.entries[i].lastTS = hwm, r.lastTS
		c.carries[i] = carries
		if c.logSeq[i] == 0 && seq == 0 && i == c.lru.head {
			return
		}
		c.unlink(i)
		c.link(i, seq)
		c.evictOverCapacity()
		return
	}
	switch {
	case seq == 0 && c.n-c.ndirty == c.capacity:
		i = c.lru.tail
		c.removeIdx(i)
		// The shift may have opened a hole earlier on id's probe path.
		slot, _ = c.find(id, h)
	case c.free != nilIdx:
		i = c.free
		c.free = c.links[i].next
	default:
		i = int32(len(c.entries))
		c.entries = append(c.entries, cacheEntry{})
		c.links = append(c.links, cacheLinks{})
		c.logSeq = append(c.logSeq, 0)
		c.carries = append(c.carries, 0)
	}
	c.entries[i] = cacheEntry{id: *id, hwm: hwm, lastTS: r.lastTS}
	c.carries[i] = carries
	c.table[slot] = uint64(h)<<32 | uint64(uint32(i)+1)
	c.link(i, seq)
	c.n++
	if int(c.n) > len(c.table)/2 {
		c.grow()
	}
}

// markClean makes id's dirty entry clean (its row now holds its record), as
// the most recently put clean entry. Clean entries beyond CacheSize are then
// evicted, least recently put first. Caller holds mu.
func (c *hwmCache) markClean(id *ID) {
	_, i := c.find(id, c.hash32(id))
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
func (c *hwmCache) evictOverCapacity() {
	for c.n-c.ndirty > c.capacity {
		t := c.lru.tail
		c.removeIdx(t)
		c.freeIdx(t)
	}
}

// oldestDirty returns the dirty entry with the oldest logged change, or
// nilIdx; nextDirty the one after i; carried how often i's record was
// carried forward unchanged. The tx goroutine reads them without mu.
func (c *hwmCache) oldestDirty() int32      { return c.dirty.head }
func (c *hwmCache) nextDirty(i int32) int32 { return c.links[i].next }
func (c *hwmCache) carried(i int32) uint8   { return c.carries[i] }

// dirtyLen returns the number of dirty entries (tx goroutine only).
func (c *hwmCache) dirtyLen() int { return int(c.ndirty) }

// remove drops id from the cache, if present. Caller holds mu.
func (c *hwmCache) remove(id *ID) {
	_, i := c.find(id, c.hash32(id))
	if i == nilIdx {
		return
	}
	c.removeIdx(i)
	c.freeIdx(i)
}

func (c *hwmCache) freeIdx(i int32) {
	c.entries[i] = cacheEntry{}
	c.logSeq[i] = 0
	c.carries[i] = 0
	c.links[i] = cacheLinks{prev: nilIdx, next: c.free}
	c.free = i
}

// removeIdx drops live entry i from the table and its list; the caller
// reuses or frees its index.
func (c *hwmCache) removeIdx(i int32) {
	id := &c.entries[i].id
	slot, _ := c.find(id, c.hash32(id))
	c.deleteSlot(slot)
	c.unlink(i)
	c.n--
}

// deleteSlot empties slot and shifts the rest of its cluster back so every
// remaining ID stays reachable from its home slot.
func (c *hwmCache) deleteSlot(hole uint32) {
	j := hole
	for {
		j = (j + 1) & c.mask
		v := c.table[j]
		if v == 0 {
			break
		}
		home := uint32(v>>32) >> c.shift
		// Move j into the hole unless its home lies cyclically in (hole, j].
		if (j-home)&c.mask >= (j-hole)&c.mask {
			c.table[hole] = v
			hole = j
		}
	}
	c.table[hole] = 0
}

// grow doubles the table and reinserts every live entry.
func (c *hwmCache) grow() {
	c.setTable(len(c.table) * 2)
	for _, l := range []cacheList{c.lru, c.dirty} {
		for i := l.head; i != nilIdx; i = c.links[i].next {
			h := c.hash32(&c.entries[i].id)
			slot := h >> c.shift
			for c.table[slot] != 0 {
				slot = (slot + 1) & c.mask
			}
			c.table[slot] = uint64(h)<<32 | uint64(uint32(i)+1)
		}
	}
}

// unlink takes live entry i out of its list (clean or dirty).
func (c *hwmCache) unlink(i int32) {
	l := &c.lru
	if c.logSeq[i] != 0 {
		l = &c.dirty
		c.ndirty--
	}
	p := c.links[i]
	if p.prev != nilIdx {
		c.links[p.prev].next = p.next
	} else {
		l.head = p.next
	}
	if p.next != nilIdx {
		c.links[p.next].prev = p.prev
	} else {
		l.tail = p.prev
	}
}

// link puts entry i, in no list, at the front of the clean list (seq 0) or
// at the newest end of the dirty list.
func (c *hwmCache) link(i int32, seq uint64) {
	c.logSeq[i] = seq
	if seq == 0 {
		c.links[i] = cacheLinks{prev: nilIdx, next: c.lru.head}
		if c.lru.head != nilIdx {
			c.links[c.lru.head].prev = i
		} else {
			c.lru.tail = i
		}
		c.lru.head = i
		return
	}
	c.ndirty++
	c.links[i] = cacheLinks{prev: c.dirty.tail, next: nilIdx}
	if c.dirty.tail != nilIdx {
		c.links[c.dirty.tail].next = i
	} else {
		c.dirty.head = i
	}
	c.dirty.tail = i
}

// prefetch touches the table slot and, if the home slot holds a candidate,
// the entry a lookup of id will read and the entry's log state and links,
// which the commit of an advance reads (set: logSeq, then unlink), and
// returns a value derived from them (so the loads are not dropped). Its
// loads depend on nothing a caller's loop computes, so the CPU overlaps the
// cache misses of many calls; the lookups that follow then hit. Only the
// goroutine that changes the cache may call it.
//
// The log state and links were left out once: then the first read of
// logSeq in set was a cache miss per advanced session, about half of set's
// time (go test ./bench -bench 'Receiver/dup100-window$' -cpuprofile).
func (c *hwmCache) prefetch(id *ID) uint64 {
	h := c.hash32(id)
	v := c.table[h>>c.shift]
	if v == 0 || uint32(v>>32) != h {
		return v
	}
	i := uint32(v) - 1
	return c.entries[i].hwm + c.logSeq[i] + uint64(c.links[i].prev)
}
