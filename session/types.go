package session

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
)

// ID identifies a client session: 16 opaque bytes.
type ID [16]byte

// SeqNo is a per-session sequence number. The first SeqNo of a session is 1;
// 0 means "no seqno" and is never checked or advanced by the Tracker.
type SeqNo uint64

// MaxSeqNo is the largest HWM the Tracker records (2^63−1, out of reach of
// a session numbered from 1): the cache keeps the closed flag in the top
// bit. Advance refuses to go past it and a stored record beyond it is
// corrupt.
const MaxSeqNo SeqNo = 1<<63 - 1

// ErrBadID is returned by ParseID for anything but exactly 32 hex digits.
var ErrBadID = errors.New("session: bad session ID")

// NewID returns a random ID from crypto/rand. 128 random bits make a collision
// between independently created sessions negligible, so no coordination is
// needed to open a session.
func NewID() ID {
	var id ID
	// crypto/rand.Read never returns an error on supported platforms (Go 1.24+
	// crashes the program instead of returning short reads).
	_, _ = rand.Read(id[:])
	return id
}

// String returns the ID as 32 lowercase hex digits.
func (id ID) String() string {
	var buf [32]byte
	hex.Encode(buf[:], id[:])
	return string(buf[:])
}

// ParseID parses 32 hex digits (either case) into an ID.
func ParseID(s string) (ID, error) {
	var id ID
	if len(s) != 2*len(id) {
		return ID{}, ErrBadID
	}
	if _, err := hex.Decode(id[:], []byte(s)); err != nil {
		return ID{}, ErrBadID
	}
	return id, nil
}
