// Package kvroute computes the shard of a key — the one routing rule every
// client, in any language, and every node must agree on, so it imports
// nothing but the standard library and is specified here byte for byte.
//
// # The rule
//
// For a key (an arbitrary byte string) and a deployment of n shards:
//
//  1. The hash tag (HashTag), Redis Cluster's rule: find the first '{'
//     (0x7b). If there is one, find the first '}' (0x7d) after it. If both
//     exist and at least one byte lies between them, the tag is the bytes
//     strictly between them; otherwise the tag is the whole key. So
//     "{acct:alice}/balance" and "{acct:alice}/name" share the tag
//     "acct:alice"; "{}x" and "x{" hash whole; in "a{}{b}" the first '{'
//     is followed at once by '}', so the whole key is hashed (Redis does
//     not look for a later pair either).
//  2. h = SHA-256(tag); k = the first 8 bytes of h read as an unsigned
//     little-endian 64-bit integer (h[0] is the least significant byte).
//  3. shard = JumpHash(k, n); for n <= 1 the shard is 0.
//
// SHA-256 because every language's standard library has it (Python's
// hashlib, Java's MessageDigest, Go's crypto/sha256), so a client needs no
// dependency to route; it costs a few hundred nanoseconds a key, nothing
// beside a network round trip.
//
// # Jump consistent hash
//
// JumpHash is Lamping and Veach's "A Fast, Minimal Memory, Consistent Hash
// Algorithm" (2014), with unsigned 64-bit wrapping arithmetic on k and
// IEEE-754 double precision on the rest:
//
//	b, j := -1, 0                                  // signed 64-bit
//	while j < n:
//	    b = j
//	    k = k * 2862933555777941757 + 1            // mod 2^64
//	    j = floor((b + 1) * (2^31 / ((k >> 33) + 1)))
//	                                               // (k>>33)+1 and b+1 converted to double;
//	                                               // 2^31 / ... computed first, in double
//	return b (0 if b < 0, i.e. n < 1)
//
// Every step is exact in double except the division and the product, which
// IEEE-754 rounds to nearest, identically in every language that uses
// doubles (Python floats, Java double, C double without x87 extended
// precision). Growing n by one moves only about 1/(n+1) of the keys, so
// a later re-shard moves little.
//
// testdata/shards.txt pins the rule (key, shard count, shard; printable
// ASCII keys, tab-separated) for this package's test and for other
// languages' clients to check themselves against.
package kvroute
