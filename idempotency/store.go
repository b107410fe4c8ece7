package idempotency

import (
	"slices"
	"sync"
	"sync/atomic"

	"github.com/oncewal/oncewal/internal/lrutable"
)

// DefaultCapacity is the window size used when NewStore is given a
// capacity <= 0.
const DefaultCapacity = 100_000

// MaxCapacity bounds the window (below lrutable.MaxEntries); larger requests
// are clamped.
const MaxCapacity = 1 << 28

// Store is the bounded window of recently seen keys: an exact LRU set of at
// most Capacity keys. See the package documentation for the invariants.
//
// It is an lrutable.Table sized once by NewStore — open addressing with
// backward-shift deletion, a fingerprint of each key's hash in its slot so
// a miss (the common case for a follower, where almost every key is new)
// seldom touches an entry — holding every key in one recency list.
// Everything is allocated by NewStore; no operation allocates.
type Store struct {
	// The table's read-mostly fields are kept on their own cache lines
	// (see lrutable.Table), away from mu and the list.
	t        lrutable.Table[Key, struct{}]
	capacity int32

	mu  sync.Mutex
	lru lrutable.List // every key; head = most recently seen

	evictions atomic.Uint64 // keys CheckAndRecord evicted, ever (written under mu)
}

// NewStore returns an empty window remembering up to capacity keys
// (DefaultCapacity if capacity <= 0, clamped to MaxCapacity). All memory is
// allocated here (StoreBytes): the table never grows, so its prefetch hints
// may run outside the lock (lrutable, invariants 4 and 5).
func NewStore(capacity int) *Store {
	capacity = clampCapacity(capacity)
	s := &Store{capacity: int32(capacity), lru: lrutable.NewList()}
	s.t.Init(lrutable.SlotsFor(capacity), capacity)
	return s
}

func clampCapacity(capacity int) int {
	if capacity <= 0 {
		capacity = DefaultCapacity
	}
	return min(capacity, MaxCapacity)
}

// StoreBytes is the memory NewStore(capacity) allocates — all a window ever
// holds: 24 B per entry (the key and its links) plus 4 B per table slot,
// with 1/0.55 slots per entry (lrutable.SlotsFor): about 31.3 B per entry.
func StoreBytes(capacity int) int64 {
	capacity = clampCapacity(capacity)
	return lrutable.Bytes[Key, struct{}](lrutable.SlotsFor(capacity), capacity)
}

// CheckAndRecord reports whether k is new. A new key is recorded as the
// most recently seen, evicting the least recently seen key if the window is
// full; a duplicate (false) is moved to most recently seen. Atomic: of any
// number of concurrent calls with the same absent key exactly one returns
// true.
func (s *Store) CheckAndRecord(k Key) bool {
	h := s.t.Hash(&k)
	s.t.Warm(h, &s.lru)
	s.mu.Lock()
	added, evicted := s.t.Touch(&s.lru, &k, h, s.capacity)
	if evicted {
		s.evictions.Store(s.evictions.Load() + 1) // under mu: no read-modify-write needed
	}
	s.mu.Unlock()
	return added
}

// Prefetch is a hint with no effect on the window: it pulls into cache the
// lines a later operation on k will touch — its probe slots and, if k is
// resident, its entry and list neighbours — without taking the lock. Cache
// misses are most of an operation's cost; taking them outside the lock
// keeps the locked section short (see the package doc for what that does
// and does not buy). A caller about to check a whole batch of keys
// prefetches them all first (PrefetchKeys), so that their cache misses
// overlap instead of stalling each check in turn.
func (s *Store) Prefetch(k *Key) { s.t.Warm(s.t.Hash(k), &s.lru) }

// PrefetchKeys is Prefetch for a whole batch of keys, which a caller about
// to check them all (the follower's receiver) calls first; its passes over
// chunks of keys overlap the chunk's misses (lrutable.Table.PrefetchKeys).
// Like Prefetch, a hint with no effect on the window.
func (s *Store) PrefetchKeys(keys []Key) { s.t.PrefetchKeys(keys, &s.lru) }

// Contains reports whether k is in the window without refreshing its
// recency (so inspection never changes what gets evicted).
func (s *Store) Contains(k Key) bool {
	h := s.t.Hash(&k)
	s.t.Warm(h, &s.lru)
	s.mu.Lock()
	_, i := s.t.Find(&k, h)
	s.mu.Unlock()
	return i != lrutable.Nil
}

// Release forgets k if present: used when the event a key was recorded for
// failed to apply, so its retry is not mistaken for a duplicate. Releasing
// an absent key does nothing.
func (s *Store) Release(k Key) {
	h := s.t.Hash(&k)
	s.t.Warm(h, &s.lru)
	s.mu.Lock()
	if slot, i := s.t.Find(&k, h); i != lrutable.Nil {
		s.t.Unlink(&s.lru, i)
		s.t.Delete(slot, i)
	}
	s.mu.Unlock()
}

// Len returns the number of keys in the window (<= Capacity).
func (s *Store) Len() int {
	s.mu.Lock()
	n := s.t.Len()
	s.mu.Unlock()
	return int(n)
}

// Evictions returns how many keys CheckAndRecord has evicted since
// NewStore. After Capacity evictions following a key's last recording, that
// key has left the window: each eviction takes the least recently seen key,
// and fewer than Capacity keys are ever behind it (the window journal relies
// on this to drop entries nothing in the window needs).
func (s *Store) Evictions() uint64 { return s.evictions.Load() }

// Capacity returns the maximum number of keys the window remembers.
func (s *Store) Capacity() int { return int(s.capacity) }

// Keys appends the window's keys to dst from least to most recently seen and
// returns the extended slice. Recording them in that order with
// CheckAndRecord into an empty store of the same capacity restores the same
// window (same keys, same eviction order).
func (s *Store) Keys(dst []Key) []Key {
	s.mu.Lock()
	defer s.mu.Unlock()
	dst = slices.Grow(dst, int(s.t.Len()))
	for i := s.lru.Tail; i != lrutable.Nil; i = s.t.Prev(i) {
		dst = append(dst, s.t.At(i).Key)
	}
	return dst
}
