#include "textflag.h"

// func Prefetch(addr unsafe.Pointer)
TEXT ·Prefetch(SB), NOSPLIT|NOFRAME, $0-8
	MOVQ addr+0(FP), AX
	PREFETCHT0 (AX)
	RET

// func prefetchLinks(links, entries unsafe.Pointer, size uintptr, link *int32)
//
// Loads the entry index *link (an aligned int32, so never torn) and, unless
// it is negative (Nil), prefetches that entry, loads its links and
// prefetches the links of its list neighbours (and so the neighbours: the
// links sit inside an entry). The loads read only in-bounds words (entry
// i's links with i a valid index); the computed addresses are only
// prefetched, and PREFETCH never faults, so stale values are harmless.
// Links are 8 bytes: Prev at 0, Next at 4 (checked in prefetch_amd64.go);
// entry i's links are at links + i*size.
TEXT ·prefetchLinks(SB), NOSPLIT|NOFRAME, $0-32
	MOVQ links+0(FP), AX
	MOVQ entries+8(FP), R8
	MOVQ size+16(FP), R9
	MOVQ link+24(FP), BX
	MOVLQSX (BX), CX
	TESTQ CX, CX
	JS done
	MOVQ CX, DX
	IMULQ R9, DX
	PREFETCHT0 (R8)(DX*1)
	MOVLQSX 0(AX)(DX*1), DI
	MOVLQSX 4(AX)(DX*1), SI
	TESTQ DI, DI
	JS next
	IMULQ R9, DI
	PREFETCHT0 (AX)(DI*1)
next:
	TESTQ SI, SI
	JS done
	IMULQ R9, SI
	PREFETCHT0 (AX)(SI*1)
done:
	RET
