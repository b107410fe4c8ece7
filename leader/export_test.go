package leader

import (
	"context"

	"github.com/oncewal/oncewal/idempotency"
	"github.com/oncewal/oncewal/wal"
)

// The tests drive the shipping stack and the log directly; embedders get one
// spelling each (Shard.WaitAcked, Shard.Commit), so these exist in tests only.

func (f *Fanout) WaitAcked(ctx context.Context, lsn uint64, policy AckPolicy) error {
	return f.waitAcked(ctx, lsn, policy)
}

func (s *Shipper) WaitAcked(ctx context.Context, lsn uint64) error {
	return s.f.waitAcked(ctx, lsn, AckAll)
}

func (l *LedgerLog) Commit(c *idempotency.Claim, outcome []byte, events ...wal.Event) (wal.Header, error) {
	return l.commit(c, outcome, events...)
}

func (s *Shard) Log() *LedgerLog { return s.log }

// The session routing key, checked against BLAKE3 (the jump hash is
// kvroute's, checked there).
var RouteKey = routeKey

func (l *LedgerLog) CommitResolved(c *idempotency.Claim, resolve Resolver) (wal.Header, []byte, error) {
	return l.commitResolved(c, resolve)
}
