package eventid

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
)

// SessionID identifies a client session: 16 opaque bytes.
type SessionID [16]byte

// SeqNo is a per-session sequence number. The first SeqNo of a session is 1;
// 0 means "no seqno" and is never checked or advanced by the Tracker.
type SeqNo uint64

// ErrBadSessionID is returned by ParseSessionID for anything but exactly 32
// hex digits.
var ErrBadSessionID = errors.New("session: bad session ID")

// NewSessionID returns a random SessionID from crypto/rand. 128 random bits
// make a collision between independently created sessions negligible, so no
// coordination is needed to open a session.
func NewSessionID() SessionID {
	var id SessionID
	// crypto/rand.Read never returns an error on supported platforms (Go 1.24+
	// crashes the program instead of returning short reads).
	_, _ = rand.Read(id[:])
	return id
}

// String returns the ID as 32 lowercase hex digits.
func (id SessionID) String() string {
	var buf [32]byte
	hex.Encode(buf[:], id[:])
	return string(buf[:])
}

// ParseSessionID parses 32 hex digits (either case) into a SessionID.
func ParseSessionID(s string) (SessionID, error) {
	var id SessionID
	if len(s) != 2*len(id) {
		return SessionID{}, ErrBadSessionID
	}
	if _, err := hex.Decode(id[:], []byte(s)); err != nil {
		return SessionID{}, ErrBadSessionID
	}
	return id, nil
}
