package clientapi

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/oncewal/oncewal/idempotency"
	"github.com/oncewal/oncewal/internal/clientwire"
	"github.com/oncewal/oncewal/leader"
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
		want clientwire.Code
	}{
		{&idempotency.ConflictError{Scope: "a", Key: "k"}, clientwire.Conflict},
		{wrap(leader.ErrSessionExpired), clientwire.SessionExpired},
		{wrap(session.ErrSessionClosed), clientwire.SessionExpired},
		{fmt.Errorf("%w: boom", errRefused), clientwire.Refused},
		{idempotency.ErrInvalidKey, clientwire.Refused},
		{idempotency.ErrOutcomeTooLarge, clientwire.Refused},
		{wrap(leader.ErrBadEvent), clientwire.Refused},
		{wrap(leader.ErrCrossShard), clientwire.Refused},
		{wrap(wal.ErrInvalidEvent), clientwire.Refused},
		{wrap(wal.ErrTooLarge), clientwire.Refused},
		{wrap(store.ErrRejected), clientwire.Refused},
		{wrap(store.ErrDiskFull), clientwire.Unavailable},
		{fmt.Errorf("%w: %w", leader.ErrLogFailed, store.ErrApply), clientwire.Unavailable},
		{leader.ErrClosed, clientwire.Unavailable},
		{idempotency.ErrClosed, clientwire.Unavailable},
		{idempotency.ErrStoreUnavailable, clientwire.Unavailable},
		{idempotency.ErrNotOwner, clientwire.Unavailable},
		{fmt.Errorf("idempotency: waiting: %w", context.DeadlineExceeded), clientwire.Unavailable},
		{errors.New("something new"), clientwire.Unavailable},
	} {
		if got := Decide(tc.err); got != tc.want {
			t.Errorf("Decide(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
