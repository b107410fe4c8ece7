package clientapi

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/oncewal/oncewal/idempotency"
	"github.com/oncewal/oncewal/kv"
	"github.com/oncewal/oncewal/leader"
	clientv1 "github.com/oncewal/oncewal/proto/oncewal/client/v1"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/store"
	"github.com/oncewal/oncewal/wal"
)

// TestDecide: the reply code of every way a claim, handler or commit ends,
// as the errors arrive (wrapped).
func TestDecide(t *testing.T) {
	wrap := func(err error) error { return fmt.Errorf("shard 2: %w", err) }
	for _, tc := range []struct {
		err  error
		want clientv1.Code
	}{
		{&idempotency.ConflictError{Scope: "a", Key: "k"}, clientv1.Code_CONFLICT},
		{wrap(leader.ErrSessionExpired), clientv1.Code_SESSION_EXPIRED},
		{wrap(session.ErrSessionClosed), clientv1.Code_SESSION_EXPIRED},
		{fmt.Errorf("%w: boom", errRefused), clientv1.Code_REFUSED},
		{idempotency.ErrInvalidKey, clientv1.Code_REFUSED},
		{idempotency.ErrOutcomeTooLarge, clientv1.Code_REFUSED},
		{wrap(leader.ErrBadEvent), clientv1.Code_REFUSED},
		{wrap(leader.ErrCrossShard), clientv1.Code_REFUSED},
		{wrap(wal.ErrInvalidEvent), clientv1.Code_REFUSED},
		{wrap(wal.ErrTooLarge), clientv1.Code_REFUSED},
		{wrap(store.ErrRejected), clientv1.Code_REFUSED},
		{wrap(store.ErrDiskFull), clientv1.Code_UNAVAILABLE},
		{fmt.Errorf("%w: %w", leader.ErrLogFailed, store.ErrApply), clientv1.Code_UNAVAILABLE},
		{leader.ErrClosed, clientv1.Code_UNAVAILABLE},
		{idempotency.ErrClosed, clientv1.Code_UNAVAILABLE},
		{idempotency.ErrStoreUnavailable, clientv1.Code_UNAVAILABLE},
		{idempotency.ErrNotOwner, clientv1.Code_UNAVAILABLE},
		{fmt.Errorf("idempotency: waiting: %w", context.DeadlineExceeded), clientv1.Code_UNAVAILABLE},
		{errors.New("something new"), clientv1.Code_UNAVAILABLE},
	} {
		if got := Decide(tc.err); got != tc.want {
			t.Errorf("Decide(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// TestWireEnumsAreKV: txnOf converts the wire's enums to package kv's by
// number; each number names the same thing on both sides.
func TestWireEnumsAreKV(t *testing.T) {
	for _, tc := range []struct{ wire, kv string }{
		{clientv1.TxnOp_PUT.String(), kv.Put.String()}, {clientv1.TxnOp_DELETE.String(), kv.Delete.String()},
		{clientv1.TxnOp_ADD.String(), kv.Add.String()}, {clientv1.TxnOp_GET.String(), kv.Get.String()},
		{clientv1.TxnOp_Kind(kv.Put).String(), "PUT"}, {clientv1.TxnOp_Kind(kv.Get).String(), "GET"},
		{clientv1.Compare_Target(kv.TargetValue).String(), "VALUE"}, {clientv1.Compare_Target(kv.TargetVersion).String(), "VERSION"},
		{clientv1.Compare_Target(kv.TargetModLSN).String(), "MOD_LSN"}, {clientv1.Compare_Target(kv.TargetExists).String(), "EXISTS"},
		{clientv1.Compare_Target(kv.TargetCounter).String(), "COUNTER"},
		{clientv1.Compare_Result(kv.Equal).String(), "EQUAL"}, {clientv1.Compare_Result(kv.NotEqual).String(), "NOT_EQUAL"},
		{clientv1.Compare_Result(kv.Less).String(), "LESS"}, {clientv1.Compare_Result(kv.Greater).String(), "GREATER"},
	} {
		if !strings.EqualFold(tc.wire, tc.kv) {
			t.Errorf("wire %s is kv %s", tc.wire, tc.kv)
		}
	}
	if enum(clientv1.TxnOp_Kind(257)) != 0 || enum(clientv1.TxnOp_Kind(-1)) != 0 {
		t.Error("an enum number out of kv's range must not wrap onto a valid kind")
	}
}
