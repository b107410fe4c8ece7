package session

import "github.com/oncewal/oncewal/internal/eventid"

// ID identifies a client session: 16 opaque bytes (eventid.SessionID, the
// leaf type package wal uses too).
type ID = eventid.SessionID

// SeqNo is a per-session sequence number (eventid.SeqNo). The first SeqNo of
// a session is 1; 0 means "no seqno" and is never checked or advanced by the
// Tracker.
type SeqNo = eventid.SeqNo

// MaxSeqNo is the largest HWM the Tracker records (2^63−1, out of reach of
// a session numbered from 1): the cache keeps the closed flag in the top
// bit. Advance refuses to go past it and a stored record beyond it is
// corrupt.
const MaxSeqNo SeqNo = 1<<63 - 1

// ErrBadID is returned by ParseID for anything but exactly 32 hex digits.
var ErrBadID = eventid.ErrBadSessionID

// NewID returns a random ID (eventid.NewSessionID).
func NewID() ID { return eventid.NewSessionID() }

// ParseID parses 32 hex digits (either case) into an ID
// (eventid.ParseSessionID).
func ParseID(s string) (ID, error) { return eventid.ParseSessionID(s) }
