#include "textflag.h"

// func prefetch(addr unsafe.Pointer)
TEXT ·prefetch(SB), NOSPLIT|NOFRAME, $0-8
	MOVQ addr+0(FP), AX
	PREFETCHT0 (AX)
	RET

// func prefetchLinks(entries unsafe.Pointer, link *int32)
//
// Loads the entry index *link (an aligned int32, so never torn) and, unless
// it is negative (nilIdx), prefetches that entry and its LRU neighbours.
// The loads read only in-bounds words (entries[i].prev/next with i a valid
// index or nilIdx); the computed neighbour addresses are only prefetched,
// and PREFETCH never faults, so stale values are harmless.
// Layout (checked in store.go): entry is 24 bytes, prev at 16, next at 20.
TEXT ·prefetchLinks(SB), NOSPLIT|NOFRAME, $0-16
	MOVQ entries+0(FP), AX
	MOVQ link+8(FP), BX
	MOVLQSX (BX), CX
	TESTQ CX, CX
	JS done
	IMUL3Q $24, CX, CX
	ADDQ AX, CX
	MOVLQSX 16(CX), DX
	MOVLQSX 20(CX), SI
	TESTQ DX, DX
	JS next
	IMUL3Q $24, DX, DX
	PREFETCHT0 (AX)(DX*1)
next:
	TESTQ SI, SI
	JS done
	IMUL3Q $24, SI, SI
	PREFETCHT0 (AX)(SI*1)
done:
	RET
