package bench

import (
	"encoding/binary"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/oncewal/oncewal/store"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/oncewal/oncewal/leader"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/wal"
)

// concurrentBatch is the batch size of LeaderConcurrent: client-sized
// batches, where the fsync, not the events, is the cost.
const concurrentBatch = 100

// LeaderConcurrent measures n goroutines appending 100-event batches of puts
// (24-byte keys, 100-byte values, sessions drawn from 10,000 shared by all
// of them) to one shard of a leader on disk (WAL synced per batch, its own
// store applied, no followers): events/s, the process CPU per event, and
// the file syncs per batch (the WAL's, the store's and the directories'
// together), which group commit brings below one as n grows.
func LeaderConcurrent(n int) func(*testing.B) { return LeaderConcurrentBatches(n, concurrentBatch) }

// LeaderConcurrentBatches is LeaderConcurrent with batches of batch
// events: at BatchEvents, the size of the batches a follower's fresh row
// applies, it tells the leader's cost per event from its cost per batch
// (a WAL fsync and a store commit).
func LeaderConcurrentBatches(n, batch int) func(*testing.B) {
	return func(b *testing.B) {
		Release()
		dir, err := os.MkdirTemp("", "oncewal-bench-concurrent-")
		if err != nil {
			b.Fatal(err)
		}
		defer os.RemoveAll(dir)
		fs := &syncCountingFS{FS: vfs.Default}
		l, err := leader.Open(dir, &leader.Options{Shards: 1, FS: fs, Logger: quietSlog(),
			Store: store.Options{Logger: quietSlog()}})
		if err != nil {
			b.Fatal(err)
		}
		defer l.Close()
		sh, err := l.Shard(0)
		if err != nil {
			b.Fatal(err)
		}
		ids := randomIDs(rand.New(rand.NewPCG(1, 2)), leaderSessions)
		val := make([]byte, 100)
		var left atomic.Int64
		left.Store(int64(b.N))
		var wg sync.WaitGroup
		var failed atomic.Value
		syncs0, cpu0 := fs.syncs.Load(), cpuNanos()
		b.ResetTimer()
		for g := range n {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(g), 3))
				evs := make([]wal.Event, batch)
				for left.Add(-1) >= 0 {
					fillPuts(evs, rng, ids, val)
					if _, err := sh.Append(evs...); err != nil {
						failed.Store(err)
						return
					}
				}
			})
		}
		wg.Wait()
		b.StopTimer()
		if err, _ := failed.Load().(error); err != nil {
			b.Fatal(err)
		}
		events := float64(b.N * batch)
		b.ReportMetric(events/b.Elapsed().Seconds(), "events/s")
		b.ReportMetric(float64(cpuNanos()-cpu0)/events, "cpu-ns/event")
		b.ReportMetric(float64(fs.syncs.Load()-syncs0)/float64(b.N), "fsyncs/batch")
	}
}

// fillPuts fills evs with LeaderConcurrent's puts: a random 24-byte key,
// val, a session drawn from ids; Seq 0 (the leader stamps it).
func fillPuts(evs []wal.Event, rng *rand.Rand, ids []session.ID, val []byte) {
	for i := range evs {
		var key [24]byte
		binary.LittleEndian.PutUint64(key[:], rng.Uint64())
		evs[i] = wal.Event{Op: wal.OpPut, Session: ids[rng.IntN(len(ids))], Key: key[:], Value: val}
	}
}

// LeaderWALBatches is the floor under LeaderConcurrentBatches(1, batch):
// the same events generated the same way, encoded and written to a WAL
// synced per batch, and nothing else (no stamping, ledger or store). Its
// CPU per event is what the WAL's fsync and write cost at that batch size
// — per batch, so ten times as much per event at 100 as at 1000.
func LeaderWALBatches(batch int) func(*testing.B) {
	return func(b *testing.B) {
		Release()
		w := openBenchWAL(b)
		ids := randomIDs(rand.New(rand.NewPCG(1, 2)), leaderSessions)
		rng := rand.New(rand.NewPCG(0, 3))
		val := make([]byte, 100)
		evs := make([]wal.Event, batch)
		cpu0 := cpuNanos()
		b.ResetTimer()
		for range b.N {
			fillPuts(evs, rng, ids, val)
			for i := range evs {
				evs[i].Seq = 1 // the WAL takes stamped events
			}
			if _, err := w.Append(1, evs); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		events := float64(b.N * batch)
		b.ReportMetric(events/b.Elapsed().Seconds(), "events/s")
		b.ReportMetric(float64(cpuNanos()-cpu0)/events, "cpu-ns/event")
	}
}

// syncCountingFS counts Sync and SyncData calls on the files it opens for
// writing.
type syncCountingFS struct {
	vfs.FS
	syncs atomic.Int64
}

func (fs *syncCountingFS) Create(name string, c vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := fs.FS.Create(name, c)
	return fs.wrap(f, err)
}

func (fs *syncCountingFS) OpenReadWrite(name string, c vfs.DiskWriteCategory, opts ...vfs.OpenOption) (vfs.File, error) {
	f, err := fs.FS.OpenReadWrite(name, c, opts...)
	return fs.wrap(f, err)
}

func (fs *syncCountingFS) ReuseForWrite(old, new string, c vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := fs.FS.ReuseForWrite(old, new, c)
	return fs.wrap(f, err)
}

func (fs *syncCountingFS) OpenDir(name string) (vfs.File, error) {
	f, err := fs.FS.OpenDir(name)
	return fs.wrap(f, err)
}

func (fs *syncCountingFS) wrap(f vfs.File, err error) (vfs.File, error) {
	if err != nil {
		return nil, err
	}
	return &syncCountingFile{File: f, n: &fs.syncs}, nil
}

type syncCountingFile struct {
	vfs.File
	n *atomic.Int64
}

func (f *syncCountingFile) Sync() error     { f.n.Add(1); return f.File.Sync() }
func (f *syncCountingFile) SyncData() error { f.n.Add(1); return f.File.SyncData() }
