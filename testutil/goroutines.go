package testutil

import (
	"runtime"
	"testing"
	"time"
)

// WaitGoroutines waits until the goroutine count is back to base (timers and
// exiting goroutines need a moment) and fails the test with a dump of every
// goroutine otherwise: a test takes base from runtime.NumGoroutine before it
// starts what it checks for leaks.
func WaitGoroutines(t testing.TB, base int) {
	t.Helper()
	for i := 0; i < 500; i++ {
		if runtime.NumGoroutine() <= base {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	t.Fatalf("goroutine leak: %d > %d\n%s", runtime.NumGoroutine(), base, buf)
}
