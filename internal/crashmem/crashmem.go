package crashmem

import (
	"io"
	"sync"
	"syscall"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// FS is a vfs.MemFS whose Lock never read-locks the clone lock twice.
type FS struct {
	*vfs.MemFS
}

// New is a fresh crashable in-memory filesystem.
func New() FS { return Wrap(vfs.NewCrashableMem()) }

// Wrap is mem with a Lock safe beside CrashClone.
func Wrap(mem *vfs.MemFS) FS { return FS{mem} }

// CrashClone is vfs.MemFS.CrashClone, wrapped.
func (f FS) CrashClone(cfg vfs.CrashCloneCfg) FS { return Wrap(f.MemFS.CrashClone(cfg)) }

type lockKey struct {
	mem  *vfs.MemFS
	name string
}

// locked holds the files locked on every wrapped MemFS (invariant 1).
var locked sync.Map

// Lock locks name as vfs.MemFS.Lock does (the file is created, visible in
// its directory, and left in place by Close) without its second read lock.
func (f FS) Lock(name string) (io.Closer, error) {
	k := lockKey{f.MemFS, name}
	if _, taken := locked.LoadOrStore(k, nil); taken {
		return nil, syscall.EAGAIN
	}
	file, err := f.MemFS.Create(name, vfs.WriteCategoryUnspecified)
	if err != nil {
		locked.Delete(k)
		return nil, err
	}
	return &fileLock{key: k, f: file}, nil
}

type fileLock struct {
	once sync.Once
	key  lockKey
	f    vfs.File
}

func (l *fileLock) Close() error {
	var err error
	l.once.Do(func() {
		locked.Delete(l.key)
		err = l.f.Close()
	})
	return err
}
