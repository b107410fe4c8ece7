package idempotency

import (
	"encoding/binary"
	"math/bits"
	"unsafe"

	"lukechampine.com/blake3"
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
	if total <= guts.BlockSize {
		// One block: DeriveKey of an op up to 40 bytes.
		var b [guts.BlockSize]byte
		n := copy(b[:], head)
		copy(b[n:], op)
		out := guts.CompressNode(guts.Node{
			CV:       guts.IV,
			Block:    guts.BytesToWords(b),
			BlockLen: uint32(total),
			Flags:    guts.FlagChunkStart | guts.FlagChunkEnd | guts.FlagRoot,
		})
		return [8]uint32(out[:8])
	}
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
	// Fill the node's block in place (little-endian words, as guts does).
	bb := (*[guts.BlockSize]byte)(unsafe.Pointer(&n.Block))
	hl := len(head)
	for off := start; ; off += guts.BlockSize {
		last := off+guts.BlockSize >= end
		switch {
		case off >= hl && !last:
			copy(bb[:], op[off-hl:])
		case off >= hl:
			*bb = [guts.BlockSize]byte{}
			copy(bb[:], op[off-hl:end-hl])
		default: // only the block at offset 0 overlaps head
			*bb = [guts.BlockSize]byte{}
			copy(bb[copy(bb[:], head):min(guts.BlockSize, end)], op)
		}
		if last {
			n.BlockLen = uint32(end - off)
			n.Flags |= guts.FlagChunkEnd
			return n
		}
		n.CV = guts.ChainingValue(n)
		n.Flags &^= guts.FlagChunkStart
	}
}

// clientKeyContext is the BLAKE3 derive-key context of ClientKey: a
// different BLAKE3 mode from DeriveKey's plain hash, so no request ID can
// produce the key of a derived (session, SeqNo, op) and vice versa.
const clientKeyContext = "oncewal 2026-11-23 client request ID to idempotency key v1"

// ClientKey turns a client's request ID (any bytes the client reuses when it
// retries, such as an Idempotency-Key header) into the 16-byte window key to
// put on the event (wal.Event.IdemKey with HasIdemKey) of that request and of
// each of its retries: the leader logs a retry under a fresh SeqNo, and the
// followers' window recognises the key and discards it. It is the first 16
// bytes of BLAKE3's derive-key mode over requestID with a fixed context.
// Distinct request IDs collide with probability ~2^-128.
//
// A request ID of up to one BLAKE3 chunk (1 KiB) is hashed straight with the
// guts compression function, from the context's key computed once:
// blake3.DeriveKey builds two Hashers per call (~6.6 KB of garbage, which
// was 92 % of the bytes a client-request benchmark allocated). Longer IDs
// take blake3.DeriveKey; both give the same key (checked in the tests).
func ClientKey(requestID []byte) Key {
	var k Key
	if len(requestID) > guts.ChunkSize {
		out := make([]byte, len(k)) // escapes into blake3; k stays on the stack
		blake3.DeriveKey(out, clientKeyContext, requestID)
		return Key(out)
	}
	n := guts.CompressChunk(requestID, &clientKeyIV, 0, guts.FlagDeriveKeyMaterial)
	n.Flags |= guts.FlagRoot
	cv := guts.ChainingValue(n)
	binary.LittleEndian.PutUint32(k[0:], cv[0])
	binary.LittleEndian.PutUint32(k[4:], cv[1])
	binary.LittleEndian.PutUint32(k[8:], cv[2])
	binary.LittleEndian.PutUint32(k[12:], cv[3])
	return k
}

// clientKeyIV is the key of ClientKey's derive-key-material hash: the
// BLAKE3 derive-key-context hash of clientKeyContext (one chunk).
var clientKeyIV = func() [8]uint32 {
	n := guts.CompressChunk([]byte(clientKeyContext), &guts.IV, 0, guts.FlagDeriveKeyContext)
	n.Flags |= guts.FlagRoot
	return guts.ChainingValue(n)
}()
