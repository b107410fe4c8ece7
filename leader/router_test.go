package leader_test

import (
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/oncewal/oncewal/leader"
	"github.com/oncewal/oncewal/replication"

	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/wal"
	"github.com/stretchr/testify/require"
	"lukechampine.com/blake3"
)

// TestRouterGolden pins the routing function. Every node of a deployment,
// of any version, must route a session to the same shard; if this test
// fails, the change breaks every existing deployment and must be reverted
// (a new function needs a new, explicitly versioned router).
func TestRouterGolden(t *testing.T) {
	counts := []int{1, 2, 3, 4, 8, 100}
	golden := []struct {
		id     string
		key    uint64
		shards [6]uint32 // for counts above
	}{
		{"00000000000000000000000000000000", 0x0b700423f8df72e5, [6]uint32{0, 1, 1, 1, 1, 16}},
		{"ffffffffffffffffffffffffffffffff", 0x079bf2bc650587c3, [6]uint32{0, 1, 1, 3, 3, 18}},
		{"000102030405060708090a0b0c0d0e0f", 0x30a817559692a4a6, [6]uint32{0, 0, 0, 0, 0, 82}},
		{"0123456789abcdef0123456789abcdef", 0x3f4dadd9bec79cd7, [6]uint32{0, 1, 2, 2, 2, 34}},
		{"6f6e636577616c2073686172642d3031", 0xa1df691870033c94, [6]uint32{0, 1, 1, 1, 5, 85}},
		{"deadbeefdeadbeefdeadbeefdeadbeef", 0x0742bc2494e6ecd7, [6]uint32{0, 1, 2, 3, 4, 70}},
		// Two UUIDv7-style IDs one apart: same timestamp prefix, unrelated shards.
		{"019a0b6c7e3f7c1e8a2b3c4d5e6f7081", 0x576b68b64e6bf7e8, [6]uint32{0, 1, 1, 1, 6, 80}},
		{"019a0b6c7e3f7c1e8a2b3c4d5e6f7082", 0x839648936be101bd, [6]uint32{0, 0, 2, 2, 5, 60}},
	}
	for _, g := range golden {
		id, err := session.ParseID(g.id)
		require.NoError(t, err)
		require.Equal(t, g.key, leader.RouteKey(id), "RouteKey(%s)", g.id)
		for i, n := range counts {
			r, err := leader.NewShardRouter(n)
			require.NoError(t, err)
			require.Equal(t, g.shards[i], r.Shard(id), "session %s, %d shards", g.id, n)
		}
	}
}

// TestRouteKeyIsBLAKE3 checks RouteKey's direct compression against the
// library's BLAKE3-256.
func TestRouteKeyIsBLAKE3(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for range 1000 {
		var id session.ID
		for j := range id {
			id[j] = byte(rng.Uint32())
		}
		sum := blake3.Sum256(id[:])
		require.Equal(t, binary.LittleEndian.Uint64(sum[:8]), leader.RouteKey(id))
	}
}

func TestRouterBadCount(t *testing.T) {
	for _, n := range []int{0, -1, replication.MaxShards + 1} {
		_, err := leader.NewShardRouter(n)
		require.True(t, errors.Is(err, leader.ErrBadShardCount), "n=%d: %v", n, err)
	}
	r, err := leader.NewShardRouter(replication.MaxShards)
	require.NoError(t, err)
	require.Equal(t, replication.MaxShards, r.Shards())
	var zero leader.ShardRouter
	require.Equal(t, uint32(0), zero.Shard(session.NewID()), "zero router sends everything to shard 0")
}

// TestRouterBalanceAndStability: sessions spread evenly, and growing the
// shard count by one only moves sessions to the new shard (about 1/n of
// them) — the jump-hash property that keeps a future re-shard cheap.
func TestRouterBalanceAndStability(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	ids := make([]session.ID, 40_000)
	for i := range ids {
		for j := range ids[i] {
			ids[i][j] = byte(rng.Uint32())
		}
	}
	// Structured IDs (UUIDv7-like: shared 48-bit time prefix, counter) must
	// spread just as well.
	structured := make([]session.ID, 40_000)
	for i := range structured {
		copy(structured[i][:], []byte{0x01, 0x9a, 0x0b, 0x6c, 0x7e, 0x3f})
		structured[i][14], structured[i][15] = byte(i>>8), byte(i)
	}
	for _, set := range [][]session.ID{ids, structured} {
		for _, n := range []int{2, 4, 8} {
			r, _ := leader.NewShardRouter(n)
			hist := make([]int, n)
			for _, id := range set {
				hist[r.Shard(id)]++
			}
			want := len(set) / n
			for s, c := range hist {
				require.InDelta(t, want, c, float64(want)/10, "%d shards: shard %d got %d sessions (hist %v)", n, s, c, hist)
			}
		}
	}
	for n := 1; n < 10; n++ {
		a, _ := leader.NewShardRouter(n)
		b, _ := leader.NewShardRouter(n + 1)
		moved := 0
		for _, id := range ids {
			sa, sb := a.Shard(id), b.Shard(id)
			if sa != sb {
				require.Equal(t, uint32(n), sb, "a session moved between old shards")
				moved++
			}
		}
		want := len(ids) / (n + 1)
		require.InDelta(t, want, moved, float64(want)/10, "%d→%d shards", n, n+1)
	}
}

func BenchmarkRouterShard(b *testing.B) {
	r, _ := leader.NewShardRouter(8)
	id := session.NewID()
	var sink uint32
	for b.Loop() {
		id[0]++
		sink += r.Shard(id)
	}
	_ = sink
}

// TestRouterSplit: Split puts every event in its session's shard, in order,
// and reuses the slices it is given.
func TestRouterSplit(t *testing.T) {
	r, err := leader.NewShardRouter(3)
	require.NoError(t, err)
	var evs []wal.Event
	for i := range 60 {
		evs = append(evs, wal.Event{Op: wal.OpPut, Session: session.NewID(), Key: []byte{byte(i)}})
	}
	split := r.Split(evs, nil)
	require.Len(t, split, 3)
	n := 0
	for s, part := range split {
		require.NotEmpty(t, part)
		for i, ev := range part {
			require.Equal(t, uint32(s), r.Shard(ev.Session))
			if i > 0 {
				require.Less(t, part[i-1].Key[0], ev.Key[0], "order within the shard kept")
			}
		}
		n += len(part)
	}
	require.Equal(t, len(evs), n)
	again := r.Split(evs[:1], split)
	require.Equal(t, 1, len(again[0])+len(again[1])+len(again[2]))
	require.Same(t, &split[0][:1][0], &again[0][:1][0], "slices reused")
}
