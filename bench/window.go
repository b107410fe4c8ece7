package bench

import (
	"encoding/binary"
	"fmt"
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

// Window implementations by name: "oncewal" (idempotency.Store) and the
// "golang-lru" reference.
var impls = []struct {
	name string
	make func(int) window
}{
	{"oncewal", func(c int) window { return idempotency.NewStore(c) }},
	{"golang-lru", func(c int) window { return newLRU(c) }},
}

func implNamed(name string) func(int) window {
	for _, im := range impls {
		if im.name == name {
			return im.make
		}
	}
	panic(fmt.Sprintf("bench: unknown window implementation %q", name))
}

func filled(mk func(int) window) window {
	w := mk(benchCap)
	for i := range uint64(benchCap) {
		w.CheckAndRecord(benchKey(i))
	}
	return w
}

var gid atomic.Uint64

// WindowCheck measures CheckAndRecord on a full 100K window of impl
// ("oncewal" or "golang-lru"). kind:
//   - "dup": a duplicate of a random resident key (refreshes recency, so the
//     resident set never changes).
//   - "new": a never-seen key, which evicts the least recently seen.
//   - "parallel-dup", "parallel-new": the same under b.RunParallel; run with
//     -cpu 1,2 and divide to get the scaling.
func WindowCheck(impl, kind string) func(b *testing.B) {
	mk := implNamed(impl)
	return func(b *testing.B) {
		Release() // a kept end-to-end store would compact in the background
		w := filled(mk)
		b.ReportAllocs()
		b.ResetTimer()
		switch kind {
		case "dup":
			for i := uint64(0); i < uint64(b.N); i++ {
				if w.CheckAndRecord(benchKey((i * 7919) % benchCap)) {
					b.Fatal("dup reported new")
				}
			}
		case "new":
			for i := uint64(benchCap); i < uint64(benchCap+b.N); i++ {
				if !w.CheckAndRecord(benchKey(i)) {
					b.Fatal("new reported dup")
				}
			}
		case "parallel-dup":
			b.RunParallel(func(pb *testing.PB) {
				i := gid.Add(1) * 1_000_003
				for pb.Next() {
					i++
					w.CheckAndRecord(benchKey((i * 7919) % benchCap))
				}
			})
		case "parallel-new":
			b.RunParallel(func(pb *testing.PB) {
				i := gid.Add(1) << 40
				for pb.Next() {
					i++
					w.CheckAndRecord(benchKey(i))
				}
			})
		default:
			b.Fatalf("bench: unknown window check kind %q", kind)
		}
	}
}

func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// WindowMemory reports the live heap per entry of a full 100K window of
// impl, freshly filled (B/entry-fresh) and after churn more inserts
// (B/entry-churned). One iteration is the whole experiment: run it with
// -benchtime=1x. It measures the whole process heap, so nothing else may
// run concurrently.
func WindowMemory(impl string, churn uint64) func(b *testing.B) {
	mk := implNamed(impl)
	return func(b *testing.B) {
		Release()
		var fresh, churned float64
		for range b.N {
			before := liveHeap()
			w := filled(mk)
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
	}
}
