package clientwire

import (
	"encoding/binary"
	"fmt"
)

// OpKind is what one operation of the default payload does to the
// session's state: the session ops of package wal (OpPut 2, OpDelete 3,
// OpAdd 4), same numbers.
type OpKind uint8

// Operation kinds of the default payload.
const (
	OpPut    OpKind = 2 // Key := Value
	OpDelete OpKind = 3 // delete Key
	OpAdd    OpKind = 4 // Key += Delta
)

// MaxOps bounds the operations of one payload.
const MaxOps = 1 << 12

// Op is one operation of the default payload, which a node without a
// handler of its own maps to one event each, in order, in the request's
// session.
type Op struct {
	Kind  OpKind
	Key   []byte
	Value []byte // OpPut only
	Delta int64  // OpAdd only
}

// AppendOps appends the default payload of ops to dst: a frame of its own
// (Version, type 0x10, a count, then per op its kind, its key and its value
// or delta), so that a payload is never mistaken for another message.
func AppendOps(dst []byte, ops []Op) []byte {
	dst = append(dst, Version, typeOps)
	dst = binary.AppendUvarint(dst, uint64(len(ops)))
	for _, op := range ops {
		dst = append(dst, uint8(op.Kind))
		dst = binary.AppendUvarint(dst, uint64(len(op.Key)))
		dst = append(dst, op.Key...)
		switch op.Kind {
		case OpPut:
			dst = binary.AppendUvarint(dst, uint64(len(op.Value)))
			dst = append(dst, op.Value...)
		case OpAdd:
			dst = binary.AppendVarint(dst, op.Delta)
		}
	}
	return dst
}

// typeOps is the type byte of a default payload.
const typeOps = 0x10

// DecodeOps decodes a default payload. A payload that does not decode, an
// unknown kind, an empty key, a value or delta on an op that takes none,
// and more than MaxOps ops are errors wrapping ErrMalformed.
func DecodeOps(b []byte) ([]Op, error) {
	d := newDecoder(b, typeOps)
	n, k := binary.Uvarint(d.b)
	switch {
	case d.err != nil:
		return nil, d.err
	case k <= 0 || k != uvarintLen(n):
		d.fail("op count: bad length")
	case n == 0 || n > MaxOps:
		d.fail("%d ops, want 1 to %d", n, MaxOps)
	default:
		d.b = d.b[k:]
	}
	var ops []Op
	for i := uint64(0); d.err == nil && i < n; i++ {
		op := Op{Kind: OpKind(d.u8())}
		op.Key = d.bytes("key", MaxPayload)
		switch op.Kind {
		case OpPut:
			op.Value = d.bytes("value", MaxPayload)
		case OpAdd:
			op.Delta = d.varint()
		case OpDelete:
		default:
			d.fail("op %d: unknown kind %d", i, op.Kind)
		}
		if d.err == nil && len(op.Key) == 0 {
			d.fail("op %d: empty key", i)
		}
		ops = append(ops, op)
	}
	if err := d.done(); err != nil {
		return nil, err
	}
	return ops, nil
}

func (d *decoder) varint() int64 {
	v, k := binary.Varint(d.b)
	if k <= 0 || k != len(binary.AppendVarint(nil, v)) {
		d.fail("delta: bad varint")
		return 0
	}
	d.b = d.b[k:]
	return v
}

func (k OpKind) String() string {
	switch k {
	case OpPut:
		return "put"
	case OpDelete:
		return "delete"
	case OpAdd:
		return "add"
	}
	return fmt.Sprintf("OpKind(%d)", uint8(k))
}
