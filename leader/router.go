package leader

import (
	"errors"
	"fmt"

	"github.com/oncewal/oncewal/kvroute"
	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/wal"
	"lukechampine.com/blake3/guts"
)

// ErrBadShardCount: a ShardRouter needs between 1 and replication.MaxShards shards.
var ErrBadShardCount = errors.New("leader: bad shard count")

// ErrNoSuchShard: a shard number outside the deployment's 0..Shards-1.
var ErrNoSuchShard = errors.New("leader: no such shard")

// ShardRouter maps sessions to shards for a deployment with a fixed number of
// shards. The zero value is not usable; create it with NewShardRouter. It is
// immutable and safe for concurrent use.
type ShardRouter struct {
	n uint32
}

// NewShardRouter returns the router for a deployment of n shards (shards
// 0..n-1). Every node of the deployment must use the same n.
func NewShardRouter(n int) (ShardRouter, error) {
	if n < 1 || n > replication.MaxShards {
		return ShardRouter{}, fmt.Errorf("%w: %d (want 1..%d)", ErrBadShardCount, n, replication.MaxShards)
	}
	return ShardRouter{n: uint32(n)}, nil
}

// Shards is the deployment's shard count.
func (r ShardRouter) Shards() int { return int(r.n) }

// Shard returns the shard of session id: kvroute.JumpHash(routeKey(id), n).
func (r ShardRouter) Shard(id session.ID) uint32 {
	if r.n <= 1 {
		return 0
	}
	return uint32(kvroute.JumpHash(routeKey(id), int(r.n)))
}

// Split groups events by their session's shard, keeping their order within
// each shard: out[s] holds shard s's events. It reuses out's slices.
func (r ShardRouter) Split(events []wal.Event, out [][]wal.Event) [][]wal.Event {
	n := max(r.Shards(), 1)
	if cap(out) < n {
		out = make([][]wal.Event, n)
	}
	out = out[:n]
	for i := range out {
		out[i] = out[i][:0]
	}
	for _, ev := range events {
		s := r.Shard(ev.Session)
		out[s] = append(out[s], ev)
	}
	return out
}

// routeKey is the 64-bit routing key of a session: the first 8 bytes of
// BLAKE3-256 of its 16 ID bytes, read little-endian.
func routeKey(id session.ID) uint64 {
	// 16 bytes are one BLAKE3 block: a single compression, computed directly
	// so the ID does not escape to the heap (blake3.Sum256 would allocate).
	// The result equals blake3.Sum256(id[:]) (checked in router_test.go).
	var block [guts.BlockSize]byte
	copy(block[:], id[:])
	out := guts.CompressNode(guts.Node{
		CV:       guts.IV,
		Block:    guts.BytesToWords(block),
		BlockLen: uint32(len(id)),
		Flags:    guts.FlagChunkStart | guts.FlagChunkEnd | guts.FlagRoot,
	})
	return uint64(out[0]) | uint64(out[1])<<32
}
