package node_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/oncewal/oncewal/coord"
	"github.com/oncewal/oncewal/leader"
	"github.com/oncewal/oncewal/node"
	"github.com/oncewal/oncewal/replication/inprocess"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/wal"
)

// Three members of a cluster elect a leader, which takes a write that a
// majority acknowledges; when it stops, another member is elected with the
// write. The coordinator and the network are in process here; a deployment
// uses coord.NewEtcd and node.NewGRPC (oncewal node).
func Example() {
	dir, _ := os.MkdirTemp("", "oncewal-node-example")
	defer os.RemoveAll(dir)
	quiet := slog.New(slog.DiscardHandler)
	ctx := context.Background()
	c := coord.NewMemory()
	defer c.Close()
	net := node.NewMemoryNet(inprocess.FaultsNone, 1)
	ids := []string{"a", "b", "c"}
	stops := map[string]func(){}
	nodes := map[string]*node.Node{}
	for _, id := range ids {
		if _, err := node.AddMember(ctx, c, "example", id); err != nil {
			panic(err)
		}
	}
	for _, id := range ids {
		n, err := node.Open(&node.Options{Coordinator: c, Cluster: "example", ID: id, Dir: filepath.Join(dir, id),
			Addr: "mem:" + id, Transport: net.For("mem:" + id), Logger: quiet})
		if err != nil {
			panic(err)
		}
		rctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- n.Run(rctx) }()
		nodes[id], stops[id] = n, func() { stop(); <-done; _ = n.Close() }
	}
	leaderOf := func(except string) (string, *leader.Leader) {
		for {
			for _, id := range ids {
				if l, err := nodes[id].Leader(); err == nil && id != except {
					return id, l
				}
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	first, l := leaderOf("")
	sid := session.NewID()
	if _, err := l.Append(wal.Event{Op: wal.OpPut, Session: sid, Key: []byte("k"), Value: []byte("v")}); err != nil {
		panic(err)
	}
	if err := l.WaitAcked(ctx, leader.AckMajority); err != nil {
		panic(err)
	}
	fmt.Println("a majority acknowledged the write")
	stops[first]()
	second, l2 := leaderOf(first)
	sh, _ := l2.Shard(0)
	fmt.Println("another member leads:", second != first, "and its log holds the write:", sh.NextLSN() > 1)
	for _, id := range ids {
		if id != first {
			stops[id]()
		}
	}
	// Output:
	// a majority acknowledged the write
	// another member leads: true and its log holds the write: true
}
