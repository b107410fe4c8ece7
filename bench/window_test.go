package bench

import (
	"encoding/binary"
	"fmt"
	"os"
	"runtime"
	"sync/atomic"
	"testing"

	lru "github.com/hashicorp/golang-lru/v2"

	"github.com/oncewal/oncewal/idempotency"
)

// window is the operation under test, so the oncewal store and the
// golang-lru reference run the same benchmark bodies.
type window interface {
	CheckAndRecord(idempotency.Key) bool
}

// lruWindow is the reference: golang-lru with Get (refreshes recency on a
// duplicate) then Add. Contains-then-Add is racy across goroutines, so the
// parallel numbers of this reference are for throughput only.
type lruWindow struct {
	c *lru.Cache[idempotency.Key, struct{}]
}

func (w lruWindow) CheckAndRecord(k idempotency.Key) bool {
	if _, ok := w.c.Get(k); ok {
		return false
	}
	w.c.Add(k, struct{}{})
	return true
}

func newLRU(capacity int) lruWindow {
	c, err := lru.New[idempotency.Key, struct{}](capacity)
	if err != nil {
		panic(err)
	}
	return lruWindow{c}
}

// benchKey makes distinct, well-spread keys cheaply (a bijection of n), so
// key generation stays out of the measurement.
func benchKey(n uint64) idempotency.Key {
	var k idempotency.Key
	binary.LittleEndian.PutUint64(k[:], n*0x9e3779b97f4a7c15)
	binary.LittleEndian.PutUint64(k[8:], n^0xdeadbeefcafef00d)
	return k
}

const benchCap = idempotency.DefaultCapacity

var impls = []struct {
	name string
	make func(int) window
}{
	{"oncewal", func(c int) window { return idempotency.NewStore(c) }},
	{"golang-lru", func(c int) window { return newLRU(c) }},
}

func filled(mk func(int) window) window {
	w := mk(benchCap)
	for i := range uint64(benchCap) {
		w.CheckAndRecord(benchKey(i))
	}
	return w
}

var gid atomic.Uint64

// BenchmarkWindow: a full 100K window.
//   - dup: a duplicate of a random resident key (refreshes recency, so the
//     resident set never changes).
//   - new: a never-seen key, which evicts the least recently seen.
//   - parallel-*: the same under b.RunParallel; run with -cpu 1,2 and divide
//     to get the scaling.
func BenchmarkWindow(b *testing.B) {
	for _, im := range impls {
		b.Run(im.name+"/dup", func(b *testing.B) {
			w := filled(im.make)
			b.ReportAllocs()
			b.ResetTimer()
			for i := uint64(0); i < uint64(b.N); i++ {
				if w.CheckAndRecord(benchKey((i * 7919) % benchCap)) {
					b.Fatal("dup reported new")
				}
			}
		})
		b.Run(im.name+"/new", func(b *testing.B) {
			w := filled(im.make)
			b.ReportAllocs()
			b.ResetTimer()
			for i := uint64(benchCap); i < uint64(benchCap+b.N); i++ {
				if !w.CheckAndRecord(benchKey(i)) {
					b.Fatal("new reported dup")
				}
			}
		})
		b.Run(im.name+"/parallel-dup", func(b *testing.B) {
			w := filled(im.make)
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				i := gid.Add(1) * 1_000_003
				for pb.Next() {
					i++
					w.CheckAndRecord(benchKey((i * 7919) % benchCap))
				}
			})
		})
		b.Run(im.name+"/parallel-new", func(b *testing.B) {
			w := filled(im.make)
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				i := gid.Add(1) << 40
				for pb.Next() {
					i++
					w.CheckAndRecord(benchKey(i))
				}
			})
		})
	}
}

func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// BenchmarkWindowMemory reports live heap per entry of a full 100K window,
// freshly filled and after churn (10M inserts; ONCEWAL_CHURN overrides).
// One iteration is the whole experiment: run with -benchtime=1x.
func BenchmarkWindowMemory(b *testing.B) {
	churn := uint64(10_000_000)
	if v := os.Getenv("ONCEWAL_CHURN"); v != "" {
		fmt.Sscan(v, &churn)
	}
	for _, im := range impls {
		b.Run(im.name, func(b *testing.B) {
			var fresh, churned float64
			for range b.N {
				before := liveHeap()
				w := filled(im.make)
				fresh = float64(liveHeap()-before) / benchCap
				for i := uint64(benchCap); i < benchCap+churn; i++ {
					w.CheckAndRecord(benchKey(i))
				}
				churned = float64(liveHeap()-before) / benchCap
				runtime.KeepAlive(w)
			}
			b.ReportMetric(fresh, "B/entry-fresh")
			b.ReportMetric(churned, "B/entry-churned")
			b.ReportMetric(0, "ns/op")
		})
	}
}
