package clientapi

import (
	"errors"

	"github.com/oncewal/oncewal/idempotency"
	"github.com/oncewal/oncewal/leader"
	clientv1 "github.com/oncewal/oncewal/proto/oncewal/client/v1"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/store"
	"github.com/oncewal/oncewal/wal"
)

// errRefused marks a request the service refuses itself: its handler's
// refusal, events the request may not log, an unknown ack policy.
var errRefused = errors.New("clientapi: request refused")

// Decide is the reply code of a Submit whose claim, handler or commit
// ended with err (never nil): what the caller should do next.
//
//   - Conflict: the ID was used with another payload (idempotency.ErrConflict).
//   - SessionExpired: the session can no longer log; open one with Near
//     and retry with the same ID.
//   - Refused: the request itself is unusable — an invalid ID, a handler's
//     refusal, events the log refuses or a validating Applier rejects, an
//     outcome over the ledger's limit: the same request would fail again.
//   - Unavailable, everything else: the node cannot serve it now — disk
//     full, log failed, closed, the ledger's store failing, a claim wait or
//     a lease that ended. A retry with the same ID is always safe (the
//     ledger answers it) and may succeed here or at another node.
func Decide(err error) clientv1.Code {
	switch {
	case errors.Is(err, idempotency.ErrConflict):
		return clientv1.Code_CONFLICT
	case errors.Is(err, errWrongShard):
		return clientv1.Code_WRONG_SHARD
	case errors.Is(err, leader.ErrSessionExpired), errors.Is(err, session.ErrSessionClosed):
		return clientv1.Code_SESSION_EXPIRED
	case errors.Is(err, errRefused), errors.Is(err, idempotency.ErrInvalidKey), errors.Is(err, idempotency.ErrOutcomeTooLarge),
		errors.Is(err, idempotency.ErrBadOptions), errors.Is(err, leader.ErrBadEvent), errors.Is(err, leader.ErrCrossShard),
		errors.Is(err, wal.ErrInvalidEvent), errors.Is(err, wal.ErrTooLarge), errors.Is(err, store.ErrRejected):
		return clientv1.Code_REFUSED
	}
	return clientv1.Code_UNAVAILABLE
}

// remedy is what a reply of code c tells its caller to do, after the
// error's own text.
func remedy(c clientv1.Code) string {
	switch c {
	case clientv1.Code_CONFLICT:
		return "use a new request ID for a new request"
	case clientv1.Code_SESSION_EXPIRED:
		return "OpenSession with Near set to this session opens one in its shard, where the retry meets its ledger entry"
	case clientv1.Code_REFUSED:
		return "the same request will be refused again; fix it"
	case clientv1.Code_WRONG_SHARD:
		return "open a session in the keys' shard (OpenSession with shard) and retry with the same request ID"
	}
	return "retry with the same request ID (its outcome is unknown until a retry answers), here or at the current leader"
}
