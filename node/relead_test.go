package node

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/oncewal/oncewal/leader"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/wal"
)

// TestReledReplicaFollowersCatchUp: a leader logs writes its followers
// never got, and its term ends; being the most advanced it leads the next
// term on the replica it led, whose log still holds those batches of its
// old epoch. The followers promised the new epoch, so their stores refuse
// any batch of an older one: shipped the old batches, they could never
// catch up, and no write would be acknowledged again. They rebuild the
// shards behind the new term's first LSN from the leader instead, and
// writes flow. Found by the election simulation.
func TestReledReplicaFollowersCatchUp(t *testing.T) {
	cl, mem, views := pausableCluster(t, "a", "b", "c")
	for _, id := range []string{"a", "b", "c"} {
		cl.start(id)
	}
	first, l := cl.waitLeader("")
	sid := session.NewID()
	write(t, l, []session.ID{sid}, 0, 20)
	epoch := cl.status(first).Epoch
	for _, id := range []string{"a", "b", "c"} {
		if id != first {
			cl.net.Cut("mem:"+id, 0, true)
		}
	}
	for i := range 5 { // logged, never shipped
		if _, err := l.Append(wal.Event{Op: wal.OpPut, Session: sid, Key: fmt.Appendf(nil, "x%d", i), Value: []byte("v")}); err != nil {
			t.Fatal(err)
		}
	}
	// One follower stops, so the next fence needs the leader's report: it
	// is the most advanced, and the term is handed to it.
	var others []string
	for _, id := range []string{"a", "b", "c"} {
		if id != first {
			others = append(others, id)
		}
	}
	cl.stop(others[1])
	views[first].mu.Lock()
	held := views[first].held
	views[first].mu.Unlock()
	for _, ls := range held {
		mem.Expire(ls) // its term ends; it stays the most advanced
	}
	for _, id := range []string{"a", "b", "c"} {
		cl.net.Cut("mem:"+id, 0, false)
	}
	var l2 *leader.Leader
	waitFor(t, first+" to lead a later term", func() bool {
		cl.mu.Lock()
		r := cl.nodes[first]
		cl.mu.Unlock()
		ld, err := r.n.Leader()
		if err != nil || r.n.Status().Epoch <= epoch {
			return false
		}
		l2 = ld
		return true
	})
	cl.start(others[1])
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	sh, _ := l2.Shard(0)
	if _, err := sh.Append(wal.Event{Op: wal.OpPut, Session: sid, Key: []byte("after"), Value: []byte("v")}); err != nil {
		t.Fatal(err)
	}
	if err := sh.WaitAcked(ctx, sh.NextLSN()-1, leader.AckAll); err != nil {
		t.Fatalf("the followers of the re-led replica never caught up: %v", err)
	}
}
