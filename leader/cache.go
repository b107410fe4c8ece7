package leader

import (
	"sort"
	"sync"
	"sync/atomic"

	"github.com/oncewal/oncewal/wal"
)

// DefaultCacheBytes is the default ShipperOptions.CacheBytes.
const DefaultCacheBytes = 64 << 20

// CacheStats describes the batch cache.
type CacheStats struct {
	Batches  uint64 // batches held
	Bytes    uint64 // bytes held (≤ CacheBytes)
	FirstLSN uint64 // first LSN held (0: empty)
	LastLSN  uint64 // last LSN held, or appended when empty (0: never fed)
	Appended uint64 // batches handed to Appended
	Restarts uint64 // batches that did not continue the cache (a missed Appended), which restarted it
	Hits     uint64 // batches the streams took from the cache
}

type cacheEntry struct {
	h   wal.Header
	raw []byte
	cum uint64 // bytes appended through this batch since the cache was created
}

// batchCache is the cache of recent batches. Safe for concurrent use.
type batchCache struct {
	max int64

	mu      sync.RWMutex
	ents    []cacheEntry // ents[head:] are live, in LSN order
	head    int
	bytes   int64
	end     uint64 // LSN after the last batch appended (0: never fed)
	cum     uint64 // bytes appended in total
	events  uint64 // events appended in total
	fed     uint64
	restart uint64

	hits atomic.Uint64
}

func newBatchCache(max int64) *batchCache { return &batchCache{max: max} }

// add copies one appended batch into the cache.
func (c *batchCache) add(h wal.Header, raw []byte) {
	e := cacheEntry{h: h}
	if int64(len(raw)) <= c.max {
		e.raw = append([]byte(nil), raw...)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.fed++
	if c.end != 0 && h.FirstLSN != c.end {
		c.restart++
		c.dropLocked(len(c.ents))
	}
	c.cum += uint64(len(raw))
	c.events += uint64(h.Count)
	c.end = h.LastLSN() + 1
	if e.raw == nil {
		// Larger than the whole cache: not held, and nothing before it
		// continues into it.
		c.dropLocked(len(c.ents))
		return
	}
	e.cum = c.cum
	c.ents = append(c.ents, e)
	c.bytes += int64(len(raw))
	n, b := c.head, c.bytes
	for b > c.max {
		b -= int64(len(c.ents[n].raw))
		n++
	}
	c.dropLocked(n)
}

// dropLocked evicts the entries before index n.
func (c *batchCache) dropLocked(n int) {
	for i := c.head; i < n; i++ {
		if i >= len(c.ents) {
			break
		}
		c.bytes -= int64(len(c.ents[i].raw))
		c.ents[i] = cacheEntry{}
	}
	if n >= len(c.ents) {
		c.ents, c.head, c.bytes = c.ents[:0], 0, 0
		return
	}
	c.head = n
	if c.head > len(c.ents)/2 { // compact: amortised O(1) per batch
		k := copy(c.ents, c.ents[c.head:])
		clear(c.ents[k:])
		c.ents, c.head = c.ents[:k], 0
	}
}

// get returns the cached batch holding lsn. atEnd reports that lsn is the
// next LSN to be appended: nothing to read yet, and no reason to look on
// disk.
func (c *batchCache) get(lsn uint64) (h wal.Header, raw []byte, ok, atEnd bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.end != 0 && lsn == c.end {
		return wal.Header{}, nil, false, true
	}
	live := c.ents[c.head:]
	if len(live) == 0 || lsn < live[0].h.FirstLSN || lsn >= c.end {
		return wal.Header{}, nil, false, false
	}
	i := sort.Search(len(live), func(i int) bool { return live[i].h.LastLSN() >= lsn })
	c.hits.Add(1)
	return live[i].h, live[i].raw, true, false
}

// bytesAfter returns the bytes appended after lsn; ok is false unless lsn is
// within the cache (from just before its first batch to its end). A batch
// holding lsn counts whole: it is what would be sent again.
func (c *batchCache) bytesAfter(lsn uint64) (bytes uint64, ok bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	live := c.ents[c.head:]
	if c.end == 0 || lsn >= c.end-1 {
		return 0, c.end != 0
	}
	if len(live) == 0 || lsn+1 < live[0].h.FirstLSN {
		return 0, false
	}
	i := sort.Search(len(live), func(i int) bool { return live[i].h.LastLSN() > lsn })
	below := live[0].cum - uint64(len(live[0].raw))
	if i > 0 {
		below = live[i-1].cum
	}
	return c.cum - below, true
}

// mean returns the bytes and events appended through the cache.
func (c *batchCache) mean() (bytes, events uint64) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.cum, c.events
}

// lastLSN is the last LSN appended through the cache (0: none).
func (c *batchCache) lastLSN() uint64 {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.end == 0 {
		return 0
	}
	return c.end - 1
}

func (c *batchCache) stats() CacheStats {
	c.mu.RLock()
	defer c.mu.RUnlock()
	st := CacheStats{Batches: uint64(len(c.ents) - c.head), Bytes: uint64(c.bytes), Appended: c.fed,
		Restarts: c.restart, Hits: c.hits.Load()}
	if st.Batches > 0 {
		st.FirstLSN = c.ents[c.head].h.FirstLSN
	}
	if c.end > 0 {
		st.LastLSN = c.end - 1
	}
	return st
}
