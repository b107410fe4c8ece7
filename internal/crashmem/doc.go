// Package crashmem makes Pebble's crashable in-memory filesystem
// (vfs.NewCrashableMem) safe to crash-clone while the code under test runs.
//
// vfs.MemFS.Lock read-locks the MemFS's clone lock and, holding it, calls
// Create, which read-locks it again (pebble v2.1.7, vfs/mem_fs.go). A
// CrashClone that asks for the clone lock between the two blocks the second
// read lock, and both wait forever: a simulation that takes a power
// failure's image of a running member hangs whenever the member is opening
// a store at that instant. Lock here takes the lock file with one Create.
//
// Invariants:
//
//  1. A file is locked at most once at a time per MemFS, across every
//     Wrap of it (as vfs.MemFS.Lock promises; a second Lock is EAGAIN).
//  2. Lock read-locks the MemFS's clone lock once, never twice.
package crashmem
