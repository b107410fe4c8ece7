package testutil

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"github.com/oncewal/oncewal/internal/crashmem"
)

// OpKinds selects the operations of the given kinds, for FailNth.Match and
// CrashOptions.Count.
func OpKinds(kinds ...errorfs.OpKind) func(errorfs.Op) bool {
	return func(op errorfs.Op) bool { return slices.Contains(kinds, op.Kind) }
}

// Mutations selects the operations that change what is on disk: creating,
// linking, renaming and removing files, making directories, writes and
// syncs (not locks, closes or preallocation).
var Mutations = OpKinds(errorfs.OpCreate, errorfs.OpLink, errorfs.OpRemove, errorfs.OpRemoveAll, errorfs.OpRename,
	errorfs.OpMkdirAll, errorfs.OpReuseForWrite, errorfs.OpFileWrite, errorfs.OpFileWriteAt, errorfs.OpFileSync,
	errorfs.OpFileSyncData, errorfs.OpFileSyncTo)

// FailNth is an errorfs.Injector that fails the N-th operation (from 0)
// that Match selects (every operation if Match is nil) with
// errorfs.ErrInjected, once, and counts the operations it selects. Wrapped
// in an errorfs.Toggle it counts only while on: a sweep that lets the setup
// run and fails each step of what follows in turn.
type FailNth struct {
	N     int64
	Match func(errorfs.Op) bool

	seen  atomic.Int64
	fired atomic.Bool
}

// String implements errorfs.Injector.
func (f *FailNth) String() string { return fmt.Sprintf("fail operation #%d", f.N) }

// MaybeError implements errorfs.Injector.
func (f *FailNth) MaybeError(op errorfs.Op) error {
	if f.Match != nil && !f.Match(op) {
		return nil
	}
	if f.seen.Add(1)-1 == f.N && f.fired.CompareAndSwap(false, true) {
		return errorfs.ErrInjected
	}
	return nil
}

// Seen is how many selected operations there were.
func (f *FailNth) Seen() int64 { return f.seen.Load() }

// Fired reports whether the N-th operation came and failed.
func (f *FailNth) Fired() bool { return f.fired.Load() }

// ErrCrash is what the operation at a CrashFS's crash point returns, and
// every operation after it: the process died there.
var ErrCrash = errors.New("testutil: simulated crash")

// CrashOptions say where a CrashFS crashes and what the image keeps.
type CrashOptions struct {
	// At is the counted operation (from 0) just before which the crash
	// image is taken. Negative: never (a probe run that only counts).
	At int
	// Count selects the operations that count; nil counts every one.
	Count func(errorfs.Op) bool
	// Clone says how much unsynced data the image keeps; the zero value
	// keeps exactly what was synced.
	Clone vfs.CrashCloneCfg
	// Continue lets the operation at the crash point and every later one
	// run: the image is taken and the workload goes on, for a sweep that
	// needs each run to finish. By default they fail with ErrCrash.
	Continue bool
	// OnCrash, if set, runs right after the image is taken and before the
	// operation, to note what the workload had done at the crash. It runs
	// under the CrashFS's lock: it must not call the CrashFS.
	OnCrash func()
	// Disarmed: counting starts at Arm (say, once the store exists).
	Disarmed bool
}

// CrashFS is a crashable in-memory filesystem behind errorfs that takes a
// crash image (vfs.MemFS.CrashClone) just before one chosen operation: what
// a crash of the process at that point could leave on disk. The code under
// test uses the CrashFS (a vfs.FS); the test then recovers from Image.
type CrashFS struct {
	vfs.FS
	mem *vfs.MemFS
	o   CrashOptions

	mu      sync.Mutex
	armed   bool
	n       int
	image   *vfs.MemFS
	crashed bool
}

// NewCrashFS wraps mem, which must be crashable (vfs.NewCrashableMem, or an
// image of another CrashFS to crash its recovery in turn).
func NewCrashFS(mem *vfs.MemFS, o CrashOptions) *CrashFS {
	c := &CrashFS{mem: mem, o: o, armed: !o.Disarmed}
	// crashmem: a crash image taken while a store opens must not deadlock
	// in MemFS.Lock.
	c.FS = errorfs.Wrap(crashmem.Wrap(mem), errorfs.InjectorFunc(c.maybeCrash))
	return c
}

func (c *CrashFS) maybeCrash(op errorfs.Op) error {
	if c.o.Count != nil && !c.o.Count(op) {
		return c.dead()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.armed {
		return nil
	}
	if c.n == c.o.At && c.image == nil {
		c.image = c.mem.CrashClone(c.o.Clone)
		c.crashed = !c.o.Continue
		if c.o.OnCrash != nil {
			c.o.OnCrash()
		}
	}
	c.n++
	if c.crashed {
		return ErrCrash
	}
	return nil
}

func (c *CrashFS) dead() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.crashed {
		return ErrCrash
	}
	return nil
}

// Arm starts the count of a CrashFS made with Disarmed.
func (c *CrashFS) Arm() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.armed = true
}

// Image is the crash image, or nil if the workload ended before the crash
// point.
func (c *CrashFS) Image() *vfs.MemFS {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.image
}

// Counted is how many counted operations there were (while armed): after
// a probe run (At < 0), the number of crash points.
func (c *CrashFS) Counted() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}
