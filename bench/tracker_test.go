package bench

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/oncewal/oncewal/store"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/testutil"
)

// trackerRig is a Pebble store with `sessions` HWM rows (flushed to sstables,
// so a cache miss is a real point read) and a Tracker over it.
type trackerRig struct {
	db   *pebble.DB
	tr   *session.Tracker
	ids  []session.ID
	hwm  []session.SeqNo
	rng  *rand.Rand
	base int64
}

func newTrackerRig(b *testing.B, sessions, cache int) *trackerRig {
	return newTrackerRigOpts(b, sessions, session.TrackerOptions{CacheSize: cache})
}

func newTrackerRigOpts(b *testing.B, sessions int, opts session.TrackerOptions) *trackerRig {
	b.Helper()
	o := testutil.DBOptions(vfs.Default)
	o.Logger, o.CacheSize = store.FatalLogger{}, 64<<20
	db := testutil.OpenDBWith(b, b.TempDir(), o)
	b.Cleanup(func() { db.Close() })
	r := &trackerRig{db: db, ids: make([]session.ID, sessions), hwm: make([]session.SeqNo, sessions),
		rng: rand.New(rand.NewPCG(1, 2)), base: 1_700_000_000_000_000_000}
	tr, err := session.OpenTracker(db, &opts)
	if err != nil {
		b.Fatal(err)
	}
	for i := range r.ids {
		r.ids[i] = session.NewID()
	}
	const chunk = 10_000
	for lo := 0; lo < sessions; lo += chunk {
		batch := db.NewBatch()
		tx := tr.Begin(batch)
		for i := lo; i < min(lo+chunk, sessions); i++ {
			if err := tx.Advance(r.ids[i], 1, r.base); err != nil {
				b.Fatal(err)
			}
			r.hwm[i] = 1
		}
		if err := tx.Flush(); err != nil {
			b.Fatal(err)
		}
		if err := batch.Commit(pebble.NoSync); err != nil {
			b.Fatal(err)
		}
		tx.Commit()
		batch.Close()
	}
	if err := db.Flush(); err != nil {
		b.Fatal(err)
	}
	// Reopen the tracker so the cache starts empty (but for the sessions
	// the HWM log pins).
	r.tr, err = session.OpenTracker(db, &opts)
	if err != nil {
		b.Fatal(err)
	}
	return r
}

// run processes b.N events, batchSize per Pebble batch, in runs of `run`
// consecutive events of one random session. flushEach calls Flush after every
// Advance, i.e. one HWM Set per event instead of one per session per batch.
// With pebbleCommit false the batch is flushed and reset but not committed,
// and the tx is committed anyway: that isolates the Tracker's own CPU cost
// (Check, Advance, Flush into the batch, publish) from Pebble's commit.
func (r *trackerRig) run(b *testing.B, batchSize, run int, flushEach, pebbleCommit bool) {
	batch := r.db.NewBatch()
	tx := r.tr.Begin(batch)
	inBatch := 0
	commit := func() {
		if err := tx.Flush(); err != nil {
			b.Fatal(err)
		}
		if pebbleCommit {
			if err := batch.Commit(pebble.NoSync); err != nil {
				b.Fatal(err)
			}
		}
		tx.Commit()
		batch.Reset()
		tx = r.tr.Begin(batch)
		inBatch = 0
	}
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := cpuNanos()
	for n := 0; n < b.N; {
		s := r.rng.IntN(len(r.ids))
		for k := 0; k < run && n < b.N; k, n = k+1, n+1 {
			seq := r.hwm[s] + 1
			d, err := tx.Check(r.ids[s], seq, r.base)
			if err != nil || d != session.Apply {
				b.Fatalf("check: %v %v", d, err)
			}
			if err := tx.Advance(r.ids[s], seq, r.base); err != nil {
				b.Fatal(err)
			}
			if flushEach {
				if err := tx.Flush(); err != nil {
					b.Fatal(err)
				}
			}
			r.hwm[s] = seq
			inBatch++
		}
		if inBatch >= batchSize {
			commit()
		}
	}
	commit()
	b.StopTimer()
	b.ReportMetric(float64(cpuNanos()-cpu0)/float64(b.N), "cpu-ns/op")
	batch.Close()
}

// BenchmarkTracker measures Check+Advance per event, including the amortized
// Flush, Pebble commit (NoSync) and Commit of 1000-event batches.
//
//	warm: 100K sessions, cache 1M, cache filled before timing.
//	cold: 100K sessions, cache 1K: nearly every first touch of a session in a
//	      batch is a Pebble point read.
//	run=N: N consecutive events of one session; flush=each writes one HWM Set
//	      per event (the write-through alternative to one Set per session).
//	commit=no: the Pebble commit is skipped (Tracker CPU only).
func BenchmarkTracker(b *testing.B) {
	const sessions, batchSize = 100_000, 1000
	for _, c := range []struct {
		name  string
		cache int
	}{{"warm", 1 << 20}, {"cold", 1000}} {
		for _, v := range []struct {
			run       int
			flushEach bool
			commit    bool
		}{{1, false, true}, {8, false, true}, {8, true, true}, {1, false, false}, {8, false, false}} {
			if !v.commit && c.name == "cold" {
				continue // publishing without persisting is only coherent while nothing is evicted
			}
			mode, commit := "batch", "yes"
			if v.flushEach {
				mode = "each"
			}
			if !v.commit {
				commit = "no"
			}
			b.Run(fmt.Sprintf("%s/run=%d/flush=%s/commit=%s", c.name, v.run, mode, commit), func(b *testing.B) {
				r := newTrackerRig(b, sessions, c.cache)
				if c.name == "warm" {
					r.warm(b)
				}
				r.run(b, batchSize, v.run, v.flushEach, v.commit)
			})
		}
	}
}

// warm loads every session into the cache through txs of 1000 checks (Get
// does not fill it; a tx keeps what it read from Pebble, and the tracker
// keeps the last tx's buffers, so one tx for all would hold a second copy).
func (r *trackerRig) warm(b *testing.B) {
	batch := r.db.NewBatch()
	defer batch.Close()
	var tx *session.TrackerTx
	for i, id := range r.ids {
		if i%1000 == 0 {
			if tx != nil {
				tx.Abort()
			}
			tx = r.tr.Begin(batch)
		}
		if _, err := tx.Check(id, r.hwm[i]+1, r.base); err != nil {
			b.Fatal(err)
		}
	}
	tx.Abort()
}

// BenchmarkTrackerCheckDuplicate measures the redelivery path: Check of an
// already applied event of a random session, one tx per 1000 checks
// (aborted). warm: 100K sessions, cache 1M, filled; cold: cache 1K.
// prefetch=yes calls Prefetch for the tx's 1000 sessions before checking
// them, as a receiver can for a batch; prefetch=peekall peeks them
// together (PeekAll) and decides each (Decide), as the receiver does.
func BenchmarkTrackerCheckDuplicate(b *testing.B) {
	const perTx = 1000
	for _, c := range []struct {
		name  string
		cache int
	}{{"warm", 1 << 20}, {"cold", 1000}} {
		for _, prefetch := range []string{"no", "yes", "peekall"} {
			b.Run(fmt.Sprintf("%s/prefetch=%s", c.name, prefetch), func(b *testing.B) {
				r := newTrackerRig(b, 100_000, c.cache)
				if c.name == "warm" {
					r.warm(b)
				}
				batch := r.db.NewBatch()
				defer batch.Close()
				picks := make([]int, perTx)
				ids := make([]session.ID, perTx)
				hwms := make([]session.HWM, perTx)
				cutoff := session.Cutoff(r.tr.Clock(), r.tr.Options().RetentionHorizon)
				b.ReportAllocs()
				b.ResetTimer()
				cpu0 := cpuNanos()
				for n := 0; n < b.N; n += perTx {
					for i := range picks {
						picks[i] = r.rng.IntN(len(r.ids))
					}
					picks := picks[:min(perTx, b.N-n)]
					tx := r.tr.Begin(batch)
					switch prefetch {
					case "yes":
						for _, s := range picks {
							tx.Prefetch(r.ids[s])
						}
					case "peekall":
						for i, s := range picks {
							ids[i] = r.ids[s]
						}
						if err := tx.PeekAll(ids[:len(picks)], hwms); err != nil {
							b.Fatal(err)
						}
						for i := range picks {
							if d := session.Decide(hwms[i], 1, r.base, cutoff); d != session.Duplicate {
								b.Fatalf("decide: %v", d)
							}
						}
						tx.Abort()
						continue
					}
					for _, s := range picks {
						d, err := tx.Check(r.ids[s], 1, r.base)
						if err != nil || d != session.Duplicate {
							b.Fatalf("check: %v %v", d, err)
						}
					}
					tx.Abort()
				}
				b.StopTimer()
				b.ReportMetric(float64(cpuNanos()-cpu0)/float64(b.N), "cpu-ns/op")
			})
		}
	}
}

// BenchmarkTrackerCacheMemory reports the live heap the Tracker's HWM cache
// holds per cached session: 100K sessions in the default 1M cache, filled by
// a warm pass (B/session-fresh), then a cache of 100K churned by 1M lookups
// over 200K sessions, every other one a miss that fills and evicts
// (B/session-churned). The HWM log is off, so the sessions are cached as
// clean entries (a logged one costs the same entry). The whole-process heap
// is measured, so nothing else may run concurrently; one iteration is the
// experiment: -benchtime=1x.
func BenchmarkTrackerCacheMemory(b *testing.B) {
	var fresh, churned float64
	for range b.N {
		r := newTrackerRigOpts(b, 100_000, session.TrackerOptions{CacheSize: 1 << 20, LogBatches: -1})
		before := liveHeap()
		r.warm(b)
		fresh = float64(liveHeap()-before) / float64(r.tr.CachedLen())

		r = newTrackerRigOpts(b, 200_000, session.TrackerOptions{CacheSize: 100_000, LogBatches: -1})
		before = liveHeap()
		batch := r.db.NewBatch()
		for n := 0; n < 1_000_000; n += 1000 {
			tx := r.tr.Begin(batch)
			for range 1000 {
				s := r.rng.IntN(len(r.ids))
				if _, err := tx.Check(r.ids[s], r.hwm[s], r.base); err != nil {
					b.Fatal(err)
				}
			}
			tx.Abort()
		}
		batch.Close()
		churned = float64(liveHeap()-before) / float64(r.tr.CachedLen())
	}
	b.ReportMetric(fresh, "B/session-fresh")
	b.ReportMetric(churned, "B/session-churned")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkTrackerWrites measures what the HWM log saves Pebble: 1000-event
// batches of fresh events of 100K uniform sessions (the receiver's hard
// case), each event also writing its 24 B/100 B state row, committed
// without sync, with the log off (log=rows: one HWM row per session per
// batch) and at several LogBatches. Besides CPU it reports figures that do
// not move with the machine's load: bytes written to the WAL and to
// sstables (flushes + compactions) per event, and the Pebble keys the
// tracker wrote per event (rows, deltas, checkpoints, deletions). Run long
// enough for steady state: -benchtime 3000x.
func BenchmarkTrackerWrites(b *testing.B) {
	for _, lb := range []int{-1, 16, 64, 128, 256} {
		name := fmt.Sprintf("log=%d", lb)
		if lb < 0 {
			name = "log=rows"
		}
		b.Run(name, func(b *testing.B) {
			r := newTrackerRigOpts(b, 100_000, session.TrackerOptions{LogBatches: lb})
			batch := r.db.NewBatch()
			defer batch.Close()
			key := make([]byte, RowKeyLen)
			val := make([]byte, RowValueLen)
			writes := diskWrites(r.db)
			var trackerKeys uint64
			b.ResetTimer()
			cpu0 := cpuNanos()
			for range b.N {
				tx := r.tr.Begin(batch)
				for range BatchEvents {
					s := r.rng.IntN(len(r.ids))
					seq := r.hwm[s] + 1
					if err := tx.Advance(r.ids[s], seq, r.base); err != nil {
						b.Fatal(err)
					}
					r.hwm[s] = seq
					copy(key, session.StatePrefix)
					copy(key[len(session.StatePrefix):], r.ids[s][:])
					if err := batch.Set(key, val, nil); err != nil {
						b.Fatal(err)
					}
				}
				before := batch.Count()
				if err := tx.Flush(); err != nil {
					b.Fatal(err)
				}
				trackerKeys += uint64(batch.Count() - before)
				if err := batch.Commit(pebble.NoSync); err != nil {
					b.Fatal(err)
				}
				tx.Commit()
				batch.Reset()
			}
			b.StopTimer()
			events := float64(b.N) * BatchEvents
			b.ReportMetric(float64(cpuNanos()-cpu0)/events, "cpu-ns/event")
			writes(b, events)
			b.ReportMetric(float64(trackerKeys)/events, "hwm-keys/event")
		})
	}
}

// BenchmarkTrackerOpen measures OpenTracker on a store whose HWM log is in
// steady state — 100K uniform sessions after 2×LogBatches batches of 1000
// fresh events (flushed to sstables, as after a restart) — i.e. the replay
// of the log at open; log=rows is the same store written without the log
// (open reads only the clock). sessions/op is how many logged sessions the
// replay pins in the cache.
func BenchmarkTrackerOpen(b *testing.B) {
	for _, lb := range []int{-1, 64, 128, 256} {
		name := fmt.Sprintf("log=%d", lb)
		if lb < 0 {
			name = "log=rows"
		}
		b.Run(name, func(b *testing.B) {
			opts := session.TrackerOptions{LogBatches: lb}
			r := newTrackerRigOpts(b, 100_000, opts)
			batch := r.db.NewBatch()
			for range 2 * max(lb, 128) {
				tx := r.tr.Begin(batch)
				for range BatchEvents {
					s := r.rng.IntN(len(r.ids))
					r.hwm[s]++
					if err := tx.Advance(r.ids[s], r.hwm[s], r.base); err != nil {
						b.Fatal(err)
					}
				}
				if err := tx.Flush(); err != nil {
					b.Fatal(err)
				}
				if err := batch.Commit(pebble.NoSync); err != nil {
					b.Fatal(err)
				}
				tx.Commit()
				batch.Reset()
			}
			batch.Close()
			if err := r.db.Flush(); err != nil {
				b.Fatal(err)
			}
			var pinned int
			b.ResetTimer()
			for range b.N {
				tr, err := session.OpenTracker(r.db, &opts)
				if err != nil {
					b.Fatal(err)
				}
				pinned = tr.CachedLen()
			}
			b.ReportMetric(float64(pinned), "sessions/op")
		})
	}
}
