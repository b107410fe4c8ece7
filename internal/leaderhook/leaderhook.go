// Package leaderhook reaches the unexported parts of package leader that
// this module's own tests outside it need, without a public spelling
// embedders would see (issue 25: one atomic way to complete a request,
// leader.Shard.Commit). Package leader sets the hooks in init.
package leaderhook

import (
	"github.com/oncewal/oncewal/idempotency"
	"github.com/oncewal/oncewal/wal"
)

// Commit is (*leader.LedgerLog).commit for l, a *leader.LedgerLog: complete
// c with outcome and log events and the complete record in one batch.
var Commit func(l any, c *idempotency.Claim, outcome []byte, events ...wal.Event) (wal.Header, error)
