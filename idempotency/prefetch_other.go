//go:build !amd64

package idempotency

import "unsafe"

func prefetch(unsafe.Pointer) {}

func prefetchLinks(unsafe.Pointer, *int32) {}
