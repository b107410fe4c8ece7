package follower_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/oncewal/oncewal/replication/inprocess"

	"github.com/oncewal/oncewal/store"

	"github.com/oncewal/oncewal/follower"
	"github.com/oncewal/oncewal/leader"
	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/wal"
)

// ExampleNode serves every shard of a four-shard leader from one Node: one
// store per shard in one directory, one stream per shard (here over the
// in-process transport), each shard's batches applied by its own follower.
func ExampleNode() {
	dir, err := os.MkdirTemp("", "oncewal-node-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	const shards = 4
	links := make([]*inprocess.Transport, shards)
	for s := range links {
		links[s] = inprocess.New(inprocess.FaultsNone, uint64(s))
		defer links[s].Close()
	}
	l, err := leader.Open(filepath.Join(dir, "leader"), &leader.Options{
		Shards:    shards,
		Followers: []string{"node-1"},
		Listener:  func(s uint32) replication.Listener { return links[s] },
		Logger:    quietLogger,
		Store:     store.Options{Logger: quietLogger},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	n, err := follower.OpenNode(filepath.Join(dir, "node-1"), []uint32{0, 1, 2, 3}, &follower.NodeOptions{
		Follower: follower.Options{Store: store.Options{ID: "node-1", Logger: quietLogger}},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer n.Close()

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{}, 2)
	go func() { _ = l.Run(ctx); done <- struct{}{} }()
	go func() {
		_ = n.Serve(ctx, func(s uint32) replication.Dialer { return links[s] })
		done <- struct{}{}
	}()
	defer func() { cancel(); <-done; <-done }()

	// Sixteen sessions, each routed to its shard by the leader.
	for i := range 16 {
		s := session.ID{byte(i + 1)}
		if _, err := l.Append(wal.Event{Op: wal.OpAdd, Session: s, Key: []byte("n"), Delta: 1}); err != nil {
			log.Fatal(err)
		}
	}
	wait, stop := context.WithTimeout(ctx, 30*time.Second)
	defer stop()
	if err := l.WaitAcked(wait, leader.AckAll); err != nil {
		log.Fatal(err)
	}
	total := 0
	for _, shard := range n.Shards() {
		applied, _, err := n.Position(shard)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("shard %d: applied LSN %d\n", shard, applied)
		total += int(applied)
	}
	fmt.Println("events applied across shards:", total)
	// Output:
	// shard 0: applied LSN 3
	// shard 1: applied LSN 5
	// shard 2: applied LSN 5
	// shard 3: applied LSN 3
	// events applied across shards: 16
}
