package follower_test

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// BenchmarkSyncOverlap is the ceiling of a synced apply loop without Pebble:
// N goroutines each repeat "burn cpu=C µs of CPU, write 128 KiB into a file
// of its own, fdatasync it" (C ≈ the apply CPU of a 1000-event batch, 128
// KiB ≈ its WAL bytes). With 2 cores, and syncs of separate files that
// overlap each other and the other goroutines' CPU, N >= 2 is CPU-bound:
// ~2/C ops/s and cpu-ms/s near 2000. write=overwrite rewrites a
// preallocated file in place (as Pebble does with a recycled WAL: no size
// change, so fdatasync need not commit the ext4 journal); append grows it.
// bulk=yes adds what a Pebble store does beside its WAL: one goroutine
// streams 4 MiB files (256 KiB writes, fsync, like a memtable flush or a
// compaction output) and deletes the file before last (obsolete tables).
//
//	go test ./follower -run '^$' -bench SyncOverlap -benchtime 400x
func BenchmarkSyncOverlap(b *testing.B) {
	for _, write := range []string{"overwrite", "append"} {
		for _, bulk := range []bool{false, true} {
			for _, cpu := range []time.Duration{0, 1000 * time.Microsecond} {
				for _, n := range []int{1, 2, 4, 8} {
					b.Run(fmt.Sprintf("write=%s/bulk=%s/cpu=%dus/files=%d", write, yesNo(bulk), cpu.Microseconds(), n), func(b *testing.B) {
						benchSyncOverlap(b, n, cpu, write == "append", bulk)
					})
				}
			}
		}
	}
}

func yesNo(v bool) string {
	if v {
		return "yes"
	}
	return "no"
}

// bulkWriter streams 4 MiB files into dir until stop closes, keeping two.
func bulkWriter(b *testing.B, dir string, stop <-chan struct{}) {
	buf := make([]byte, 256<<10)
	for i := 0; ; i++ {
		select {
		case <-stop:
			return
		default:
		}
		name := filepath.Join(dir, fmt.Sprintf("bulk%d", i))
		f, err := os.Create(name)
		if err != nil {
			b.Error(err)
			return
		}
		for range 16 {
			if _, err := f.Write(buf); err != nil {
				b.Error(err)
			}
		}
		if err := f.Sync(); err != nil {
			b.Error(err)
		}
		_ = f.Close()
		_ = os.Remove(filepath.Join(dir, fmt.Sprintf("bulk%d", i-2)))
	}
}

func benchSyncOverlap(b *testing.B, n int, burn time.Duration, appendOnly, bulk bool) {
	const chunk, fileSize = 128 << 10, 32 << 20
	spinPerUsec() // calibrate before timing
	dir := b.TempDir()
	buf := make([]byte, chunk)
	for i := range buf {
		buf[i] = byte(i * 7)
	}
	files := make([]*os.File, n)
	for i := range files {
		f, err := os.Create(filepath.Join(dir, fmt.Sprintf("f%d", i)))
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		if !appendOnly {
			for off := 0; off < fileSize; off += chunk {
				if _, err := f.Write(buf); err != nil {
					b.Fatal(err)
				}
			}
			if err := f.Sync(); err != nil {
				b.Fatal(err)
			}
		}
		files[i] = f
	}
	var next atomic.Int64
	var syncNanos atomic.Int64
	var wg sync.WaitGroup
	stop := make(chan struct{})
	var bulkDone sync.WaitGroup
	if bulk {
		bulkDone.Go(func() { bulkWriter(b, dir, stop) })
	}
	b.ResetTimer()
	cpu0 := cpuTime()
	start := time.Now()
	for i, f := range files {
		wg.Go(func() {
			var off int64
			for next.Add(1) <= int64(b.N) {
				spin(burn)
				var err error
				if appendOnly {
					_, err = f.Write(buf)
				} else {
					_, err = f.WriteAt(buf, off)
					off = (off + chunk) % fileSize
				}
				if err != nil {
					b.Error(err)
					return
				}
				t0 := time.Now()
				if err := syscall.Fdatasync(int(f.Fd())); err != nil {
					b.Errorf("file %d: %v", i, err)
					return
				}
				syncNanos.Add(int64(time.Since(t0)))
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	cpu := cpuTime() - cpu0
	b.StopTimer()
	close(stop)
	bulkDone.Wait()
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "ops/s")
	b.ReportMetric(float64(syncNanos.Load())/float64(b.N)/1e3, "sync-µs")
	b.ReportMetric(float64(cpu.Milliseconds())/elapsed.Seconds(), "cpu-ms/s")
}

var (
	spinSink    atomic.Uint64
	spinPerUsec = sync.OnceValue(func() float64 {
		// The fastest of many short runs: the machine is shared, and a
		// run that lost the CPU meanwhile only looks slower.
		best := time.Hour
		for range 200 {
			t0 := time.Now()
			spinN(10_000)
			best = min(best, time.Since(t0))
		}
		return 10_000 / (float64(best) / 1e3)
	})
)

// spin does a fixed amount of arithmetic that takes d of CPU on an idle
// core: fixed work, not a deadline, so a goroutine that loses its core
// still owes all of it.
func spin(d time.Duration) {
	if d > 0 {
		spinN(int(float64(d.Microseconds()) * spinPerUsec()))
	}
}

func spinN(n int) {
	x := uint64(1)
	for range n {
		x = x*0x9e3779b97f4a7c15 + 1
		x ^= x >> 29
	}
	spinSink.Add(x & 1)
}
