package testutil

import (
	"sync/atomic"

	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
)

// SyncGate is an errorfs.Injector that holds a file's data sync
// (fdatasync, errorfs.OpFileSyncData) on demand and counts them all: a test
// of group commit keeps one sync in flight while other writers queue
// behind it. Use it as errorfs.Wrap(fs, gate).
type SyncGate struct {
	next  atomic.Pointer[HeldSync]
	syncs atomic.Int64
}

// HeldSync is one sync a SyncGate holds.
type HeldSync struct {
	started chan struct{}
	release chan struct{}
	result  error
}

// Hold makes the next sync wait, once it has begun, until Release; it then
// fails with result, or runs if result is nil.
func (g *SyncGate) Hold(result error) *HeldSync {
	h := &HeldSync{started: make(chan struct{}), release: make(chan struct{}), result: result}
	g.next.Store(h)
	return h
}

// Syncs is how many data syncs began.
func (g *SyncGate) Syncs() int64 { return g.syncs.Load() }

// String implements errorfs.Injector.
func (g *SyncGate) String() string { return "sync gate" }

// MaybeError implements errorfs.Injector.
func (g *SyncGate) MaybeError(op errorfs.Op) error {
	if op.Kind != errorfs.OpFileSyncData {
		return nil
	}
	g.syncs.Add(1)
	h := g.next.Swap(nil)
	if h == nil {
		return nil
	}
	close(h.started)
	<-h.release
	return h.result
}

// Wait returns once the held sync has begun.
func (h *HeldSync) Wait() { <-h.started }

// Release lets the held sync finish.
func (h *HeldSync) Release() { close(h.release) }
