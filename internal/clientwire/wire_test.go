package clientwire

import (
	"bytes"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/oncewal/oncewal/idempotency"
)

type message interface {
	Marshal() []byte
	Unmarshal([]byte) error
}

// samples holds one message of each type with every field set, and one
// with every field zero, with a constructor for an empty one to decode into.
func samples() []struct {
	m     message
	empty func() message
} {
	id := SessionID{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
	return []struct {
		m     message
		empty func() message
	}{
		{&SubmitRequest{Session: id, RequestID: "req-42", Action: "POST /pay", Ack: AckMajority, Payload: []byte("30 to alice")}, func() message { return &SubmitRequest{} }},
		{&SubmitRequest{}, func() message { return &SubmitRequest{} }},
		{&SubmitReply{Code: Replay, LSN: 1 << 40, Epoch: 7, Outcome: []byte("paid"), Leader: "10.0.0.1:7000", Message: "replayed"}, func() message { return &SubmitReply{} }},
		{&SubmitReply{}, func() message { return &SubmitReply{} }},
		{&StatusRequest{Session: SessionID{7, 7, 7}, RequestID: "req-42"}, func() message { return &StatusRequest{} }},
		{&StatusReply{Code: Failed, Time: -5, Expires: 1 << 62, Epoch: 3, Outcome: []byte("no funds"), Leader: "l:1", Message: "m"}, func() message { return &StatusReply{} }},
		{&OpenSessionRequest{Near: id, HasNear: true}, func() message { return &OpenSessionRequest{} }},
		{&OpenSessionRequest{}, func() message { return &OpenSessionRequest{} }},
		{&OpenSessionReply{Code: OK, Session: id, Horizon: 24 * 3600e9, Epoch: 2, Leader: "x", Message: "y"}, func() message { return &OpenSessionReply{} }},
	}
}

func TestRoundTrip(t *testing.T) {
	for _, s := range samples() {
		b := s.m.Marshal()
		got := s.empty()
		if err := got.Unmarshal(b); err != nil {
			t.Fatalf("%T: %v", s.m, err)
		}
		if !reflect.DeepEqual(got, s.m) {
			t.Errorf("%T: round trip gave %+v, want %+v", s.m, got, s.m)
		}
		if !bytes.Equal(got.Marshal(), b) {
			t.Errorf("%T: re-encoding differs", s.m)
		}
	}
}

// TestMalformed: every proper prefix, a wrong version or type, and
// trailing bytes are refused with ErrMalformed (invariant 1).
func TestMalformed(t *testing.T) {
	for _, s := range samples() {
		b := s.m.Marshal()
		for n := range len(b) {
			if err := s.empty().Unmarshal(b[:n]); !errors.Is(err, ErrMalformed) {
				t.Errorf("%T cut to %d of %d bytes: %v", s.m, n, len(b), err)
			}
		}
		bad := func(what string, f func([]byte) []byte) {
			c := f(append([]byte(nil), b...))
			if err := s.empty().Unmarshal(c); !errors.Is(err, ErrMalformed) {
				t.Errorf("%T with %s: %v", s.m, what, err)
			}
		}
		bad("another version", func(c []byte) []byte { c[0] = Version + 1; return c })
		bad("another type", func(c []byte) []byte { c[1] ^= 0x40; return c })
		bad("a trailing byte", func(c []byte) []byte { return append(c, 0) })
	}
}

// TestLimits: a field over its limit is refused before it is allocated,
// and the limits are the ledger's (invariant 2).
func TestLimits(t *testing.T) {
	if MaxRequestID != idempotency.MaxRequestKeyLen || MaxAction != idempotency.MaxActionLen || MaxOutcome != idempotency.MaxOutcomeSize {
		t.Fatalf("limits %d/%d/%d differ from the ledger's %d/%d/%d", MaxRequestID, MaxAction, MaxOutcome,
			idempotency.MaxRequestKeyLen, idempotency.MaxActionLen, idempotency.MaxOutcomeSize)
	}
	long := (&SubmitRequest{RequestID: strings.Repeat("r", MaxRequestID+1)}).Marshal()
	if err := new(SubmitRequest).Unmarshal(long); !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), "request ID of 201 bytes") {
		t.Errorf("over-long request ID: %v", err)
	}
	// A length prefix claiming 2^62 bytes is refused without allocating.
	huge := append(append([]byte{Version, typeStatusRequest}, make([]byte, 16)...), 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x40)
	if err := new(StatusRequest).Unmarshal(huge); !errors.Is(err, ErrMalformed) {
		t.Errorf("huge length: %v", err)
	}
	if err := new(OpenSessionRequest).Unmarshal(append([]byte{Version, typeOpenSessionRequest, 0}, bytes.Repeat([]byte{1}, 16)...)); !errors.Is(err, ErrMalformed) {
		t.Errorf("near session without its flag: %v", err)
	}
}

func TestCodeNames(t *testing.T) {
	if Unknown.String() != "unknown" || Code(200).String() != "Code(200)" || NotLeader.String() != "not leader" {
		t.Errorf("names: %v %v %v", Unknown, Code(200), NotLeader)
	}
	// Ack names appear in replies' messages (a raised policy, an ack wait
	// that ended), where an operator reads them beside leader.AckPolicy's.
	if AckLeader.String() != "leader" || AckMajority.String() != "majority" || AckAll.String() != "all" || Ack(9).String() != "Ack(9)" {
		t.Errorf("ack names: %v %v %v %v", AckLeader, AckMajority, AckAll, Ack(9))
	}
}

// FuzzUnmarshal: no input panics, and whatever decodes re-encodes to the
// same bytes (one encoding per message).
func FuzzUnmarshal(f *testing.F) {
	for _, s := range samples() {
		f.Add(s.m.Marshal())
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, s := range samples() {
			m := s.empty()
			if m.Unmarshal(b) == nil && !bytes.Equal(m.Marshal(), b) {
				t.Fatalf("%T decodes %x but encodes %x", m, b, m.Marshal())
			}
		}
	})
}
