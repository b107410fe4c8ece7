package bench

import (
	"fmt"
	"testing"
)

func BenchmarkClient(b *testing.B) {
	for _, f := range []int{0, 1, 2} {
		b.Run(fmt.Sprintf("inprocess/followers=%d", f), ClientInProcess(f))
		b.Run(fmt.Sprintf("network/followers=%d", f), ClientNetwork(f))
	}
}
