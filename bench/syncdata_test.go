package bench

import (
	"fmt"
	"path/filepath"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// BenchmarkSyncData measures what a WAL append's fdatasync costs in a file
// that grows with each append (the WAL today) against one whose bytes were
// written as zeros beforehand, so that the append changes no file size or
// extent and the sync has no metadata to commit:
//
//	go test ./bench -run '^$' -bench SyncData -benchtime 500x -count 2
func BenchmarkSyncData(b *testing.B) {
	for _, size := range []int{15_000, 150_000} {
		for _, zeros := range []bool{false, true} {
			name := "grow"
			if zeros {
				name = "zeros"
			}
			b.Run(fmt.Sprintf("%s/bytes=%d", name, size), func(b *testing.B) {
				f, err := vfs.Default.Create(filepath.Join(b.TempDir(), "seg"), vfs.WriteCategoryUnspecified)
				if err != nil {
					b.Fatal(err)
				}
				defer f.Close()
				if zeros {
					z := make([]byte, 1<<20)
					for off := 0; off < b.N*size; off += len(z) {
						if _, err := f.WriteAt(z, int64(off)); err != nil {
							b.Fatal(err)
						}
					}
					if err := f.Sync(); err != nil {
						b.Fatal(err)
					}
				}
				buf := make([]byte, size)
				cpu0 := cpuNanos()
				b.ResetTimer()
				for i := range b.N {
					if _, err := f.WriteAt(buf, int64(i*size)); err != nil {
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
