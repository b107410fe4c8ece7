package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"

	"github.com/oncewal/oncewal/client"
	"github.com/oncewal/oncewal/clientapi"
	"github.com/oncewal/oncewal/leader"
	"github.com/oncewal/oncewal/replication/grpctransport"
)

// ExampleClient_Submit runs a one-node cluster in this process — a leader
// in a temporary directory serving the client service on loopback — and
// submits a request, retries it with the same ID (the retry is answered
// with the first run's result, not run again), and reuses the ID for
// another request (a conflict).
//
// It is plaintext with the caller named by Options.Principal, which is
// only for loopback experiments: a deployment gives each client a
// certificate naming oncewal://client/NAME (see Example), which
// grpctransport.WriteCerts does not issue.
func ExampleClient_Submit() {
	dir, err := os.MkdirTemp("", "oncewal-example-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	l, err := leader.Open(dir, &leader.Options{Shards: 1})
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	svc, err := clientapi.New(l, &clientapi.Options{Insecure: true})
	if err != nil {
		log.Fatal(err)
	}
	srv, err := grpctransport.Listen("127.0.0.1:0", &grpctransport.ServerOptions{Insecure: true,
		Services: []grpctransport.UnaryService{svc.Unary()}})
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()

	// A leader without followers can acknowledge only its own WAL.
	c, err := client.New(&client.Options{Addrs: []string{srv.Addr().String()}, Insecure: true, Principal: "bank",
		Ack: client.AckLeader})
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
