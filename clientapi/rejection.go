package clientapi

import (
	"bytes"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/protobuf/proto"

	"github.com/oncewal/oncewal/kv"
	clientv1 "github.com/oncewal/oncewal/proto/oncewal/client/v1"
)

// RejectedError is a business rule's refusal of a request: Code for a
// program to branch on ("insufficient_funds"), Detail for a person. A
// Handler returns it (wrapped or not), and so may an Applier's Validate
// (its reason reaches the service wrapped in store.ErrRejected). The
// service records it under the request ID, as final as an outcome: the
// reply is REJECTED with the rejection, a retry with the same ID answers
// the same rejection without running anything, and Status says REJECTED.
// Transient asks for the old way instead: the request is refused, nothing
// is recorded, and a retry runs again (a precondition that may pass
// later). A Validator's or Handler's error that is no RejectedError is a
// transient refusal too (REFUSED with its text).
type RejectedError struct {
	Code      string
	Detail    string
	Transient bool
}

// Rejection limits: a code is a short identifier, a detail a sentence.
const (
	MaxRejectionCode   = 64
	MaxRejectionDetail = 1024
)

func (e *RejectedError) Error() string {
	return fmt.Sprintf("rejected (%s): %s", e.Code, e.Detail)
}

// rejectionOf is the rejection to record for a commit's error, if it is
// one: a RejectedError that is not Transient.
func rejectionOf(err error) (*clientv1.Rejection, bool) {
	var re *RejectedError
	if !errors.As(err, &re) || re.Transient {
		return nil, false
	}
	code := re.Code
	if code == "" {
		code = "rejected"
	}
	return &clientv1.Rejection{Code: cut(code, MaxRejectionCode), Detail: cut(re.Detail, MaxRejectionDetail)}, true
}

// kvRejection is the rejection of a transaction the key space refused for
// what the state holds (a counter that is not one, an overflow, a result
// too large): a retry would meet it again, so it is recorded as the
// request's answer. Other errors are not rejections.
func kvRejection(err error) error {
	for _, r := range []struct {
		err  error
		code string
	}{{kv.ErrNotCounter, "not_counter"}, {kv.ErrOverflow, "overflow"}, {kv.ErrResultTooLarge, "result_too_large"}} {
		if errors.Is(err, r.err) {
			return &RejectedError{Code: r.code, Detail: err.Error()}
		}
	}
	return err
}

// cut makes s fit a proto string of at most n bytes: valid UTF-8 (proto3
// refuses to marshal anything else), cut at n.
func cut(s string, n int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if len(s) > n {
		s = strings.ToValidUTF8(s[:n], "")
	}
	return s
}

// rejectionMark starts the recorded outcome of a rejection (a ledger
// failure this service wrote), telling it from another failure an
// embedder recorded on the same ledger, whose outcome is its own.
const rejectionMark = "\x00oncewal.client.v1.Rejection\x00"

func encodeRejection(r *clientv1.Rejection) []byte {
	// Strings pass through cut (valid UTF-8), so Marshal cannot fail.
	b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(r)
	return append([]byte(rejectionMark), b...)
}

// decodeRejection reads a recorded failure outcome as a rejection, if this
// service recorded it.
func decodeRejection(outcome []byte) (*clientv1.Rejection, bool) {
	b, ok := bytes.CutPrefix(outcome, []byte(rejectionMark))
	if !ok {
		return nil, false
	}
	var r clientv1.Rejection
	if err := proto.Unmarshal(b, &r); err != nil {
		return nil, false
	}
	return &r, true
}
