package lrutable

import "unsafe"

// Prefetch asks the CPU to bring the cache line at addr into L1. It is a
// hint, not a memory access: it never faults and has no effect on program
// semantics (so it is no data race), only on timing.
//
//go:noescape
func Prefetch(addr unsafe.Pointer)

// prefetchLinks prefetches entry *link and the entries of its list
// neighbours (entries is entry 0, links entry 0's links, size the size of
// an entry and so the stride of both). It
// reads *link and the entry's links without synchronization, in assembly,
// and uses them only as prefetch addresses: a value raced with a writer
// yields a useless prefetch, never a wrong result, because the caller redoes
// everything under its lock.
//
//go:noescape
func prefetchLinks(links, entries unsafe.Pointer, size uintptr, link *int32)

// The assembly in prefetch_amd64.s relies on this layout.
var (
	_ = [1]struct{}{}[unsafe.Sizeof(Links{})-8]
	_ = [1]struct{}{}[unsafe.Offsetof(Links{}.Prev)]
	_ = [1]struct{}{}[unsafe.Offsetof(Links{}.Next)-4]
)
