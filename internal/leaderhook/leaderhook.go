// Package leaderhook reaches the unexported parts of package leader that
// this module's own tests outside it need, without a public spelling
// embedders would see (issue 25: one atomic way to complete a request,
// leader.Shard.Commit). Package leader sets the hooks in init.
package leaderhook

import (
	"context"

	"github.com/oncewal/oncewal/idempotency"
	"github.com/oncewal/oncewal/wal"
)

// Commit is (*leader.LedgerLog).commit for l, a *leader.LedgerLog: complete
// c with outcome and log events and the complete record in one batch.
var Commit func(l any, c *idempotency.Claim, outcome []byte, events ...wal.Event) (wal.Header, error)

// WaitAcked is the shipping stack's own wait for acks, for s a
// *leader.Shipper or *leader.Fanout: it returns once every follower s ships
// to has acknowledged lsn (AckAll), when s stops, or when ctx ends. The
// acks wake it, as they wake leader.Shard.WaitAcked, so a benchmark that
// drives a bare Shipper measures what a leader's client waits.
var WaitAcked func(s any, ctx context.Context, lsn uint64) error
