package wal

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"slices"

	"github.com/oncewal/oncewal/corruption"
)

// Format constants. Changing any of them changes the format.
const (
	// Version is the batch format version written and read by this
	// package (the layout in the package documentation).
	Version = 2
	// HeaderSize is the encoded size of a batch header.
	HeaderSize = 44
	// MaxBodySize bounds a batch body. Decoders reject larger BodyLen values
	// before reading or allocating anything.
	MaxBodySize = 64 << 20
	// MaxPayloadSize bounds one event's key+value bytes.
	MaxPayloadSize = 16 << 20

	// magic is "OWAL" in file order.
	magic = 0x4C41574F
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func crc32Castagnoli(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

// Header is a decoded batch header.
type Header struct {
	Version  uint16
	Shard    uint32
	Epoch    uint64 // leader epoch that wrote the batch
	FirstLSN uint64 // LSN of the first event; ≥ 1
	Count    uint32 // events in the batch; ≥ 1
	BodyLen  uint32
	BodyCRC  uint32 // CRC-32C (Castagnoli) of the body
	// HeaderCRC is the CRC-32C of header bytes 0–39 (set by DecodeHeader
	// and by encoding). It covers every other field, body CRC included, so
	// two batches with equal Headers are, short of a CRC collision, the same
	// batch: a leader compares a follower's last applied batch with its own
	// log's (Reader.BatchEndingAt) by comparing Headers.
	HeaderCRC uint32
}

// LastLSN is the LSN of the batch's last event.
func (h Header) LastLSN() uint64 { return h.FirstLSN + uint64(h.Count) - 1 }

// Size is the encoded size of the whole batch: header plus body.
func (h Header) Size() int { return HeaderSize + int(h.BodyLen) }

// Ref is the identity of the batch whose decoded header is h.
func (h Header) Ref() BatchRef { return BatchRef{Epoch: h.Epoch, CRC: h.HeaderCRC} }

// BatchRef identifies a batch of a shard's log: the epoch of the leader that
// wrote it and its header CRC (hdrcrc, the CRC-32C of header bytes 0–39,
// which hold the shard, epoch, first LSN, count, body length and body CRC,
// so it commits to the whole batch). Two logs holding batches with equal
// BatchRefs ending at the same LSN hold the same batch there. The zero
// BatchRef means unknown. Followers persist it with their position and
// state it in their hello; snapshots carry it; a leader compares it with its
// own log to find divergence.
type BatchRef struct {
	Epoch uint64
	CRC   uint32
}

// IsZero reports whether r is the zero (unknown) BatchRef.
func (r BatchRef) IsZero() bool { return r == BatchRef{} }

func (r BatchRef) String() string { return fmt.Sprintf("epoch %d crc %08x", r.Epoch, r.CRC) }

// BatchRefOf returns the identity of an encoded batch after checking its
// header (DecodeHeader: magic, version, header CRC, …).
func BatchRefOf(raw []byte) (BatchRef, error) {
	h, err := DecodeHeader(raw)
	if err != nil {
		return BatchRef{}, err
	}
	return h.Ref(), nil
}

// putHeader encodes h into b and sets h.HeaderCRC.
func putHeader(b []byte, h *Header) {
	le := binary.LittleEndian
	le.PutUint32(b[0:], magic)
	le.PutUint16(b[4:], h.Version)
	le.PutUint16(b[6:], 0) // flags, reserved
	le.PutUint32(b[8:], h.Shard)
	le.PutUint64(b[12:], h.Epoch)
	le.PutUint64(b[20:], h.FirstLSN)
	le.PutUint32(b[28:], h.Count)
	le.PutUint32(b[32:], h.BodyLen)
	le.PutUint32(b[36:], h.BodyCRC)
	h.HeaderCRC = crc32.Checksum(b[:40], castagnoli)
	le.PutUint32(b[40:], h.HeaderCRC)
}

// AppendBatch encodes one batch of events, appends it to dst and returns the
// extended slice. events[i] gets LSN firstLSN+i in the log (Event.LSN is
// ignored and not modified). It allocates only if dst lacks capacity.
//
// Errors: ErrInvalidEvent (empty batch, unknown op, fields not belonging to
// the op, firstLSN 0 or LSN overflow), ErrTooLarge (an event payload above
// MaxPayloadSize or a body above MaxBodySize). On error dst is returned
// unchanged in length.
func AppendBatch(dst []byte, shard uint32, epoch, firstLSN uint64, events []Event) ([]byte, error) {
	out, _, err := appendBatch(dst, shard, epoch, firstLSN, events)
	return out, err
}

func appendBatch(dst []byte, shard uint32, epoch, firstLSN uint64, events []Event) ([]byte, Header, error) {
	if len(events) == 0 {
		return dst, Header{}, fmt.Errorf("%w: empty batch", ErrInvalidEvent)
	}
	if firstLSN == 0 || firstLSN+uint64(len(events))-1 < firstLSN {
		return dst, Header{}, fmt.Errorf("%w: LSN range [%d, +%d) invalid", ErrInvalidEvent, firstLSN, len(events))
	}
	start := len(dst)
	// Size the body first: validating up front means a bad event leaves dst
	// untouched, and one grow covers the whole batch.
	body := 0
	for i := range events {
		e := &events[i]
		if err := e.validate(); err != nil {
			return dst, Header{}, fmt.Errorf("event %d: %w", i, err)
		}
		body += encodedEventSize(e)
		if body > MaxBodySize {
			return dst, Header{}, fmt.Errorf("%w: batch body > %d bytes at event %d", ErrTooLarge, MaxBodySize, i)
		}
	}
	dst = slices.Grow(dst, HeaderSize+body)
	dst = dst[:start+HeaderSize] // header is filled in once the body CRC is known
	for i := range events {
		dst = appendEvent(dst, &events[i])
	}
	h := Header{
		Version:  Version,
		Shard:    shard,
		Epoch:    epoch,
		FirstLSN: firstLSN,
		Count:    uint32(len(events)),
		BodyLen:  uint32(len(dst) - start - HeaderSize),
		BodyCRC:  crc32.Checksum(dst[start+HeaderSize:], castagnoli),
	}
	putHeader(dst[start:start+HeaderSize], &h)
	return dst, h, nil
}

func uvarintLen(x uint64) int {
	n := 1
	for x >= 0x80 {
		x >>= 7
		n++
	}
	return n
}

func encodedEventSize(e *Event) int {
	n := eventFixedSize + uvarintLen(uint64(e.Seq))
	if e.HasIdemKey {
		n += len(e.IdemKey)
	}
	switch e.Op {
	case OpPut:
		n += uvarintLen(uint64(len(e.Key))) + len(e.Key) + uvarintLen(uint64(len(e.Value))) + len(e.Value)
	case OpDelete, OpKVDelete:
		n += uvarintLen(uint64(len(e.Key))) + len(e.Key)
	case OpKVPut:
		n += uvarintLen(uint64(len(e.Key))) + len(e.Key) + uvarintLen(uint64(len(e.Value))) + len(e.Value) +
			uvarintLen(uint64(e.Delta))
	case OpAdd:
		n += uvarintLen(uint64(len(e.Key))) + len(e.Key) + uvarintLen(uint64(e.Delta<<1)^uint64(e.Delta>>63))
	case OpClaim, OpComplete, OpRelease, OpFail, OpExtend:
		n += uvarintLen(uint64(len(e.Value))) + len(e.Value)
	}
	return n
}

// DecodeHeader decodes and validates the batch header at the front of buf.
// It checks, in order: length (ErrTruncated), magic (ErrCorrupt), version
// (ErrVersion: the version decides the layout of everything after it, so it
// is read before the checksum), header CRC (ErrChecksum), reserved flags,
// count and LSN range (ErrCorrupt), and BodyLen ≤ MaxBodySize (ErrTooLarge).
// It does not look at the body.
func DecodeHeader(buf []byte) (Header, error) {
	if len(buf) < HeaderSize {
		return Header{}, fmt.Errorf("%w: header needs %d bytes, have %d", ErrTruncated, HeaderSize, len(buf))
	}
	le := binary.LittleEndian
	if m := le.Uint32(buf[0:]); m != magic {
		return Header{}, fmt.Errorf("%w: bad magic %#08x", ErrCorrupt, m)
	}
	h := Header{Version: le.Uint16(buf[4:])}
	if h.Version != Version {
		return Header{}, fmt.Errorf("%w: batch version %d, want %d", ErrVersion, h.Version, Version)
	}
	if got, want := crc32.Checksum(buf[:40], castagnoli), le.Uint32(buf[40:]); got != want {
		return Header{}, fmt.Errorf("%w: header crc %#08x, stored %#08x", ErrChecksum, got, want)
	}
	h.HeaderCRC = le.Uint32(buf[40:])
	if f := le.Uint16(buf[6:]); f != 0 {
		return Header{}, fmt.Errorf("%w: reserved header flags %#x", ErrCorrupt, f)
	}
	h.Shard = le.Uint32(buf[8:])
	h.Epoch = le.Uint64(buf[12:])
	h.FirstLSN = le.Uint64(buf[20:])
	h.Count = le.Uint32(buf[28:])
	h.BodyLen = le.Uint32(buf[32:])
	h.BodyCRC = le.Uint32(buf[36:])
	if h.BodyLen > MaxBodySize {
		return Header{}, corruption.Mark(fmt.Errorf("%w: body length %d > %d", ErrTooLarge, h.BodyLen, MaxBodySize))
	}
	if h.Count == 0 || uint64(h.Count) > uint64(h.BodyLen)/minEventSize {
		return Header{}, fmt.Errorf("%w: count %d impossible for body of %d bytes", ErrCorrupt, h.Count, h.BodyLen)
	}
	if h.FirstLSN == 0 || h.LastLSN() < h.FirstLSN {
		return Header{}, fmt.Errorf("%w: LSN range %d+%d", ErrCorrupt, h.FirstLSN, h.Count)
	}
	return h, nil
}

// DecodeBatch decodes exactly one batch: buf must hold the header and body
// and nothing else (shorter → ErrTruncated, longer → ErrCorrupt). Events are
// appended to events[:0] and the extended slice returned; Event.LSN is set.
//
// The returned events ALIAS buf: Key and Value point into it (with capacity
// clipped to their length). Copy them before reusing buf. Apart from growing
// events (bounded by len(buf), never by a length read from buf), it does not
// allocate. On error the returned slice holds whatever decoded so far and
// must not be applied.
func DecodeBatch(buf []byte, events []Event) (Header, []Event, error) {
	events = events[:0]
	h, err := DecodeHeader(buf)
	if err != nil {
		return Header{}, events, err
	}
	if len(buf)-HeaderSize < int(h.BodyLen) {
		return Header{}, events, fmt.Errorf("%w: body needs %d bytes, have %d", ErrTruncated, h.BodyLen, len(buf)-HeaderSize)
	}
	if len(buf)-HeaderSize > int(h.BodyLen) {
		return Header{}, events, fmt.Errorf("%w: %d trailing bytes after batch", ErrCorrupt, len(buf)-HeaderSize-int(h.BodyLen))
	}
	body := buf[HeaderSize:]
	if got := crc32.Checksum(body, castagnoli); got != h.BodyCRC {
		return Header{}, events, fmt.Errorf("%w: body crc %#08x, header says %#08x", ErrChecksum, got, h.BodyCRC)
	}
	// Count ≤ BodyLen/minEventSize (checked by DecodeHeader) and BodyLen ≤
	// len(buf), so this grow is bounded by the input actually present.
	// decodeEvent writes every field, so the slots are not zeroed first.
	events = slices.Grow(events, int(h.Count))[:h.Count]
	off := 0
	for i := range events {
		n, err := decodeEvent(body[off:], &events[i], h.FirstLSN+uint64(i))
		if err != nil {
			return Header{}, events[:i], fmt.Errorf("batch %d event %d (LSN %d) at body offset %d: %w",
				h.FirstLSN, i, h.FirstLSN+uint64(i), off, err)
		}
		off += n
	}
	if off != len(body) {
		return Header{}, events, fmt.Errorf("%w: %d bytes after last event", ErrCorrupt, len(body)-off)
	}
	return h, events, nil
}
