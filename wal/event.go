package wal

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/oncewal/oncewal/corruption"
	"github.com/oncewal/oncewal/internal/eventid"
	"github.com/oncewal/oncewal/internal/ledgerrecord"
)

// Op is the kind of a session event.
//
// Values 1–12 are assigned: 1–5 session ops, 6–10 request-ledger records,
// 11–12 ops of the principal key space (package kv). 0 is never valid, so a
// zeroed event is caught. 13–15 are reserved for future core ops and 16–255
// for future extension ops; until a decoder knows them it rejects them with
// ErrCorrupt (an op it cannot apply must stop the follower, not be
// skipped). Hence followers must run a version that knows every op before
// their leader logs it (extend, 10, came after 6–9; kvput and kvdelete,
// 11–12, after all of them: upgrade every follower before a leader that
// logs them).
type Op uint8

// Op kinds. The numeric values are part of the on-disk and wire format.
const (
	OpOpen   Op = 1 // session opened; no key/value/delta
	OpPut    Op = 2 // key := value
	OpDelete Op = 3 // delete key
	OpAdd    Op = 4 // key += delta (int64); not idempotent, so a double apply is visible
	OpClose  Op = 5 // session closed; no key/value/delta

	// Request-ledger records (ledgerrecord.Record): Value holds the record
	// body (Record.AppendBody), Time the decision's WAL time; no Key, no
	// Delta. The body is validated strictly when encoding and decoding. Op
	// = OpClaim + record kind - 1.
	OpClaim    Op = 6  // ledgerrecord.Claim
	OpComplete Op = 7  // ledgerrecord.Complete
	OpRelease  Op = 8  // ledgerrecord.Release
	OpFail     Op = 9  // ledgerrecord.Fail
	OpExtend   Op = 10 // ledgerrecord.Extend

	// Key-space ops (package kv): Key is the principal-scoped key (kv.Scoped;
	// opaque here, never empty). Both are data events of the request's
	// session, stamped with its SeqNo and idempotency key like put. They are
	// absolute — the leader resolved any condition or arithmetic — so
	// applying one needs no read.
	OpKVPut    Op = 11 // key := value at version Delta (≥ 1, stamped by the leader)
	OpKVDelete Op = 12 // delete key; no value, Delta 0

	lastOp = OpKVDelete
)

var opNames = [...]string{OpOpen: "open", OpPut: "put", OpDelete: "delete", OpAdd: "add", OpClose: "close",
	OpClaim: "claim", OpComplete: "complete", OpRelease: "release", OpFail: "fail", OpExtend: "extend",
	OpKVPut: "kvput", OpKVDelete: "kvdelete"}

// Valid reports whether o is an assigned op kind.
func (o Op) Valid() bool { return o >= OpOpen && o <= lastOp }

// IsLedger reports whether o is a request-ledger record op (claim, complete,
// release, fail, extend).
func (o Op) IsLedger() bool { return o >= OpClaim && o <= OpExtend }

// IsKV reports whether o is a key-space op (kvput, kvdelete).
func (o Op) IsKV() bool { return o == OpKVPut || o == OpKVDelete }

// RecordKind is the ledger record kind of a ledger op (0 for other ops).
func (o Op) RecordKind() ledgerrecord.Kind {
	if !o.IsLedger() {
		return 0
	}
	return ledgerrecord.Kind(o - OpClaim + 1)
}

// LedgerOp is the op that carries records of kind k (0 for an invalid kind).
func LedgerOp(k ledgerrecord.Kind) Op {
	if !k.Valid() {
		return 0
	}
	return OpClaim + Op(k-ledgerrecord.Claim)
}

// String returns open|put|delete|add|close|claim|complete|release|fail|extend|
// kvput|kvdelete, or "op(N)" for other values.
func (o Op) String() string {
	if o.Valid() {
		return opNames[o]
	}
	return fmt.Sprintf("op(%d)", uint8(o))
}

// ParseOp is the inverse of Op.String for assigned ops.
func ParseOp(s string) (Op, error) {
	for o := OpOpen; o <= lastOp; o++ {
		if opNames[o] == s {
			return o, nil
		}
	}
	return 0, fmt.Errorf("%w: unknown op %q", ErrInvalidEvent, s)
}

// LedgerEvent returns the WAL event that logs rec: op by kind, Time =
// rec.Time, Value = the record body. It carries no session, no SeqNo and no
// idempotency key: on a follower the position gate alone admits it, and
// applying a record again is harmless (idempotency.LedgerTx.Apply), so it
// needs neither the HWM nor the window — and takes no window slot, which
// belongs to operations. (Leaders before this change gave ledger events a
// key; receivers ignore it.)
func LedgerEvent(rec *ledgerrecord.Record) Event {
	return Event{Op: LedgerOp(rec.Kind), Time: rec.Time, Value: rec.AppendBody(nil)}
}

// LedgerRecord decodes the ledger record of a ledger event. Outcome aliases
// e.Value.
func (e *Event) LedgerRecord() (ledgerrecord.Record, error) {
	if !e.Op.IsLedger() {
		return ledgerrecord.Record{}, fmt.Errorf("%w: %s is not a ledger op", ErrInvalidEvent, e.Op)
	}
	return ledgerrecord.Decode(e.Op.RecordKind(), e.Time, e.Value)
}

// Event is one session event, key-space event or ledger record. Which of
// Key, Value and Delta are meaningful depends on Op: put uses Key+Value,
// delete Key, add Key+Delta, open and close none, ledger ops Value (the
// record body), kvput Key+Value+Delta (the version, ≥ 1), kvdelete Key
// (non-empty for both). The encoder rejects fields that do not belong to the op (ErrInvalidEvent),
// so decode(encode(e)) == e and the op bytes are canonical.
type Event struct {
	// LSN is the event's position in the log: Header.FirstLSN + index in its
	// batch. It is not encoded per event; the decoder and the Writer set it.
	LSN     uint64
	Op      Op
	Session eventid.SessionID
	Seq     eventid.SeqNo // 0 means "no seqno"
	// HasIdemKey says whether IdemKey is present. It is an explicit flag: an
	// all-zero IdemKey is a valid key.
	HasIdemKey bool
	IdemKey    eventid.Key
	Time       int64 // leader wall clock, unix nanos: the WAL clock
	Key        []byte
	Value      []byte
	Delta      int64
}

const (
	evFlagIdemKey = 1 << 0
	evFlagsKnown  = evFlagIdemKey

	// eventFixedSize is op(1) + flags(1) + session(16) + time(8).
	eventFixedSize = 1 + 1 + 16 + 8
	// minEventSize adds the smallest seq uvarint; it bounds Count by BodyLen.
	minEventSize = eventFixedSize + 1
)

// validate checks that e can be encoded canonically.
func (e *Event) validate() error {
	if !e.Op.Valid() {
		return fmt.Errorf("%w: %s", ErrInvalidEvent, e.Op)
	}
	switch e.Op {
	case OpOpen, OpClose:
		if len(e.Key) != 0 || len(e.Value) != 0 || e.Delta != 0 {
			return fmt.Errorf("%w: %s carries key/value/delta", ErrInvalidEvent, e.Op)
		}
	case OpPut:
		if e.Delta != 0 {
			return fmt.Errorf("%w: put carries delta", ErrInvalidEvent)
		}
	case OpDelete:
		if len(e.Value) != 0 || e.Delta != 0 {
			return fmt.Errorf("%w: delete carries value/delta", ErrInvalidEvent)
		}
	case OpAdd:
		if len(e.Value) != 0 {
			return fmt.Errorf("%w: add carries value", ErrInvalidEvent)
		}
	case OpKVPut:
		if len(e.Key) == 0 || e.Delta < 1 {
			return fmt.Errorf("%w: kvput needs a key and a version (delta) ≥ 1, has %d key bytes, delta %d",
				ErrInvalidEvent, len(e.Key), e.Delta)
		}
	case OpKVDelete:
		if len(e.Key) == 0 || len(e.Value) != 0 || e.Delta != 0 {
			return fmt.Errorf("%w: kvdelete needs a key and carries no value/delta", ErrInvalidEvent)
		}
	default: // ledger ops
		if len(e.Key) != 0 || e.Delta != 0 {
			return fmt.Errorf("%w: %s carries key/delta", ErrInvalidEvent, e.Op)
		}
		if err := ledgerrecord.Check(e.Op.RecordKind(), e.Value); err != nil {
			return fmt.Errorf("%w: %s: %w", ErrInvalidEvent, e.Op, err)
		}
	}
	if uint64(len(e.Key))+uint64(len(e.Value)) > MaxPayloadSize {
		return fmt.Errorf("%w: event payload %d bytes > %d", ErrTooLarge, len(e.Key)+len(e.Value), MaxPayloadSize)
	}
	return nil
}

// AppendOpBytes appends the canonical op bytes of e to dst: the op kind byte
// followed by the op's payload exactly as it is encoded in a batch (uvarint
// key length + key; put and kvput: uvarint value length + value; add:
// zigzag varint delta; kvput: uvarint version). A kvput's version is in its
// op bytes, so two puts of the same value at different versions — two
// requests — derive different keys. It is the op argument of idempotency.DeriveKey: the same operation
// always yields the same bytes, and different operations different bytes.
// It does not validate e.
func (e *Event) AppendOpBytes(dst []byte) []byte {
	dst = append(dst, byte(e.Op))
	return e.appendPayload(dst)
}

func (e *Event) appendPayload(dst []byte) []byte {
	switch e.Op {
	case OpPut:
		dst = binary.AppendUvarint(dst, uint64(len(e.Key)))
		dst = append(dst, e.Key...)
		dst = binary.AppendUvarint(dst, uint64(len(e.Value)))
		dst = append(dst, e.Value...)
	case OpDelete, OpKVDelete:
		dst = binary.AppendUvarint(dst, uint64(len(e.Key)))
		dst = append(dst, e.Key...)
	case OpAdd:
		dst = binary.AppendUvarint(dst, uint64(len(e.Key)))
		dst = append(dst, e.Key...)
		dst = binary.AppendVarint(dst, e.Delta)
	case OpKVPut:
		dst = binary.AppendUvarint(dst, uint64(len(e.Key)))
		dst = append(dst, e.Key...)
		dst = binary.AppendUvarint(dst, uint64(len(e.Value)))
		dst = append(dst, e.Value...)
		dst = binary.AppendUvarint(dst, uint64(e.Delta))
	case OpClaim, OpComplete, OpRelease, OpFail, OpExtend:
		dst = binary.AppendUvarint(dst, uint64(len(e.Value)))
		dst = append(dst, e.Value...)
	}
	return dst
}

// appendEvent encodes a validated event.
func appendEvent(dst []byte, e *Event) []byte {
	var flags byte
	if e.HasIdemKey {
		flags |= evFlagIdemKey
	}
	dst = append(dst, byte(e.Op), flags)
	dst = append(dst, e.Session[:]...)
	dst = binary.LittleEndian.AppendUint64(dst, uint64(e.Time))
	dst = binary.AppendUvarint(dst, uint64(e.Seq))
	if e.HasIdemKey {
		dst = append(dst, e.IdemKey[:]...)
	}
	return e.appendPayload(dst)
}

// uvarint decodes a minimal (canonical) uvarint. Overlong encodings and
// overflow are ErrCorrupt, running off the end is ErrTruncated, so each value
// has exactly one encoding.
func uvarint(b []byte) (uint64, int, error) {
	if len(b) > 0 && b[0] < 0x80 { // fast path: lengths < 128, small seqnos
		return uint64(b[0]), 1, nil
	}
	var x uint64
	var s uint
	for i := 0; i < len(b); i++ {
		c := b[i]
		if i == binary.MaxVarintLen64-1 && c > 1 {
			return 0, 0, fmt.Errorf("%w: varint overflows 64 bits", ErrCorrupt)
		}
		if c < 0x80 {
			if c == 0 && i > 0 {
				return 0, 0, fmt.Errorf("%w: non-minimal varint", ErrCorrupt)
			}
			return x | uint64(c)<<s, i + 1, nil
		}
		x |= uint64(c&0x7f) << s
		s += 7
	}
	return 0, 0, fmt.Errorf("%w: varint runs past end of body", ErrTruncated)
}

// bytesField decodes a uvarint length and that many bytes, aliasing b. budget
// is what remains of the event's MaxPayloadSize.
func bytesField(b []byte, budget uint64, what string) ([]byte, int, error) {
	n, w, err := uvarint(b)
	if err != nil {
		return nil, 0, fmt.Errorf("%s length: %w", what, err)
	}
	if n > budget {
		return nil, 0, corruption.Mark(fmt.Errorf("%w: %s length %d exceeds event payload limit", ErrTooLarge, what, n))
	}
	if n > uint64(len(b)-w) {
		return nil, 0, fmt.Errorf("%w: %s length %d, %d bytes left", ErrTruncated, what, n, len(b)-w)
	}
	end := w + int(n)
	if n == 0 {
		return nil, end, nil
	}
	return b[w:end:end], end, nil // cap limits appends by the caller to the field
}

// fieldAt is bytesField at b[off:], returning the offset past the field.
func fieldAt(b []byte, off int, budget uint64, what string) ([]byte, int, error) {
	f, w, err := bytesField(b[off:], budget, what)
	return f, off + w, err
}

// shortField is bytesField's common case, small enough to inline into
// decodeEvent (a call per field was a tenth of decoding a batch of puts):
// a one-byte length, within budget, whose bytes are all in b[off:]. It
// returns the field (nil if empty, as bytesField) and the offset past it,
// or next == off when the case does not apply: then bytesField decides,
// errors included.
func shortField(b []byte, off int, budget uint64) (field []byte, next int) {
	if off >= len(b) {
		return nil, off
	}
	n := int(b[off])
	if n >= 0x80 || uint64(n) > budget || n >= len(b)-off {
		return nil, off
	}
	next = off + 1 + n
	if n == 0 {
		return nil, next
	}
	return b[off+1 : next : next], next
}

// decodeEvent decodes one event from the front of b into e, with LSN lsn,
// and returns its encoded length. It writes every field of e, once (e may
// hold an earlier event: DecodeBatch reuses the caller's slice without
// zeroing it first, which cost as much as the decoding). Key and Value
// alias b. On error e is garbage.
func decodeEvent(b []byte, e *Event, lsn uint64) (int, error) {
	if len(b) < eventFixedSize {
		return 0, fmt.Errorf("%w: event header needs %d bytes, %d left", ErrTruncated, eventFixedSize, len(b))
	}
	op := Op(b[0])
	if !op.Valid() {
		return 0, fmt.Errorf("%w: unknown %s", ErrCorrupt, op)
	}
	flags := b[1]
	if flags&^evFlagsKnown != 0 {
		return 0, fmt.Errorf("%w: reserved event flags %#x", ErrCorrupt, flags)
	}
	off := eventFixedSize
	var seq uint64
	if off < len(b) && b[off] < 0x80 { // uvarint's one-byte case, inline
		seq = uint64(b[off])
		off++
	} else {
		var w int
		var err error
		if seq, w, err = uvarint(b[off:]); err != nil {
			return 0, fmt.Errorf("seq: %w", err)
		}
		off += w
	}
	e.LSN, e.Op, e.Seq = lsn, op, eventid.SeqNo(seq)
	e.Session = eventid.SessionID(b[2:18])
	e.Time = int64(binary.LittleEndian.Uint64(b[18:26]))
	e.HasIdemKey = flags&evFlagIdemKey != 0
	if e.HasIdemKey {
		if len(b)-off < len(e.IdemKey) {
			return 0, fmt.Errorf("%w: idempotency key", ErrTruncated)
		}
		e.IdemKey = eventid.Key(b[off : off+len(e.IdemKey)])
		off += len(e.IdemKey)
	} else {
		e.IdemKey = eventid.Key{}
	}
	var key, value []byte
	var delta int64
	var err error
	switch op {
	case OpPut, OpDelete, OpAdd, OpKVPut, OpKVDelete:
		budget := uint64(MaxPayloadSize)
		next := off
		if key, next = shortField(b, off, budget); next == off {
			if key, next, err = fieldAt(b, off, budget, "key"); err != nil {
				return 0, err
			}
		}
		off = next
		budget -= uint64(len(key))
		if len(key) == 0 && op.IsKV() {
			return 0, fmt.Errorf("%w: %s with an empty key", ErrCorrupt, op)
		}
		switch op {
		case OpPut, OpKVPut:
			if value, next = shortField(b, off, budget); next == off {
				if value, next, err = fieldAt(b, off, budget, "value"); err != nil {
					return 0, err
				}
			}
			off = next
			if op == OpKVPut {
				v, w, err := uvarint(b[off:])
				if err != nil {
					return 0, fmt.Errorf("version: %w", err)
				}
				if v < 1 || v > math.MaxInt64 {
					return 0, fmt.Errorf("%w: kvput version %d outside 1..2^63-1", ErrCorrupt, v)
				}
				delta = int64(v)
				off += w
			}
		case OpAdd:
			z, w, err := uvarint(b[off:])
			if err != nil {
				return 0, fmt.Errorf("delta: %w", err)
			}
			delta = int64(z>>1) ^ -int64(z&1) // zigzag, as binary.AppendVarint
			off += w
		}
	case OpClaim, OpComplete, OpRelease, OpFail, OpExtend:
		if value, off, err = fieldAt(b, off, MaxPayloadSize, "ledger record"); err != nil {
			return 0, err
		}
		if err := ledgerrecord.Check(op.RecordKind(), value); err != nil {
			return 0, fmt.Errorf("%w: %w", ErrCorrupt, err)
		}
	}
	e.Key, e.Value, e.Delta = key, value, delta
	return off, nil
}
