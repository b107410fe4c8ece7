package follower_test

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncewal/oncewal/store"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/oncewal/oncewal/testutil"
)

// BenchmarkStoreLayout is the measurement behind the node's store layout (see
// doc.go, "Store layout"): raw Pebble ingest of synced 1000-key batches from N
// goroutines (one per shard) into one shared store (keys prefixed by shard)
// versus one store per shard, on disk. It has no oncewal code in it, so it
// measures only what the layout itself costs or saves.
//
//	go test ./follower -run '^$' -bench StoreLayout -benchtime 400x -count 3
func BenchmarkStoreLayout(b *testing.B) {
	for _, layout := range []string{"shared", "per-shard"} {
		for _, n := range []int{1, 2, 4, 8} {
			b.Run(fmt.Sprintf("layout=%s/shards=%d", layout, n), func(b *testing.B) {
				benchLayout(b, layout == "shared", n)
			})
		}
	}
}

func benchLayout(b *testing.B, shared bool, shards int) {
	const batchKeys = 1000
	dir := b.TempDir()
	open := func(name string) *pebble.DB {
		o := testutil.DBOptions(vfs.Default)
		o.Logger = store.FatalLogger{}
		return testutil.OpenDBWith(b, filepath.Join(dir, name), o)
	}
	dbs := make([]*pebble.DB, shards)
	if shared {
		db := open("shared")
		for i := range dbs {
			dbs[i] = db
		}
	} else {
		for i := range dbs {
			dbs[i] = open(fmt.Sprintf("shard-%04d", i))
		}
	}
	defer func() {
		seen := map[*pebble.DB]bool{}
		for _, db := range dbs {
			if !seen[db] {
				seen[db] = true
				_ = db.Close()
			}
		}
	}()

	// Rows shaped like session state rows: s/<shard:4><session:16><key:8>,
	// a 24-byte value.
	value := make([]byte, 24)
	var next atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for s := range shards {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := make([]byte, 2+4+16+8)
			copy(key, "s/")
			binary.BigEndian.PutUint32(key[2:], uint32(s))
			var row uint64
			for next.Add(1) <= int64(b.N) {
				batch := dbs[s].NewBatch()
				for range batchKeys {
					row++
					binary.BigEndian.PutUint64(key[6:], row*0x9E3779B97F4A7C15) // spread over the key space
					binary.BigEndian.PutUint64(key[14:], row)
					binary.BigEndian.PutUint64(key[22:], row%7)
					_ = batch.Set(key, value, nil)
				}
				if err := batch.Commit(pebble.Sync); err != nil {
					b.Error(err)
					return
				}
				_ = batch.Close()
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(b.N*batchKeys)/elapsed.Seconds(), "keys/s")
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "batches/s")
}

// BenchmarkFsync is the device ceiling under the layouts above: N
// goroutines each append 64 KiB (about one synced 1000-event batch in
// Pebble's WAL) to a file of its own and fsync it. One op is one
// write+fsync; syncs/s is the total.
//
//	go test ./follower -run '^$' -bench Fsync -benchtime 300x
func BenchmarkFsync(b *testing.B) {
	for _, n := range []int{1, 2, 4, 8} {
		b.Run(fmt.Sprintf("files=%d", n), func(b *testing.B) {
			dir := b.TempDir()
			buf := make([]byte, 64<<10)
			var next atomic.Int64
			var wg sync.WaitGroup
			b.ResetTimer()
			start := time.Now()
			for i := range n {
				f, err := os.Create(filepath.Join(dir, fmt.Sprintf("f%d", i)))
				if err != nil {
					b.Fatal(err)
				}
				wg.Go(func() {
					defer f.Close()
					for next.Add(1) <= int64(b.N) {
						if _, err := f.Write(buf); err != nil {
							b.Error(err)
							return
						}
						if err := f.Sync(); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "syncs/s")
		})
	}
}
