package idempotency

import (
	"encoding/binary"
	"math/bits"

	"lukechampine.com/blake3/guts"

	"github.com/oncewal/oncewal/session"
)

// prefixLen is the length of id ‖ seq (LE 8) that precedes op in the hashed
// message.
const prefixLen = 16 + 8

// DeriveKey returns the first 16 bytes of BLAKE3-256(id ‖ seq as 8 bytes
// little-endian ‖ op). It is deterministic, allocation-free and safe for
// concurrent use; op is only read, never retained.
//
// Why not blake3.Sum256 or a Hasher: Sum256 needs the message contiguous (a
// copy of op), a Hasher costs 3 KB per New and its Write argument escapes
// (so a caller's stack buffer would move to the heap), and any single Write
// over 1 KiB starts goroutines. Instead the message is fed block by block
// straight from id, seq and op into the guts compression function, using
// the BLAKE3 tree for ops longer than one 1 KiB chunk. The result equals the
// reference BLAKE3 (checked against the official test vectors).
func DeriveKey(id session.ID, seq session.SeqNo, op []byte) Key {
	var head [prefixLen]byte
	copy(head[:16], id[:])
	binary.LittleEndian.PutUint64(head[16:], uint64(seq))
	out := sum(head[:], op)
	var k Key
	binary.LittleEndian.PutUint32(k[0:], out[0])
	binary.LittleEndian.PutUint32(k[4:], out[1])
	binary.LittleEndian.PutUint32(k[8:], out[2])
	binary.LittleEndian.PutUint32(k[12:], out[3])
	return k
}

// sum returns the first 8 output words of unkeyed BLAKE3 over head ‖ op,
// where len(head) <= guts.BlockSize. Splitting the message this way lets
// DeriveKey hash without copying op into a contiguous buffer.
func sum(head, op []byte) [8]uint32 {
	total := len(head) + len(op)
	if total <= guts.ChunkSize {
		// The common case: one chunk, no tree, nothing on the stack but a
		// node.
		n := chunk(head, op, 0, total, 0)
		n.Flags |= guts.FlagRoot
		return guts.ChainingValue(n)
	}
	return sumTree(head, op, total)
}

// sumTree hashes a message of more than one chunk. Kept out of sum so the
// small path does not zero the CV stack.
func sumTree(head, op []byte, total int) [8]uint32 {
	// stack[i] holds the CV of a complete subtree of 2^i chunks; counter's
	// bit i says whether it is occupied (the BLAKE3 incremental tree).
	var stack [64][8]uint32
	var counter uint64
	off := 0
	for total-off > guts.ChunkSize {
		cv := guts.ChainingValue(chunk(head, op, off, off+guts.ChunkSize, counter))
		h := 0
		for counter&(1<<h) != 0 {
			cv = guts.ChainingValue(guts.ParentNode(stack[h], cv, &guts.IV, 0))
			h++
		}
		stack[h] = cv
		counter++
		off += guts.ChunkSize
	}
	n := chunk(head, op, off, total, counter)
	for h := bits.TrailingZeros64(counter); h < bits.Len64(counter); h++ {
		if counter&(1<<h) != 0 {
			n = guts.ParentNode(stack[h], guts.ChainingValue(n), &guts.IV, 0)
		}
	}
	n.Flags |= guts.FlagRoot
	return guts.ChainingValue(n)
}

// chunk compresses message bytes [start, end) (one chunk: end-start <=
// ChunkSize, start a multiple of ChunkSize) and returns the chunk's final,
// not yet compressed, node — as guts.CompressChunk does for a contiguous
// chunk.
func chunk(head, op []byte, start, end int, counter uint64) guts.Node {
	n := guts.Node{
		CV:       guts.IV,
		Counter:  counter,
		BlockLen: guts.BlockSize,
		Flags:    guts.FlagChunkStart,
	}
	for off := start; ; off += guts.BlockSize {
		blen := min(guts.BlockSize, end-off)
		n.Block = block(head, op, off, blen)
		if off+guts.BlockSize >= end {
			n.BlockLen = uint32(blen)
			n.Flags |= guts.FlagChunkEnd
			return n
		}
		n.CV = guts.ChainingValue(n)
		n.Flags &^= guts.FlagChunkStart
	}
}

// block returns message bytes [off, off+blen) as little-endian words,
// zero-padded to a full block. Only the block at offset 0 can overlap head
// because len(head) <= BlockSize.
func block(head, op []byte, off, blen int) [16]uint32 {
	hl := len(head)
	if off >= hl && blen == guts.BlockSize {
		// Full block wholly inside op: read the words in place.
		p := op[off-hl : off-hl+guts.BlockSize]
		var w [16]uint32
		for i := range w {
			w[i] = binary.LittleEndian.Uint32(p[4*i:])
		}
		return w
	}
	var b [guts.BlockSize]byte
	if off < hl {
		n := copy(b[:], head[off:])
		copy(b[n:blen], op)
	} else {
		copy(b[:blen], op[off-hl:])
	}
	return guts.BytesToWords(b)
}
