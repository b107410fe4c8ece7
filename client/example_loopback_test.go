package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/oncewal/oncewal/client"
	"github.com/oncewal/oncewal/clientapi"
	"github.com/oncewal/oncewal/leader"
	"github.com/oncewal/oncewal/replication/grpctransport"
)

// ExampleClient_Submit runs a one-node cluster in this process — a leader
// in a temporary directory serving the client service on loopback under
// mutual TLS — and submits a request, retries it with the same ID (the
// retry is answered with the first run's result, not run again), and
// reuses the ID for another request (a conflict). The client's certificate
// names it (oncewal://client/bank): its request IDs are its own.
func ExampleClient_Submit() {
	dir, err := os.MkdirTemp("", "oncewal-example-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	certs, err := grpctransport.WriteCerts(filepath.Join(dir, "certs"), nil, nil, []string{"bank"}, time.Hour)
	if err != nil {
		log.Fatal(err)
	}
	l, err := leader.Open(filepath.Join(dir, "node"), &leader.Options{Shards: 1})
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	svc, err := clientapi.New(l, nil)
	if err != nil {
		log.Fatal(err)
	}
	serverTLS, err := grpctransport.LoadServerTLS(certs.CA, certs.Leader, certs.LeaderKey)
	if err != nil {
		log.Fatal(err)
	}
	srv, err := grpctransport.Listen("127.0.0.1:0", &grpctransport.ServerOptions{TLS: serverTLS,
		Services: []grpctransport.Service{svc.GRPC()}})
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()

	bank := certs.Clients["bank"]
	clientTLS, err := grpctransport.LoadClientTLS(certs.CA, bank.Cert, bank.Key)
	if err != nil {
		log.Fatal(err)
	}
	// A leader without followers can acknowledge only its own WAL.
	c, err := client.New(&client.Options{Addrs: []string{srv.Addr().String()}, TLS: clientTLS, Ack: client.AckLeader})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	ctx := context.Background()
	transfer := client.Ops(client.Add([]byte("acct/alice"), -10), client.Add([]byte("acct/bob"), 10))
	first, err := c.Submit(ctx, "transfer-0001", transfer, client.WithAction("transfer 10 alice->bob"))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("first: replayed", first.Replayed)

	// The same request again (a caller that lost the answer): answered
	// from the record of the first run, which covers its LSN.
	retry, err := c.Submit(ctx, "transfer-0001", transfer, client.WithAction("transfer 10 alice->bob"))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("retry: replayed", retry.Replayed, "covers the first", retry.LSN >= first.LSN)

	// Another request under the same ID: refused, nothing runs.
	_, err = c.Submit(ctx, "transfer-0001", client.Ops(client.Add([]byte("acct/bob"), -99)))
	fmt.Println("other request, same ID: conflict", errors.Is(err, client.ErrConflict))

	// Output:
	// first: replayed false
	// retry: replayed true covers the first true
	// other request, same ID: conflict true
}
