package bench

import (
	"os"
	"testing"
	"time"

	"github.com/oncewal/oncewal/internal/drill"
	"github.com/oncewal/oncewal/internal/rawdb"
	"github.com/oncewal/oncewal/store"

	"github.com/oncewal/oncewal/follower"
	"github.com/oncewal/oncewal/session"
)

// Reopen measures what the HWM log costs at open (issue 13, point 4): a
// follower store is filled with the Fresh workload (100,000 sessions, every
// one preloaded, then reopenBatches 1000-event batches, so the log holds its
// full LogBatches deltas of ~1000 sessions each — the largest replay the
// defaults allow), closed, and then opened again b.N times. Each op is one
// follower.Open + Close (Pebble's open included); replay-ms is the part
// spent in session.OpenTracker (the HWM log replay), measured by opening
// a second Tracker on the opened store; replayed-sessions is how many
// sessions the replay pinned. logBatches -1 is the design without the log
// (one HWM row per changed session), the reference.
func Reopen(logBatches int) func(*testing.B) { return reopen(logBatches, false) }

// ReopenKilled is Reopen of a follower that was killed instead of closed
// (drill.Kill: no flush), so that every open also replays Pebble's WAL
// — up to a memtable's worth (store.Options.MemTableSize) — into a
// memtable and flushes it. Each op opens a copy of the killed store, made
// with the timer stopped.
func ReopenKilled() func(*testing.B) { return reopen(0, true) }

func reopen(logBatches int, kill bool) func(*testing.B) {
	return func(b *testing.B) {
		Release()
		dir, err := os.MkdirTemp("", "oncewal-bench-reopen-")
		if err != nil {
			b.Fatal(err)
		}
		defer os.RemoveAll(dir)
		defer os.RemoveAll(dir + "-copy")
		opts := &follower.Options{Store: store.Options{HWMLogBatches: logBatches, Logger: quietSlog()}}
		f, err := follower.Open(dir, opts)
		if err != nil {
			b.Fatal(err)
		}
		g := newGenerator(Fresh)
		var buf []byte
		for from := 0; from < len(g.ids); {
			from = g.preloadEvents(from)
			buf = g.encode(buf)
			if _, err := f.Apply(buf); err != nil {
				b.Fatal(err)
			}
		}
		for range reopenBatches {
			g.fill(0)
			buf = g.encode(buf)
			if _, err := f.Apply(buf); err != nil {
				b.Fatal(err)
			}
		}
		stop := f.Close
		if kill {
			stop = func() error { return drill.Kill(f) }
		}
		if err := stop(); err != nil {
			b.Fatal(err)
		}
		open := dir
		b.ResetTimer()
		var replay time.Duration
		pinned := 0
		for range b.N {
			if kill {
				b.StopTimer()
				open = dir + "-copy"
				if err := os.RemoveAll(open); err != nil {
					b.Fatal(err)
				}
				if err := os.CopyFS(open, os.DirFS(dir)); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
			f, err := follower.Open(open, opts)
			if err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			t0 := time.Now()
			tr, err := session.OpenTracker(rawdb.Of(f), &session.TrackerOptions{LogBatches: logBatches})
			if err != nil {
				b.Fatal(err)
			}
			replay += time.Since(t0)
			pinned = tr.CachedLen()
			b.StartTimer()
			if err := f.Close(); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "open-ms")
		b.ReportMetric(float64(replay.Microseconds())/1000/float64(b.N), "replay-ms")
		b.ReportMetric(float64(pinned), "replayed-sessions")
	}
}

// reopenBatches is how many batches Reopen applies after the preload: more
// than the default LogBatches, so the log is as long as it gets.
const reopenBatches = session.DefaultLogBatches + 72
