package kvroute

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
)

// HashTag returns the bytes of key that decide its shard: the non-empty
// bytes between the first '{' and the first '}' after it, else the whole
// key (package doc, step 1). The result aliases key.
func HashTag(key []byte) []byte {
	open := bytes.IndexByte(key, '{')
	if open < 0 {
		return key
	}
	n := bytes.IndexByte(key[open+1:], '}')
	if n <= 0 { // no '}' after the '{', or an empty tag "{}"
		return key
	}
	return key[open+1 : open+1+n]
}

// Shard returns the shard of key among shards shards (package doc): jump
// hash of the first 8 bytes, little-endian, of SHA-256 of its hash tag.
// shards <= 1 gives 0.
func Shard(key []byte, shards int) uint32 {
	if shards <= 1 {
		return 0
	}
	sum := sha256.Sum256(HashTag(key))
	return uint32(JumpHash(binary.LittleEndian.Uint64(sum[:8]), shards))
}

// PrefixShard returns the shard of every key that starts with prefix, and
// true, when prefix holds a complete hash tag (a '{', then a '}' with
// bytes between): every such key has that tag. Otherwise keys with the
// prefix may lie in any shard, and it returns false.
func PrefixShard(prefix []byte, shards int) (uint32, bool) {
	open := bytes.IndexByte(prefix, '{')
	if open < 0 {
		return 0, false
	}
	if n := bytes.IndexByte(prefix[open+1:], '}'); n <= 0 {
		return 0, false
	}
	return Shard(prefix, shards), true
}

// JumpHash is Lamping and Veach's jump consistent hash: it maps key to a
// bucket in [0, buckets) so that growing buckets by one moves only
// 1/buckets of the keys. buckets < 1 is treated as 1. The package doc
// states the arithmetic for other languages.
func JumpHash(key uint64, buckets int) int {
	var b, j int64 = -1, 0
	for j < int64(buckets) {
		b = j
		key = key*2862933555777941757 + 1
		j = int64(float64(b+1) * (float64(int64(1)<<31) / float64((key>>33)+1)))
	}
	if b < 0 {
		return 0
	}
	return int(b)
}
