package kv

import "fmt"

// Scoped returns the key under which principal's key is logged and stored:
// len(principal) as one byte, principal, key. The length byte keeps every
// principal's keys apart ("ab"+"c" and "a"+"bc" differ) and groups them in
// one contiguous range. principal must pass CheckPrincipal: every entry
// point checks it first, and a longer one panics here rather than writing
// into another principal's range.
func Scoped(principal string, key []byte) []byte {
	return AppendScoped(make([]byte, 0, 1+len(principal)+len(key)), principal, key)
}

// AppendScoped appends Scoped(principal, key) to dst.
func AppendScoped(dst []byte, principal string, key []byte) []byte {
	if len(principal) > MaxPrincipal {
		panic(fmt.Sprintf("kv: principal of %d bytes > %d: check it with CheckPrincipal", len(principal), MaxPrincipal))
	}
	dst = append(dst, byte(len(principal)))
	dst = append(dst, principal...)
	return append(dst, key...)
}

// ScopedPrefix returns the prefix of principal's keys that start with
// prefix: a range scan of it yields exactly those keys, in key order.
func ScopedPrefix(principal string, prefix []byte) []byte { return Scoped(principal, prefix) }

// SplitScoped splits a scoped key into its principal and key (key aliases
// scoped). A key too short for its length byte, or with an empty
// principal or key, is ErrCorrupt: Scoped never makes one.
func SplitScoped(scoped []byte) (principal string, key []byte, err error) {
	if len(scoped) == 0 || scoped[0] == 0 || len(scoped) <= 1+int(scoped[0]) {
		return "", nil, fmt.Errorf("%w: scoped key %q has no principal and key", ErrCorrupt, scoped)
	}
	n := 1 + int(scoped[0])
	return string(scoped[1:n]), scoped[n:], nil
}
