package idempotency

import "unsafe"

// prefetch asks the CPU to bring the cache line at addr into L1. It is a
// hint, not a memory access: it never faults and has no effect on program
// semantics (so it is no data race), only on timing.
//
//go:noescape
func prefetch(addr unsafe.Pointer)

// prefetchLinks warms the entry whose index is *link and that entry's two
// list neighbours. It reads *link and the entry's links without
// synchronisation, in assembly, and uses them only as prefetch addresses:
// a value raced with a writer yields a useless prefetch, never a wrong
// result, because the caller redoes everything under the lock.
//
//go:noescape
func prefetchLinks(entries unsafe.Pointer, link *int32)
