package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/oncewal/oncewal/client"
	"github.com/oncewal/oncewal/replication/grpctransport"
)

// Example moves 10 from alice to bob exactly once: however often the
// request is retried — by the client inside Submit, or by this program
// after a crash, with the same request ID — the cluster runs it once and
// answers every retry with the same result.
func Example() {
	// The cluster's CA, and a client certificate whose URI SAN
	// oncewal://client/bank names this program: request IDs are scoped by
	// it, so no other client can replay or collide with them.
	tlsConf, err := grpctransport.LoadClientTLS("certs/ca.pem", "certs/client-bank.pem", "certs/client-bank-key.pem")
	if err != nil {
		log.Fatal(err)
	}
	// Any node will do: the client finds the leader and follows it.
	c, err := client.New(&client.Options{Addrs: []string{"node1:7070", "node2:7070", "node3:7070"}, TLS: tlsConf})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	// The request ID names this transfer, not this attempt: derive it from
	// what the request is (an order number, a message ID), and keep it
	// until the request has an answer.
	const id = "transfer-2026-0001"
	payload := client.Ops(client.Add([]byte("acct/alice"), -10), client.Add([]byte("acct/bob"), 10))
	res, err := c.Submit(context.Background(), id, payload, client.WithAction("transfer 10 alice->bob"))
	switch {
	case errors.Is(err, client.ErrOutcomeUnknown):
		// The cluster was unreachable long enough to spend the retry
		// budget after the request may have run: submit again later with
		// the same ID; it will not run twice.
		log.Printf("transfer %s: try again later with the same ID: %v", id, err)
	case errors.Is(err, client.ErrConflict):
		log.Fatalf("transfer %s: the ID was used for another request: %v", id, err)
	case err != nil:
		log.Fatal(err)
	default:
		fmt.Printf("transfer logged at LSN %d (epoch %d, replayed %v)\n", res.LSN, res.Epoch, res.Replayed)
	}
}
