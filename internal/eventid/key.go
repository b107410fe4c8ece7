package eventid

import (
	"encoding/hex"
	"errors"
	"fmt"
)

// Key is a 128-bit idempotency key: the first 16 bytes of a BLAKE3-256
// digest (see idempotency.DeriveKey). Keys are compared by value and are uniformly
// distributed for honestly derived events.
type Key [16]byte

// ErrBadKey reports a string that is not a 32-character hex Key.
var ErrBadKey = errors.New("idempotency: bad key")

// String returns the key as 32 lowercase hex characters.
func (k Key) String() string {
	var b [32]byte
	hex.Encode(b[:], k[:])
	return string(b[:])
}

// ParseKey parses 32 hex characters (either case) into a Key. Any other
// input returns an error wrapping ErrBadKey.
func ParseKey(s string) (Key, error) {
	var k Key
	if len(s) != 2*len(k) {
		return Key{}, fmt.Errorf("%w: length %d, want %d hex characters", ErrBadKey, len(s), 2*len(k))
	}
	if _, err := hex.Decode(k[:], []byte(s)); err != nil {
		return Key{}, fmt.Errorf("%w: %w", ErrBadKey, err)
	}
	return k, nil
}
