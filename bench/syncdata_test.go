package bench

import (
	"fmt"
	"path/filepath"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// BenchmarkSyncData measures what a WAL append's fdatasync costs in a file
// that grows with each append (a WAL without wal.WriterOptions.ZeroAhead)
// against one whose bytes the appends overwrite: zeros written inline 1 MiB
// ahead, as the WAL does (their writing and first sync counted), and zeros
// written and synced before the timer starts (the floor: a sync with no
// file size or extent to commit):
//
//	go test ./bench -run '^$' -bench SyncData -benchtime 500x -count 2
func BenchmarkSyncData(b *testing.B) {
	const ahead = 1 << 20
	zeros := make([]byte, 64<<10)
	for _, size := range []int{15_000, 150_000} {
		for _, mode := range []string{"grow", "zeros-ahead", "zeros-before"} {
			b.Run(fmt.Sprintf("%s/bytes=%d", mode, size), func(b *testing.B) {
				f, err := vfs.Default.Create(filepath.Join(b.TempDir(), "seg"), vfs.WriteCategoryUnspecified)
				if err != nil {
					b.Fatal(err)
				}
				defer f.Close()
				filled := int64(0)
				fill := func(to int64) {
					for ; filled < to; filled += int64(len(zeros)) {
						if _, err := f.WriteAt(zeros, filled); err != nil {
							b.Fatal(err)
						}
					}
				}
				if mode == "zeros-before" {
					fill(int64(b.N*size + ahead))
					if err := f.Sync(); err != nil {
						b.Fatal(err)
					}
				}
				buf := make([]byte, size)
				for i := range buf {
					buf[i] = byte(1 + i%255)
				}
				cpu0 := cpuNanos()
				b.ResetTimer()
				for i := range b.N {
					off := int64(i * size)
					if mode == "zeros-ahead" && off+int64(size) > filled {
						fill(off + int64(size) + ahead)
					}
					if _, err := f.WriteAt(buf, off); err != nil {
						b.Fatal(err)
					}
					if err := f.SyncData(); err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				b.ReportMetric(float64(cpuNanos()-cpu0)/float64(b.N), "cpu-ns/op")
			})
		}
	}
}
