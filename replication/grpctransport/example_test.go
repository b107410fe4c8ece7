package grpctransport_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/oncewal/oncewal/store"

	"github.com/oncewal/oncewal/follower"
	"github.com/oncewal/oncewal/leader"
	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/replication/grpctransport"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/wal"
)

// Example ships a leader's log to a follower over gRPC with mutual TLS on
// loopback: a fresh CA issues the leader's server certificate and the
// follower's client certificate naming its ID (WriteCerts, as oncewal
// gencerts), the leader serves shard 0 on a Server's
// listener, and the follower dials it, applies what it receives and acks.
func Example() {
	dir, err := os.MkdirTemp("", "oncewal-grpc-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	quiet := slog.New(slog.DiscardHandler)

	// A throwaway CA with a leader and a follower certificate, written as
	// `oncewal gencerts` writes them; a deployment loads its own files the
	// same way. The follower's names replica-1: the leader serves it only
	// as that ID.
	certs, err := grpctransport.WriteCerts(filepath.Join(dir, "certs"), nil, []string{"replica-1"}, nil, time.Hour)
	if err != nil {
		log.Fatal(err)
	}
	serverTLS, err := grpctransport.LoadServerTLS(certs.CA, certs.Leader, certs.LeaderKey)
	if err != nil {
		log.Fatal(err)
	}
	clientTLS, err := grpctransport.LoadClientTLS(certs.CA, certs.Followers["replica-1"].Cert, certs.Followers["replica-1"].Key)
	if err != nil {
		log.Fatal(err)
	}

	// Leader: a gRPC server on loopback, shard 0's streams accepted on its
	// per-shard listener, one registered follower.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	srv, err := grpctransport.NewServer(lis, &grpctransport.ServerOptions{TLS: serverTLS, Logger: quiet})
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()
	l, err := leader.Open(filepath.Join(dir, "leader"), &leader.Options{
		Shards:    1,
		Listener:  func(shard uint32) replication.Listener { return srv.Listener(shard) },
		Followers: []string{"replica-1"},
		Logger:    quiet,
		Store:     store.Options{Logger: quiet},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()

	// Follower: dials the leader with its client certificate.
	f, err := follower.Open(filepath.Join(dir, "replica-1"), &follower.Options{Store: store.Options{ID: "replica-1", Logger: quiet}})
	if err != nil {
		log.Fatal(err)
	}
	defer f.Close()
	d, err := grpctransport.NewDialer(srv.Addr().String(), &grpctransport.DialerOptions{TLS: clientTLS, Logger: quiet})
	if err != nil {
		log.Fatal(err)
	}
	defer d.Close()

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{}, 2)
	go func() { _ = l.Run(ctx); done <- struct{}{} }()
	go func() { _ = f.Serve(ctx, d); done <- struct{}{} }()
	defer func() { cancel(); <-done; <-done }()

	s := session.ID{0x03}
	for range 3 {
		if _, err := l.Append(wal.Event{Op: wal.OpAdd, Session: s, Key: []byte("visits"), Delta: 1}); err != nil {
			log.Fatal(err)
		}
	}
	wait, stop := context.WithTimeout(ctx, 30*time.Second)
	defer stop()
	if err := l.WaitAcked(wait, leader.AckAll); err != nil { // every follower has it durably
		log.Fatal(err)
	}
	n, _ := f.State().Counter(s, []byte("visits"))
	fmt.Println("follower's visits:", n)
	// Output:
	// follower's visits: 3
}
