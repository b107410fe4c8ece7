package bench

import (
	"fmt"
	"os"
	"testing"
)

// BenchmarkWindow: a full 100K window, oncewal vs golang-lru (see
// WindowCheck for the kinds).
func BenchmarkWindow(b *testing.B) {
	for _, im := range impls {
		for _, kind := range []string{"dup", "new", "parallel-dup", "parallel-new"} {
			b.Run(im.name+"/"+kind, WindowCheck(im.name, kind))
		}
	}
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
		b.Run(im.name, WindowMemory(im.name, churn))
	}
}
