package grpctransport

import (
	"encoding/binary"
	"errors"
	"fmt"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"

	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/wal"
)

// Wire format. Every gRPC message on the stream is one frame: a type byte and
// a payload. No protobuf: the batch already is a self-checking wal encoding,
// and the control frames are little-endian records of fixed layout.
//
//	hello  (follower → leader, first message):
//	       0x01 | version u8 | shard u32 | epoch u64 | applied u64 |
//	       last batch epoch u64 | last batch header CRC u32 | id length u8 | follower ID
//	ack    (follower → leader, then):          0x02 | flags u8 | shard u32 | epoch u64 | applied u64
//	batch  (leader → follower):                0x03 | wal batch bytes (header + body, as wal.AppendBatch made them)
//	heartbeat (leader → follower):             0x04 | last LSN u64 | WAL time i64 (unix ns)
//	pong   (follower → leader, per heartbeat): 0x05
//
// Heartbeats and pongs are sent only on a stream whose follower asked for
// them in its request metadata (heartbeatKey) and whose leader answered
// with its interval in the response header (heartbeatIntervalKey). A peer
// of an earlier version neither asks nor answers, so it never sees a frame
// type it does not know: the hello stays at version 2 and each side of an
// upgrade works with the other.
//
// The hello is 35 bytes plus the follower ID (0..replication.MaxFollowerIDLen
// bytes of [A-Za-z0-9._-]); its length must match the ID length exactly.
// Ack flags: bit 0 = Refused; the other bits must be zero.
const (
	frameHello     byte = 0x01
	frameAck       byte = 0x02
	frameBatch     byte = 0x03
	frameHeartbeat byte = 0x04
	framePong      byte = 0x05

	heartbeatFrameSize = 1 + 8 + 8

	// heartbeatKey is the request metadata by which a follower asks for
	// heartbeats; heartbeatIntervalKey the response header by which the
	// leader promises them, with their interval (a Go duration string).
	heartbeatKey         = "oncewal-heartbeat"
	heartbeatIntervalKey = "oncewal-heartbeat-interval"

	// ProtocolVersion is carried in the hello; a leader refuses other values.
	// Version 2 added the follower ID and the last batch's identity.
	ProtocolVersion = 2

	controlFrameSize = 1 + 1 + 4 + 8 + 8
	helloFixedSize   = controlFrameSize + 8 + 4 + 1
	maxHelloSize     = helloFixedSize + replication.MaxFollowerIDLen

	// MaxBatchFrame is the largest frame the follower accepts: a type byte
	// and the largest batch wal can encode. gRPC rejects a longer message
	// before reading it into memory.
	MaxBatchFrame = 1 + wal.HeaderSize + wal.MaxBodySize
	// maxControlFrame bounds what the leader accepts from a follower: control
	// frames only, so a misbehaving peer cannot make it buffer megabytes.
	maxControlFrame = 256
)

// Errors of the wire protocol. A stream that carries a bad frame is ended;
// the errors returned for it wrap both ErrBadFrame and
// replication.ErrDisconnected, so callers simply reconnect.
var (
	// ErrBadFrame: the peer sent a frame that is not valid where it appeared
	// (unknown type, wrong length, batch header that does not decode, a
	// second hello, …).
	ErrBadFrame = errors.New("grpctransport: malformed frame")
	// ErrFrameTooLarge: a batch above MaxBatchFrame (sent or received).
	ErrFrameTooLarge = errors.New("grpctransport: frame too large")
	// ErrRefused is replication.ErrRefused: the leader refused the
	// follower's stream and said why (the error wraps the reason's
	// sentinel and replication.ErrDisconnected).
	ErrRefused = replication.ErrRefused
)

func appendControl(dst []byte, typ, b1 byte, a replication.Ack) []byte {
	dst = append(dst, typ, b1)
	dst = binary.LittleEndian.AppendUint32(dst, a.Shard)
	dst = binary.LittleEndian.AppendUint64(dst, a.Epoch)
	dst = binary.LittleEndian.AppendUint64(dst, a.AppliedLSN)
	return dst
}

// encodeHello encodes a's hello fields; Refused is not part of a hello.
func encodeHello(a replication.Ack) ([]byte, error) {
	if err := replication.ValidFollowerID(a.FollowerID); err != nil {
		return nil, err
	}
	b := appendControl(make([]byte, 0, helloFixedSize+len(a.FollowerID)), frameHello, ProtocolVersion, a)
	b = binary.LittleEndian.AppendUint64(b, a.LastBatch.Epoch)
	b = binary.LittleEndian.AppendUint32(b, a.LastBatch.CRC)
	b = append(b, byte(len(a.FollowerID)))
	return append(b, a.FollowerID...), nil
}

// encodeAck encodes a's ack fields; the hello-only fields are not sent.
func encodeAck(a replication.Ack) []byte {
	var flags byte
	if a.Refused {
		flags = 1
	}
	return appendControl(make([]byte, 0, controlFrameSize), frameAck, flags, a)
}

// decodeControl checks the type and reads the fields common to hello and
// ack; the caller checks the length.
func decodeControl(f []byte, want byte) (replication.Ack, byte, error) {
	if len(f) == 0 {
		return replication.Ack{}, 0, fmt.Errorf("%w: empty frame", ErrBadFrame)
	}
	if f[0] != want {
		return replication.Ack{}, 0, fmt.Errorf("%w: frame type %#x, want %#x", ErrBadFrame, f[0], want)
	}
	if len(f) < controlFrameSize {
		return replication.Ack{}, 0, fmt.Errorf("%w: control frame of %d bytes, want at least %d", ErrBadFrame, len(f), controlFrameSize)
	}
	return replication.Ack{
		Shard:      binary.LittleEndian.Uint32(f[2:]),
		Epoch:      binary.LittleEndian.Uint64(f[6:]),
		AppliedLSN: binary.LittleEndian.Uint64(f[14:]),
	}, f[1], nil
}

func decodeHello(f []byte) (replication.Ack, error) {
	if len(f) >= 2 && f[0] == frameHello && f[1] != ProtocolVersion {
		// The version decides the layout: check it before any length.
		return replication.Ack{}, fmt.Errorf("%w: hello for protocol version %d, this leader speaks %d", ErrBadFrame, f[1], ProtocolVersion)
	}
	a, _, err := decodeControl(f, frameHello)
	if err != nil {
		return replication.Ack{}, err
	}
	if len(f) < helloFixedSize || len(f) != helloFixedSize+int(f[helloFixedSize-1]) {
		return replication.Ack{}, fmt.Errorf("%w: hello of %d bytes does not match its layout", ErrBadFrame, len(f))
	}
	a.LastBatch.Epoch = binary.LittleEndian.Uint64(f[controlFrameSize:])
	a.LastBatch.CRC = binary.LittleEndian.Uint32(f[controlFrameSize+8:])
	id := f[helloFixedSize:]
	if len(id) == 0 {
		return a, nil
	}
	a.FollowerID = string(id)
	if err := replication.ValidFollowerID(a.FollowerID); err != nil {
		return replication.Ack{}, fmt.Errorf("%w: hello: %w", ErrBadFrame, err)
	}
	return a, nil
}

func decodeAck(f []byte) (replication.Ack, error) {
	a, flags, err := decodeControl(f, frameAck)
	if err != nil {
		return a, err
	}
	if len(f) != controlFrameSize {
		return replication.Ack{}, fmt.Errorf("%w: ack of %d bytes, want %d", ErrBadFrame, len(f), controlFrameSize)
	}
	if flags&^1 != 0 {
		return replication.Ack{}, fmt.Errorf("%w: unknown ack flags %#x", ErrBadFrame, flags)
	}
	a.Refused = flags&1 != 0
	return a, nil
}

func encodeHeartbeat(hb replication.Heartbeat) []byte {
	b := make([]byte, 0, heartbeatFrameSize)
	b = append(b, frameHeartbeat)
	b = binary.LittleEndian.AppendUint64(b, hb.LastLSN)
	return binary.LittleEndian.AppendUint64(b, uint64(hb.WALTime))
}

func decodeHeartbeat(f []byte) (replication.Heartbeat, error) {
	if len(f) != heartbeatFrameSize || f[0] != frameHeartbeat {
		return replication.Heartbeat{}, fmt.Errorf("%w: heartbeat of %d bytes, want %d", ErrBadFrame, len(f), heartbeatFrameSize)
	}
	return replication.Heartbeat{LastLSN: binary.LittleEndian.Uint64(f[1:]), WALTime: int64(binary.LittleEndian.Uint64(f[9:]))}, nil
}

// decodeBatchFrame checks a batch frame's type, header and length and returns
// the batch bytes (a subslice of f). The body checksum is the receiver's to
// verify: a corrupt body is refused there, with an ack, like any bad batch.
func decodeBatchFrame(f []byte) ([]byte, error) {
	if len(f) == 0 {
		return nil, fmt.Errorf("%w: empty frame", ErrBadFrame)
	}
	if f[0] != frameBatch {
		return nil, fmt.Errorf("%w: frame type %#x, want batch", ErrBadFrame, f[0])
	}
	if len(f) > MaxBatchFrame {
		return nil, fmt.Errorf("%w: %d bytes > %d", ErrFrameTooLarge, len(f), MaxBatchFrame)
	}
	b := f[1:]
	h, err := wal.DecodeHeader(b)
	if err != nil {
		return nil, fmt.Errorf("%w: batch header: %w", ErrBadFrame, err)
	}
	if h.Size() != len(b) {
		return nil, fmt.Errorf("%w: batch header says %d bytes, frame carries %d", ErrBadFrame, h.Size(), len(b))
	}
	return b, nil
}

// rawCodec moves frames as they are. It is forced on the replication
// stream's and the snapshot service's clients and, inside serverCodec, on
// every server (never registered globally), so it cannot affect other gRPC
// services in the process.
type rawCodec struct{}

// codecName is the content-subtype on the wire ("application/grpc+oncewal-raw").
const codecName = "oncewal-raw"

// frame is the message type of every SendMsg and RecvMsg of this package.
type frame struct{ b []byte }

func (rawCodec) Name() string { return codecName }

// Marshal hands the frame's bytes to gRPC without copying: every frame is a
// fresh slice that nobody touches after SendMsg.
func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	f, ok := v.(*frame)
	if !ok {
		return nil, fmt.Errorf("grpctransport: cannot marshal %T", v)
	}
	return mem.BufferSlice{mem.SliceBuffer(f.b)}, nil
}

// Unmarshal copies out of gRPC's pooled buffers (freed when it returns) into
// one slice that then belongs to the receiver of the frame.
func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	f, ok := v.(*frame)
	if !ok {
		return fmt.Errorf("grpctransport: cannot unmarshal into %T", v)
	}
	f.b = data.Materialize()
	return nil
}

// serverCodec is the codec a Server forces: frames (the replication stream
// and the snapshot service) move raw, and every other message — a
// Service's, generated by protoc-gen-go — with gRPC's standard protobuf
// codec. A server has one forced codec, and the message type, not the
// caller's content-subtype, decides which of the two applies, so a
// standard client of a Service needs no codec of ours.
type serverCodec struct{}

func (serverCodec) Name() string { return codecName }

func (serverCodec) Marshal(v any) (mem.BufferSlice, error) {
	if _, ok := v.(*frame); ok {
		return rawCodec{}.Marshal(v)
	}
	return protoCodec().Marshal(v)
}

func (serverCodec) Unmarshal(data mem.BufferSlice, v any) error {
	if _, ok := v.(*frame); ok {
		return rawCodec{}.Unmarshal(data, v)
	}
	return protoCodec().Unmarshal(data, v)
}

// protoCodec is gRPC's standard codec (registered by package
// google.golang.org/grpc/encoding/proto, which grpc imports).
func protoCodec() encoding.CodecV2 { return encoding.GetCodecV2(proto.Name) }
