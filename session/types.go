package session

// ID identifies a client session: 16 opaque bytes.
type ID [16]byte

// SeqNo is a per-session sequence number. The first SeqNo of a session is 1;
// 0 means "no seqno".
type SeqNo uint64
