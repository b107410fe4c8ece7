package session

import (
	"math/rand/v2"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/oncewal/oncewal/testutil"
	"github.com/stretchr/testify/require"
)

// modelTracker is the Tracker's rules written as plainly as possible: a map
// copied per batch, no cache, no disk.
type modelTracker struct {
	rows    map[ID]record
	clock   int64
	horizon int64
}

func (m *modelTracker) clone() *modelTracker {
	c := &modelTracker{rows: make(map[ID]record, len(m.rows)), clock: m.clock, horizon: m.horizon}
	for k, v := range m.rows {
		c.rows[k] = v
	}
	return c
}

func (m *modelTracker) live(id ID) (record, bool) {
	r, ok := m.rows[id]
	return r, ok && r.lastTS >= m.clock-m.horizon
}

func (m *modelTracker) check(id ID, seq SeqNo, ts int64) Decision {
	r, ok := m.live(id)
	switch {
	case !ok && ts < m.clock-m.horizon:
		return TooOld
	case !ok && seq == 1:
		return Apply
	case !ok:
		return Gap
	case seq <= r.hwm:
		return Duplicate
	case r.closed:
		return Closed
	case seq == r.hwm+1:
		return Apply
	}
	return Gap
}

func (m *modelTracker) advance(id ID, seq SeqNo, ts int64) {
	r, ok := m.live(id)
	if !ok {
		r = record{}
	}
	r.hwm, r.lastTS = seq, max(r.lastTS, ts)
	m.rows[id] = r
	m.clock = max(m.clock, ts)
}

func (m *modelTracker) close(id ID, ts int64) {
	r := m.rows[id]
	r.closed, r.lastTS = true, max(r.lastTS, ts)
	m.rows[id] = r
	m.clock = max(m.clock, ts)
}

// TestTrackerAgainstModel drives the Tracker (tiny cache, random aborts,
// never-committed batches, GC, reopen) and the model with the same random
// events and requires identical decisions and stored HWMs. After every event
// and batch it also checks the cache and the store (requireCommitted): the
// cache holds only committed records — a tx's pending changes never reach it
// before Commit, and an aborted or never-committed tx leaves none — and
// every session whose row is not its committed record is pinned in the
// cache (eviction takes clean entries only, never a logged one); and
// ScanHWMs, which merges rows and log, shows the committed records.
//
// Configurations: cache sizes 1 and 4 evict constantly (12 sessions), 64
// never does; the HWM log off (rows only), with short LogBatches and
// LogSessions (constant checkpoints), and at its defaults (12 sessions never
// leave the log). ONCEWAL_LONG=1 runs 50x more batches.
func TestTrackerAgainstModel(t *testing.T) {
	batches := 400
	if os.Getenv("ONCEWAL_LONG") != "" {
		batches = 20_000
	}
	for seed, cfg := range []struct {
		cacheSize, logBatches, logSessions int
		evicts                             bool // clean entries reach cacheSize
	}{
		1: {4, -1, 0, true}, 2: {4, 3, 5, true}, 3: {4, 0, 0, false},
		4: {1, -1, 0, true}, 5: {1, 1, 2, true}, 6: {64, 4, 100, false},
	} {
		if cfg.cacheSize == 0 {
			continue
		}
		cacheSize := cfg.cacheSize
		rng := rand.New(rand.NewPCG(uint64(seed), 99))
		peeks := rand.New(rand.NewPCG(uint64(seed), 7)) // PeekAll's own draws
		fs := vfs.NewMem()
		db := testutil.OpenDB(t, fs, "db")
		opts := &TrackerOptions{CacheSize: cacheSize, RetentionHorizon: 50 * time.Second,
			LogBatches: cfg.logBatches, LogSessions: cfg.logSessions}
		tr := openTracker(t, db, opts)
		model := &modelTracker{rows: map[ID]record{}, horizon: int64(opts.RetentionHorizon)}
		ids := make([]ID, 12)
		for i := range ids {
			ids[i] = NewID()
		}
		now := int64(1000 * time.Second)
		fullest := 0
		for range batches {
			b := db.NewBatch()
			tx := tr.Begin(b)
			pending := model.clone()
			for range 1 + rng.IntN(8) {
				id := ids[rng.IntN(len(ids))]
				now += int64(rng.IntN(int(5 * time.Second)))
				ts := now - int64(rng.IntN(int(70*time.Second))) // sometimes older than the horizon
				r := pending.rows[id]
				var seq SeqNo
				switch rng.IntN(6) {
				case 0:
					seq = SeqNo(1 + rng.IntN(int(r.hwm)+1)) // duplicate or 1
				case 1:
					seq = r.hwm + 2 + SeqNo(rng.IntN(3)) // gap
				default:
					seq = r.hwm + 1
				}
				if peeks.IntN(3) == 0 {
					requirePeekAll(t, tx, ids, peeks)
				}
				want := pending.check(id, seq, ts)
				got, err := tx.Check(id, seq, ts)
				require.NoError(t, err)
				require.Equal(t, want, got, "seed %d id %s seq %d hwm %d", seed, id, seq, r.hwm)
				if got == Apply {
					require.NoError(t, tx.Advance(id, seq, ts))
					pending.advance(id, seq, ts)
					if rng.IntN(10) == 0 {
						require.NoError(t, tx.MarkClosed(id, ts))
						pending.close(id, ts)
					}
				} else {
					require.Error(t, tx.Advance(id, seq, ts), "advance must refuse a %v", got)
				}
				require.Equal(t, pending.clock, max(tx.Clock(), 0))
				if rng.IntN(8) == 0 { // Flush may run more than once per tx
					require.NoError(t, tx.Flush())
				}
				requireCommitted(t, db, tr, model)
			}
			if rng.IntN(5) == 0 {
				_, err := tx.CollectGarbage(rng.IntN(6))
				require.NoError(t, err)
			}
			require.NoError(t, tx.Flush())
			switch rng.IntN(10) {
			case 0: // commit failed
				tx.Abort()
			case 1: // never committed, never told
			default:
				require.NoError(t, b.Commit(pebble.NoSync))
				tx.Commit()
				model = pending
			}
			require.NoError(t, b.Close())
			if rng.IntN(40) == 0 {
				gone := collected(t, db, tr, ids)
				require.NoError(t, db.Flush())
				require.NoError(t, db.Close())
				db = testutil.OpenDB(t, fs, "db")
				tr = openTracker(t, db, opts)
				// Replaying the log brings back no collected session.
				require.Equal(t, gone, collected(t, db, tr, ids), "seed %d", seed)
			}
			require.Equal(t, model.clock, tr.Clock())
			fullest = max(fullest, requireCommitted(t, db, tr, model))
			for _, id := range ids {
				hwm, closed, found, err := tr.Get(id)
				require.NoError(t, err)
				r, ok := model.rows[id]
				if found { // GC may have removed expired rows; live rows must be there
					require.True(t, ok)
					require.Equal(t, r.hwm, hwm)
					require.Equal(t, r.closed, closed)
				} else if _, live := model.live(id); live {
					t.Fatalf("seed %d: live session %s missing", seed, id)
				}
			}
		}
		if cfg.evicts {
			require.Equal(t, cacheSize, fullest, "seed %d: the cache never filled up", seed)
		}
		require.NoError(t, db.Close())
	}
}

// requirePeekAll peeks a random batch of ids, longer than FindAll's
// lookahead and with repeats, with PeekAll, then one by one with Peek
// (whose answers Check's, checked against the model, rest on), and
// requires the same states. PeekAll goes first: with a small cache its
// Pebble reads evict entries it found before them.
func requirePeekAll(t *testing.T, tx *TrackerTx, ids []ID, rng *rand.Rand) {
	t.Helper()
	batch := make([]ID, rng.IntN(60))
	for j := range batch {
		batch[j] = ids[rng.IntN(len(ids))]
	}
	got := make([]HWM, len(batch))
	require.NoError(t, tx.PeekAll(batch, got))
	for j, id := range batch {
		want, err := tx.Peek(id)
		require.NoError(t, err)
		require.Equal(t, want, got[j], "session %s, %d of %d", id, j, len(batch))
	}
}

// collected lists the sessions among ids with neither a row nor a cache
// entry (never seen, or collected by GC).
func collected(t *testing.T, db *pebble.DB, tr *Tracker, ids []ID) []ID {
	var out []ID
	for _, id := range ids {
		_, cached := tr.cache.get(&id)
		if _, ok := diskRecord(t, db, id); !ok && !cached {
			out = append(out, id)
		}
	}
	return out
}

// requireCommitted checks the cache's structure; that every session it
// holds, clean or logged, has exactly its committed record (the model's);
// that every committed session whose row in db is not its record is in the
// cache as logged (only an expired one may have lost its row to GC); and
// that ScanHWMs shows the committed records. It returns how many clean
// entries the cache holds.
func requireCommitted(t *testing.T, db *pebble.DB, tr *Tracker, model *modelTracker) int {
	t.Helper()
	ids, recs, logged := checkCacheAll(t, tr.cache)
	for i, id := range ids {
		r, ok := model.rows[id]
		require.True(t, ok, "cached session %s has no committed row", id)
		require.Equal(t, r, recs[i], "cached session %s", id)
		row, ok := diskRecord(t, db, id)
		require.True(t, ok && row == r, "clean session %s: row %+v (%v), committed %+v", id, row, ok, r)
	}
	for id, l := range logged {
		r, ok := model.rows[id]
		require.True(t, ok, "logged session %s has no committed row", id)
		require.Equal(t, r, l.rec, "logged session %s", id)
	}
	for id, r := range model.rows {
		if _, ok := logged[id]; ok {
			continue
		}
		row, ok := diskRecord(t, db, id)
		if !ok {
			_, live := model.live(id)
			require.False(t, live, "live session %s has no row and is not pinned in the cache", id)
			continue
		}
		require.Equal(t, r, row, "session %s: stale row, not pinned in the cache", id)
	}
	scanned := map[ID]record{}
	require.NoError(t, ScanHWMs(db, func(id ID, hwm SeqNo, closed bool, lastTS int64) error {
		scanned[id] = record{hwm: hwm, closed: closed, lastTS: lastTS}
		return nil
	}))
	for id, r := range model.rows {
		if got, ok := scanned[id]; ok {
			require.Equal(t, r, got, "ScanHWMs of session %s", id)
		} else {
			_, live := model.live(id)
			require.False(t, live, "ScanHWMs misses live session %s", id)
		}
	}
	require.LessOrEqual(t, len(scanned), len(model.rows))
	return len(ids)
}

// TestTrackerConcurrentReaders runs txs on one goroutine while others read
// Get and Clock (the follower's inspect path), under -race.
func TestTrackerConcurrentReaders(t *testing.T) {
	db := testutil.MemDB(t)
	tr := openTracker(t, db, &TrackerOptions{CacheSize: 8})
	ids := []ID{NewID(), NewID(), NewID(), NewID()}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			last := map[ID]SeqNo{}
			lastClock := int64(0)
			for {
				select {
				case <-stop:
					return
				default:
				}
				for _, id := range ids {
					hwm, _, _, err := tr.Get(id)
					if err != nil {
						t.Error(err)
						return
					}
					if hwm < last[id] {
						t.Errorf("HWM moved backwards: %d < %d", hwm, last[id])
						return
					}
					last[id] = hwm
				}
				c := tr.Clock()
				if c < lastClock {
					t.Errorf("clock moved backwards")
					return
				}
				lastClock = c
			}
		}()
	}
	base := 100 * hour
	for seq := SeqNo(1); seq <= 300; seq++ {
		var evs []ev
		for i, id := range ids {
			evs = append(evs, ev{id, seq, base + int64(seq)*10 + int64(i)})
		}
		applyBatch(t, db, tr, evs...)
	}
	close(stop)
	wg.Wait()
	for _, id := range ids {
		requireHWM(t, tr, id, 300, false)
	}
}
