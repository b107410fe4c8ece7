package clientwire

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// The service and its methods' full names.
const (
	Service           = "oncewal.client.v1.Client"
	SubmitMethod      = "/" + Service + "/Submit"
	StatusMethod      = "/" + Service + "/Status"
	OpenSessionMethod = "/" + Service + "/OpenSession"
)

// Version is the protocol version every frame starts with.
const Version = 1

// Limits (invariant 2).
const (
	MaxRequestID = 200     // idempotency.MaxRequestKeyLen
	MaxAction    = 200     // idempotency.MaxActionLen
	MaxOutcome   = 1 << 20 // idempotency.MaxOutcomeSize
	MaxPayload   = 1 << 20 // what a handler is given; its events must fit a WAL batch
	MaxMessage   = 1 << 12 // a reply's human-readable text
	MaxAddress   = 1 << 10 // a leader's address
	// MaxFrame bounds every frame: the largest reply (an outcome and a
	// message) with room for the fixed fields.
	MaxFrame = MaxOutcome + MaxPayload + MaxMessage + MaxAddress + 1<<10
)

// ErrMalformed: a frame that does not decode (invariant 1).
var ErrMalformed = errors.New("clientwire: malformed frame")

// Message types, the second byte of every frame.
const (
	typeSubmitRequest      = 1
	typeSubmitReply        = 2
	typeStatusRequest      = 3
	typeStatusReply        = 4
	typeOpenSessionRequest = 5
	typeOpenSessionReply   = 6
)

// Ack is the ack policy a Submit waits for before it answers: the numbers
// of leader.AckPolicy, and AckLeader (0) for "durable in the leader's WAL".
type Ack uint8

// Ack policies.
const (
	AckLeader   Ack = 0
	AckOne      Ack = 1
	AckMajority Ack = 2
	AckAll      Ack = 3
)

var ackNames = [...]string{"leader", "one", "majority", "all"}

func (a Ack) String() string {
	if int(a) < len(ackNames) {
		return ackNames[a]
	}
	return fmt.Sprintf("Ack(%d)", uint8(a))
}

// Code is what a reply says happened (invariant 4: append-only).
type Code uint8

// Codes.
const (
	// OK: Submit executed the request now; OpenSession opened the session.
	OK Code = 0
	// Replay: the request ID was already completed with the same payload;
	// the reply carries the recorded outcome, durable under the ack policy.
	Replay Code = 1
	// Conflict: the request ID was used with another payload. Nothing ran.
	Conflict Code = 2
	// NotLeader: this node does not lead; Leader and Epoch say who does, if
	// the node knows. Nothing ran.
	NotLeader Code = 3
	// SessionExpired: the session can no longer log (idle past the
	// horizon, or closed); open a new one (OpenSession with Near) and retry
	// with the same request ID. Nothing was claimed.
	SessionExpired Code = 4
	// InFlight: another attempt of the same request ID is running; retry
	// with the same ID later.
	InFlight Code = 5
	// Refused: the request is invalid or the node's handler or store
	// refused it (the message says why); retrying the same request will not
	// help. Nothing ran.
	Refused Code = 6
	// Unavailable: the node cannot serve now (shutting down, its log failed,
	// its disk is full); retry, possibly elsewhere. For a Submit whose
	// request may have run (the ack wait ended), the outcome is unknown:
	// retry with the same request ID.
	Unavailable Code = 7
	// Failed: Status only; the request ran and recorded a failure outcome.
	Failed Code = 8
	// Unknown: Status only; the ledger holds nothing for the ID (never seen,
	// or past its replay window).
	Unknown Code = 9
)

var codeNames = [...]string{"ok", "replay", "conflict", "not leader", "session expired", "in flight", "refused", "unavailable", "failed", "unknown"}

func (c Code) String() string {
	if int(c) < len(codeNames) {
		return codeNames[c]
	}
	return fmt.Sprintf("Code(%d)", uint8(c))
}

// SessionID is a session's 16-byte ID (session.ID on the node).
type SessionID = [16]byte

// SubmitRequest asks the node to run one request once.
type SubmitRequest struct {
	Session   SessionID
	RequestID string
	Action    string
	Ack       Ack
	Payload   []byte
}

// SubmitReply is the answer to a SubmitRequest. It has no field for the
// ack policy it was answered under, which a node may raise above the
// request's (clientapi.Options.MinAck): a decoder refuses trailing bytes
// (invariant 1), so a new field would make every deployed client refuse
// every reply of an upgraded node. A node that raised the policy says so
// in Message, which an OK or Replay does not otherwise use.
type SubmitReply struct {
	Code    Code
	LSN     uint64 // the batch that logged the answer (Replay: the log's end when the retry came, which covers it)
	Epoch   uint64
	Outcome []byte
	Leader  string // NotLeader: the leader's address, if known
	Message string
}

// StatusRequest asks what the ledger knows of a request ID. The ledger is
// per shard and a request's shard is its session's, so Session names the
// session the request was submitted in (or any session of that shard).
type StatusRequest struct {
	Session   SessionID
	RequestID string
}

// StatusReply: Code is Replay (completed; Outcome), Failed (Outcome),
// InFlight, Unknown, NotLeader or Unavailable.
type StatusReply struct {
	Code    Code
	Time    int64 // WAL time of the entry's last decision
	Expires int64 // WAL time at which the entry leaves the ledger
	Epoch   uint64
	Outcome []byte
	Leader  string
	Message string
}

// OpenSessionRequest asks for a new session, in Near's shard if HasNear.
type OpenSessionRequest struct {
	Near    SessionID
	HasNear bool
}

// OpenSessionReply carries the new session and the horizon (nanoseconds)
// after which an idle session expires.
type OpenSessionReply struct {
	Code    Code
	Session SessionID
	Horizon int64
	Epoch   uint64
	Leader  string
	Message string
}

// encoder appends fields to a frame.
type encoder struct{ b []byte }

func newEncoder(typ byte, size int) *encoder {
	e := &encoder{b: make([]byte, 0, 2+size)}
	e.b = append(e.b, Version, typ)
	return e
}

func (e *encoder) u8(v uint8)   { e.b = append(e.b, v) }
func (e *encoder) u64(v uint64) { e.b = binary.LittleEndian.AppendUint64(e.b, v) }
func (e *encoder) bytes(v []byte) {
	e.b = binary.AppendUvarint(e.b, uint64(len(v)))
	e.b = append(e.b, v...)
}
func (e *encoder) str(v string) { e.bytes([]byte(v)) }

// decoder reads fields of a frame; the first error sticks.
type decoder struct {
	b   []byte
	err error
}

func newDecoder(b []byte, typ byte) *decoder {
	d := &decoder{b: b}
	switch {
	case len(b) > MaxFrame:
		d.fail("frame of %d bytes, limit %d", len(b), MaxFrame)
	case len(b) < 2:
		d.fail("frame of %d bytes", len(b))
	case b[0] != Version:
		d.fail("protocol version %d, want %d", b[0], Version)
	case b[1] != typ:
		d.fail("message type %d, want %d", b[1], typ)
	default:
		d.b = b[2:]
	}
	return d
}

func (d *decoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: %s", ErrMalformed, fmt.Sprintf(format, args...))
	}
	d.b = nil
}

func (d *decoder) u8() uint8 {
	if len(d.b) < 1 {
		d.fail("truncated")
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

func (d *decoder) u64() uint64 {
	if len(d.b) < 8 {
		d.fail("truncated")
		return 0
	}
	v := binary.LittleEndian.Uint64(d.b)
	d.b = d.b[8:]
	return v
}

func (d *decoder) id() (id SessionID) {
	if len(d.b) < len(id) {
		d.fail("truncated")
		return id
	}
	copy(id[:], d.b)
	d.b = d.b[len(id):]
	return id
}

// bytes reads a length-prefixed field of at most limit bytes, copied out
// of the frame (nil when empty).
func (d *decoder) bytes(what string, limit int) []byte {
	n, k := binary.Uvarint(d.b)
	switch {
	case k <= 0:
		d.fail("%s: bad length", what)
		return nil
	case k != uvarintLen(n):
		d.fail("%s: length not in its shortest encoding", what)
		return nil
	case n > uint64(limit):
		d.fail("%s of %d bytes, limit %d", what, n, limit)
		return nil
	case n > uint64(len(d.b)-k):
		d.fail("%s: truncated", what)
		return nil
	}
	v := d.b[k : k+int(n)]
	d.b = d.b[k+int(n):]
	if n == 0 {
		return nil
	}
	return append([]byte(nil), v...)
}

// uvarintLen is the size of n's shortest encoding, the only one a decoder
// accepts: one encoding per message.
func uvarintLen(n uint64) int {
	k := 1
	for ; n >= 0x80; n >>= 7 {
		k++
	}
	return k
}

func (d *decoder) str(what string, limit int) string { return string(d.bytes(what, limit)) }

func (d *decoder) done() error {
	if d.err == nil && len(d.b) > 0 {
		d.fail("%d trailing bytes", len(d.b))
	}
	return d.err
}

// Marshal encodes m as one frame; Unmarshal decodes one frame into m or
// returns an error wrapping ErrMalformed (the same for every message).
func (m *SubmitRequest) Marshal() []byte {
	e := newEncoder(typeSubmitRequest, 16+1+len(m.RequestID)+len(m.Action)+len(m.Payload)+16)
	e.b = append(e.b, m.Session[:]...)
	e.u8(uint8(m.Ack))
	e.str(m.RequestID)
	e.str(m.Action)
	e.bytes(m.Payload)
	return e.b
}

func (m *SubmitRequest) Unmarshal(b []byte) error {
	d := newDecoder(b, typeSubmitRequest)
	m.Session = d.id()
	m.Ack = Ack(d.u8())
	m.RequestID = d.str("request ID", MaxRequestID)
	m.Action = d.str("action", MaxAction)
	m.Payload = d.bytes("payload", MaxPayload)
	return d.done()
}

func (m *SubmitReply) Marshal() []byte {
	e := newEncoder(typeSubmitReply, 1+16+len(m.Outcome)+len(m.Leader)+len(m.Message)+12)
	e.u8(uint8(m.Code))
	e.u64(m.LSN)
	e.u64(m.Epoch)
	e.bytes(m.Outcome)
	e.str(m.Leader)
	e.str(m.Message)
	return e.b
}

func (m *SubmitReply) Unmarshal(b []byte) error {
	d := newDecoder(b, typeSubmitReply)
	m.Code = Code(d.u8())
	m.LSN = d.u64()
	m.Epoch = d.u64()
	m.Outcome = d.bytes("outcome", MaxOutcome)
	m.Leader = d.str("leader", MaxAddress)
	m.Message = d.str("message", MaxMessage)
	return d.done()
}

func (m *StatusRequest) Marshal() []byte {
	e := newEncoder(typeStatusRequest, 16+len(m.RequestID)+4)
	e.b = append(e.b, m.Session[:]...)
	e.str(m.RequestID)
	return e.b
}

func (m *StatusRequest) Unmarshal(b []byte) error {
	d := newDecoder(b, typeStatusRequest)
	m.Session = d.id()
	m.RequestID = d.str("request ID", MaxRequestID)
	return d.done()
}

func (m *StatusReply) Marshal() []byte {
	e := newEncoder(typeStatusReply, 1+24+len(m.Outcome)+len(m.Leader)+len(m.Message)+12)
	e.u8(uint8(m.Code))
	e.u64(uint64(m.Time))
	e.u64(uint64(m.Expires))
	e.u64(m.Epoch)
	e.bytes(m.Outcome)
	e.str(m.Leader)
	e.str(m.Message)
	return e.b
}

func (m *StatusReply) Unmarshal(b []byte) error {
	d := newDecoder(b, typeStatusReply)
	m.Code = Code(d.u8())
	m.Time = int64(d.u64())
	m.Expires = int64(d.u64())
	m.Epoch = d.u64()
	m.Outcome = d.bytes("outcome", MaxOutcome)
	m.Leader = d.str("leader", MaxAddress)
	m.Message = d.str("message", MaxMessage)
	return d.done()
}

func (m *OpenSessionRequest) Marshal() []byte {
	e := newEncoder(typeOpenSessionRequest, 17)
	var has uint8
	if m.HasNear {
		has = 1
	}
	e.u8(has)
	e.b = append(e.b, m.Near[:]...)
	return e.b
}

func (m *OpenSessionRequest) Unmarshal(b []byte) error {
	d := newDecoder(b, typeOpenSessionRequest)
	switch d.u8() {
	case 0:
	case 1:
		m.HasNear = true
	default:
		d.fail("near flag not 0 or 1")
	}
	m.Near = d.id()
	if !m.HasNear && m.Near != (SessionID{}) {
		d.fail("near session without its flag")
	}
	return d.done()
}

func (m *OpenSessionReply) Marshal() []byte {
	e := newEncoder(typeOpenSessionReply, 1+16+16+len(m.Leader)+len(m.Message)+8)
	e.u8(uint8(m.Code))
	e.b = append(e.b, m.Session[:]...)
	e.u64(uint64(m.Horizon))
	e.u64(m.Epoch)
	e.str(m.Leader)
	e.str(m.Message)
	return e.b
}

func (m *OpenSessionReply) Unmarshal(b []byte) error {
	d := newDecoder(b, typeOpenSessionReply)
	m.Code = Code(d.u8())
	m.Session = d.id()
	m.Horizon = int64(d.u64())
	m.Epoch = d.u64()
	m.Leader = d.str("leader", MaxAddress)
	m.Message = d.str("message", MaxMessage)
	return d.done()
}
