package session

import (
	"encoding/binary"
	"math/rand/v2"
	"os"
	"slices"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	lru "github.com/hashicorp/golang-lru/v2"
	"github.com/stretchr/testify/require"

	"github.com/oncewal/oncewal/internal/lrutable"
)

// checkCache verifies the cache's structure — lists and table agree, every
// entry is reachable from its home slot, counts match, the clean bound
// holds, the dirty list is in delta order — and returns its clean contents
// from least to most recently put.
func checkCache(t testing.TB, c *hwmCache) (ids []ID, recs []record) {
	ids, recs, _ = checkCacheAll(t, c)
	return ids, recs
}

// checkCacheAll is checkCache that also returns the dirty entries, oldest
// logged change first.
func checkCacheAll(t testing.TB, c *hwmCache) (ids []ID, recs []record, dirty map[ID]loggedRecord) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.t.Verify(&c.lru, &c.dirty); err != nil {
		t.Fatal(err)
	}
	ids, recs, dirty = []ID{}, []record{}, map[ID]loggedRecord{}
	walk := func(l lrutable.List, dirtyList bool, visit func(i int32)) int {
		n := 0
		for i := l.Head; i != nilIdx; i = c.t.Next(i) {
			if (c.logSeq[i] != 0) != dirtyList {
				t.Fatalf("entry %d with delta %d in the wrong list", i, c.logSeq[i])
			}
			visit(i)
			n++
		}
		return n
	}
	nclean := walk(c.lru, false, func(i int32) {
		id := c.idAt(i)
		r, _ := c.peek(&id)
		ids, recs = append(ids, id), append(recs, r)
	})
	slices.Reverse(ids)
	slices.Reverse(recs)
	var last uint64
	ndirty := walk(c.dirty, true, func(i int32) {
		if c.logSeq[i] < last {
			t.Fatalf("dirty list out of delta order: %d after %d", c.logSeq[i], last)
		}
		last = c.logSeq[i]
		id := c.idAt(i)
		r, _ := c.peek(&id)
		dirty[id] = loggedRecord{rec: r, exists: true, seq: c.logSeq[i]}
	})
	if ndirty != int(c.ndirty) {
		t.Fatalf("ndirty=%d, dirty list %d", c.ndirty, ndirty)
	}
	if nclean > int(c.capacity) {
		t.Fatalf("%d clean entries, capacity %d", nclean, c.capacity)
	}
	return ids, recs, dirty
}

func cacheID(n uint64) ID {
	var id ID
	binary.LittleEndian.PutUint64(id[:], n)
	binary.LittleEndian.PutUint64(id[8:], n*0x9e3779b97f4a7c15)
	return id
}

// TestHWMCacheAgainstLRU drives the cache and a reference with the same
// random operations and requires the same answers and the same contents in
// the same order after every step. The reference for clean entries is
// golang-lru/v2 (Add = put, Remove = remove, Peek = peek); logged (dirty)
// entries are a plain list in delta order beside it, outside its capacity:
// putDirty moves a session there, markClean back to the LRU as its newest
// (evicting the oldest clean entry beyond capacity). Capacities cover a
// single entry, eviction with a small table, and growth of the table.
// ONCEWAL_LONG=1 runs 20x more steps.
func TestHWMCacheAgainstLRU(t *testing.T) {
	steps := 20_000
	if os.Getenv("ONCEWAL_LONG") != "" {
		steps *= 20
	}
	for _, tc := range []struct{ capacity, ids int }{{1, 4}, {3, 10}, {64, 200}, {5000, 8000}} {
		for _, withDirty := range []bool{false, true} {
			rng := rand.New(rand.NewPCG(uint64(tc.capacity), 5))
			c := newHWMCache(tc.capacity)
			ref, err := lru.New[ID, record](tc.capacity)
			require.NoError(t, err)
			type dirtyRef struct {
				id  ID
				rec record
				seq uint64
			}
			var dirty []dirtyRef
			dropDirty := func(id ID) (record, bool) {
				for k, d := range dirty {
					if d.id == id {
						dirty = slices.Delete(dirty, k, k+1)
						return d.rec, true
					}
				}
				return record{}, false
			}
			seq := uint64(0)
			ops := 10
			if withDirty {
				ops = 14
			}
			for step := range steps {
				id := cacheID(uint64(rng.IntN(tc.ids)))
				r := record{hwm: SeqNo(1 + rng.IntN(1000)), lastTS: rng.Int64() - rng.Int64(), closed: rng.IntN(4) == 0}
				c.mu.Lock()
				switch op := rng.IntN(ops); {
				case op < 5:
					c.put(&id, r)
					dropDirty(id)
					ref.Add(id, r)
				case op < 7:
					c.remove(&id)
					dropDirty(id)
					ref.Remove(id)
				case op < 10:
					got, ok := c.peek(&id)
					want, wantOK := ref.Peek(id)
					for _, d := range dirty {
						if d.id == id {
							want, wantOK = d.rec, true
						}
					}
					c.mu.Unlock()
					require.Equal(t, wantOK, ok, "capacity %d step %d", tc.capacity, step)
					require.Equal(t, want, got, "capacity %d step %d", tc.capacity, step)
					c.mu.Lock()
				case op < 12:
					seq += uint64(rng.IntN(2))
					c.putDirty(&id, r, seq+1, 0)
					dropDirty(id)
					ref.Remove(id)
					dirty = append(dirty, dirtyRef{id, r, seq + 1})
				default:
					c.markClean(&id)
					if rec, ok := dropDirty(id); ok {
						ref.Add(id, rec)
					}
				}
				c.mu.Unlock()
				if step%97 == 0 || tc.capacity < 100 {
					ids, recs, logged := checkCacheAll(t, c)
					require.Equal(t, ref.Keys(), ids, "capacity %d step %d: contents or order", tc.capacity, step)
					require.Equal(t, ref.Values(), recs, "capacity %d step %d", tc.capacity, step)
					require.Len(t, logged, len(dirty))
					for _, d := range dirty {
						require.Equal(t, loggedRecord{rec: d.rec, exists: true, seq: d.seq}, logged[d.id])
					}
				}
			}
			require.Equal(t, ref.Len()+len(dirty), c.len())
		}
	}
}

// TestHWMCacheGrowsToCapacity fills a cache of 100K: the table grows from
// its first size by doubling, nothing is evicted before the bound, and the
// arrays end at the capacity's size.
func TestHWMCacheGrowsToCapacity(t *testing.T) {
	const capacity = 100_000
	c := newHWMCache(capacity)
	require.Equal(t, minSlots, c.t.Slots())
	c.mu.Lock()
	for n := range uint64(capacity) {
		id := cacheID(n)
		c.put(&id, record{hwm: SeqNo(n + 1), lastTS: int64(n)})
	}
	c.mu.Unlock()
	require.Equal(t, capacity, c.len())
	// Doubling from minSlots, the first size whose load bound (0.55)
	// holds 100K: 1<<17 slots hold 72,089.
	require.Equal(t, 1<<18, c.t.Slots())
	require.Less(t, lrutable.SlotsFor(capacity), 1<<18)
	require.Greater(t, lrutable.SlotsFor(capacity), 1<<17)
	for n := range uint64(capacity) {
		id := cacheID(n)
		if r, ok := c.peek(&id); !ok || r != (record{hwm: SeqNo(n + 1), lastTS: int64(n)}) {
			t.Fatalf("session %d: %+v %v before the cache was full", n, r, ok)
		}
	}
	c.mu.Lock()
	id := cacheID(capacity)
	c.put(&id, record{hwm: 1})
	c.mu.Unlock()
	first := cacheID(0)
	_, ok := c.peek(&first)
	require.False(t, ok, "the least recently put session stays past the bound")
	checkCache(t, c)
}

// TestMaxSeqNo: the cache keeps the closed flag in the HWM's top bit, so
// no record may use it: Advance stops at MaxSeqNo and a stored row or delta
// beyond it is corrupt.
func TestMaxSeqNo(t *testing.T) {
	db := memDB(t)
	tr := openTracker(t, db, &TrackerOptions{CacheSize: 4})
	id := NewID()
	base := 100 * hour
	var kb [hwmKeyLen]byte
	var vb [hwmValLen]byte
	require.NoError(t, db.Set(hwmKey(&kb, id), encodeRecord(&vb, record{hwm: MaxSeqNo - 1, lastTS: base}), pebble.Sync))
	require.Equal(t, []Decision{Apply}, applyBatch(t, db, tr, ev{id, MaxSeqNo, base}))
	requireHWM(t, tr, id, MaxSeqNo, false)
	b := db.NewBatch()
	defer b.Close()
	tx := tr.Begin(b)
	require.Equal(t, Gap, mustCheck(t, tx, id, MaxSeqNo+1, base))
	require.ErrorIs(t, tx.Advance(id, MaxSeqNo+1, base), ErrNotNext)
	tx.Abort()

	other := NewID()
	require.NoError(t, db.Set(hwmKey(&kb, other), encodeRecord(&vb, record{hwm: MaxSeqNo + 1, lastTS: base}), pebble.Sync))
	_, _, _, err := tr.Get(other)
	require.ErrorIs(t, err, ErrCorrupt)
	var lk [logKeyLen]byte
	require.NoError(t, db.Set(logKey(&lk, 1<<40), appendLogEntryV1([]byte{logVersion1}, &other, record{hwm: MaxSeqNo + 1}, true), pebble.Sync))
	_, err = OpenTracker(db, nil)
	require.ErrorIs(t, err, ErrCorrupt)
}
