package bench

// EXPERIMENT, not a window implementation: why an exact window does not
// scale on this machine. A benchmark only, so it never runs in the default
// `go test`.
//
// An exact, linearizable LRU window orders every recency update (every
// CheckAndRecord, duplicate or new) in one total order that respects real
// time: a duplicate hit on A that completes before a hit on B starts must
// leave A older than B, or a later run of evictions tells them apart. With
// shared memory as the only clock, each operation therefore writes (or
// reads after the other core wrote) at least one line shared by all cores —
// a global touch stamp, a lock, the MRU end of a list. Whatever is sharded,
// that line moves between the cores on every operation while both run.
// This benchmark prices that transfer against an operation of the window's
// own size:
//
//   - work: ~100 ns of arithmetic per call, nothing shared (the control).
//   - work+stamp: the same plus one atomic add on one shared line: the
//     least coordination any exact design needs (a real design needs more:
//     eviction, helping, the live count).
//   - store: idempotency.Store (one mutex).
//
// Run: go test ./bench -run '^$' -bench WindowShardedCeiling -benchtime=1x -count 5

import (
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncewal/oncewal/idempotency"
)

// hotLine stands for the global order of an exact design.
var hotLine struct {
	_     [64]byte
	stamp atomic.Uint64
	_     [56]byte
}

// workWindow does ~100 ns of arithmetic per call; with stamp it also adds
// to hotLine.
type workWindow struct{ stamp bool }

func (w workWindow) CheckAndRecord(k idempotency.Key) bool {
	x := uint64(k[0]) | uint64(k[9])<<8
	for range 40 {
		x = x*0x9e3779b97f4a7c15 + 1
		x ^= x >> 29
	}
	if w.stamp {
		hotLine.stamp.Add(x & 1)
	}
	return x == 42
}

// progress is goroutine 2's operation count, on its own line.
type progress struct {
	_ [64]byte
	n atomic.Uint64
	_ [56]byte
}

// overlapWindows runs w on two goroutines. Goroutine 1 times windows of per
// operations; a window counts as "both" if goroutine 2 did about as many
// operations meanwhile (between 3/4 and 4/3 as many: both were on CPU the
// whole time; many more means goroutine 1 was descheduled), as "alone" if
// goroutine 2 did none. The machine is shared with other jobs and has no
// idle CPU most of the time, so whole-run 2g/1g wall-clock ratios mostly
// measure the scheduler; classifying short windows measures the code: the
// median "both" ns/op is what one goroutine pays per operation while the
// other runs, and 2·alone/both is the scaling two idle cores would give.
// (For a mutex, "both" also includes parking: sync.Mutex does not spin
// when no P is idle, so on a saturated machine contention means a futex
// sleep and a delayed wakeup; that is real, but not the hot-line cost.)
func overlapWindows(w window, kind string, base *atomic.Uint64, windows, per int) (alone, both []float64) {
	op := func(i uint64) {
		if kind == "new" {
			w.CheckAndRecord(benchKey(i))
		} else {
			w.CheckAndRecord(benchKey((i * 7919) % benchCap))
		}
	}
	var stop atomic.Bool
	var p progress
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		i := base.Add(1 << 36)
		for !stop.Load() {
			for range 32 {
				i++
				op(i)
			}
			p.n.Add(32)
		}
	}()
	i := base.Add(1 << 36)
	for range windows {
		n0 := p.n.Load()
		t0 := time.Now()
		for range per {
			i++
			op(i)
		}
		d := float64(time.Since(t0)) / float64(per)
		switch n := p.n.Load() - n0; {
		case n >= uint64(per)*3/4 && n <= uint64(per)*4/3:
			both = append(both, d)
		case n == 0:
			alone = append(alone, d)
		}
	}
	stop.Store(true)
	wg.Wait()
	return alone, both
}

func median(s []float64) float64 {
	if len(s) == 0 {
		return 0
	}
	slices.Sort(s)
	return s[len(s)/2]
}

// BenchmarkWindowShardedCeiling reports, per case: median ns/op while the
// other goroutine is descheduled ("-alone") and while it runs the same
// workload ("-both"), their projected 2-core scaling 2·alone/both ("-x"),
// and how many windows of each kind it saw ("-nboth"; the estimate is only
// as good as that count).
func BenchmarkWindowShardedCeiling(b *testing.B) {
	if runtime.GOMAXPROCS(0) < 2 {
		b.Skip("needs GOMAXPROCS >= 2")
	}
	cases := []struct {
		name string
		make func(int) window
	}{
		{"work", func(int) window { return workWindow{} }},
		{"work+stamp", func(int) window { return workWindow{stamp: true} }},
		{"store", func(c int) window { return idempotency.NewStore(c) }},
	}
	for _, kind := range []string{"new", "dup"} {
		b.Run(kind, func(b *testing.B) {
			n := len(cases)
			alone, both := make([][]float64, n), make([][]float64, n)
			for range b.N {
				var base atomic.Uint64
				base.Store(1 << 40)
				ws := make([]window, n)
				for i, c := range cases {
					ws[i] = filled(c.make)
				}
				// Alternate cases in rounds so each sees the same machine
				// weather.
				for range 4 {
					for i, w := range ws {
						a, bo := overlapWindows(w, kind, &base, 500, 256)
						alone[i] = append(alone[i], a...)
						both[i] = append(both[i], bo...)
					}
				}
			}
			for i, c := range cases {
				a, bo := median(alone[i]), median(both[i])
				b.ReportMetric(a, c.name+"-alone")
				b.ReportMetric(bo, c.name+"-both")
				if bo > 0 {
					b.ReportMetric(2*a/bo, c.name+"-x")
				}
				b.ReportMetric(float64(len(both[i])), c.name+"-nboth")
			}
			b.ReportMetric(0, "ns/op")
		})
	}
}
