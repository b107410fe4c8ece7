package crashmem_test

import (
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/oncewal/oncewal/internal/crashmem"
)

// TestCloneBesideLock: crash images taken while other goroutines lock and
// unlock files never deadlock (vfs.MemFS.Lock does, now and then: its
// nested read lock waits behind the clone's write lock), and a lock is
// exclusive across wraps of one MemFS and free again after Close.
func TestCloneBesideLock(t *testing.T) {
	fs := crashmem.New()
	if err := fs.MkdirAll("/d", 0o755); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	done := make(chan error, 4)
	for i := range 4 {
		go func() {
			name := "/d/LOCK" + string(rune('a'+i))
			for {
				select {
				case <-stop:
					done <- nil
					return
				default:
				}
				l, err := fs.Lock(name)
				if err != nil {
					done <- err
					return
				}
				if err := l.Close(); err != nil {
					done <- err
					return
				}
			}
		}()
	}
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		for range 2000 {
			fs.CrashClone(vfs.CrashCloneCfg{})
		}
	}()
	select {
	case <-finished:
	case <-time.After(time.Minute):
		t.Fatal("CrashClone beside Lock deadlocked")
	}
	close(stop)
	for range 4 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}

	l, err := fs.Lock("/d/LOCK")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := crashmem.Wrap(fs.MemFS).Lock("/d/LOCK"); !errors.Is(err, syscall.EAGAIN) {
		t.Fatalf("a second lock through another wrap: %v, want EAGAIN", err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l, err = fs.Lock("/d/LOCK")
	if err != nil {
		t.Fatalf("locking again after Close: %v", err)
	}
	_ = l.Close()
	if _, err := fs.Stat("/d/LOCK"); err != nil {
		t.Fatalf("the lock file is not in its directory: %v", err)
	}
}
