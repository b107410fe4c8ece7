//go:build !amd64

package lrutable

import "unsafe"

// Prefetch is a no-op where there is no prefetch helper.
func Prefetch(unsafe.Pointer) {}

func prefetchLinks(_, _ unsafe.Pointer, _ uintptr, _ *int32) {}
