package client_test

import (
	"context"
	"encoding/binary"
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

// ExampleClient_Txn is a bank on the default state machine, with no binary
// of its own: accounts are keys of the principal (its certificate names
// it, oncewal://client/bank), a transfer is one transaction that debits
// only what the balance covers, and every transfer has a request ID, so a
// retry — from this process or another, after a restart or a failover —
// answers what the first attempt did and never moves money twice. The two
// accounts share the hash tag {acct:alice}, so one shard applies the
// transfer atomically; the cluster has 4.
func ExampleClient_Txn() {
	dir, err := os.MkdirTemp("", "oncewal-bank-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	certs, err := grpctransport.WriteCerts(filepath.Join(dir, "certs"), nil, nil, []string{"bank"}, time.Hour)
	if err != nil {
		log.Fatal(err)
	}
	l, err := leader.Open(filepath.Join(dir, "node"), &leader.Options{Shards: 4})
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
	c, err := client.New(&client.Options{Addrs: []string{srv.Addr().String()}, TLS: clientTLS, Ack: client.AckLeader})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()

	alice, bob := []byte("{acct:alice}/balance"), []byte("{acct:alice}/owed-to-bob")
	if _, err := c.Txn(ctx, "deposit-1", client.Txn{Then: []client.TxnOp{client.OpAdd(alice, 100)}}); err != nil {
		log.Fatal(err)
	}
	// No overdraft: debit only if the balance is above amount-1; else read it.
	transfer := func(amount int64) client.Txn {
		return client.Txn{
			If:   []client.Cmp{client.Counter(alice, ">", amount-1)},
			Then: []client.TxnOp{client.OpAdd(alice, -amount), client.OpAdd(bob, amount)},
			Else: []client.TxnOp{client.OpGet(alice)},
		}
	}
	balance := func(v []byte) int64 { return int64(binary.LittleEndian.Uint64(v)) }

	res, err := c.Txn(ctx, "transfer-1", transfer(70))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("transfer 70: moved", res.Succeeded)
	res, err = c.Txn(ctx, "transfer-2", transfer(50))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("transfer 50: moved", res.Succeeded, "balance", balance(res.Ops[0].Value))

	// A deposit makes transfer-2 affordable, but its retry answers what it
	// did: declined. A new transfer needs a new request ID.
	if _, err := c.Txn(ctx, "deposit-2", client.Txn{Then: []client.TxnOp{client.OpAdd(alice, 100)}}); err != nil {
		log.Fatal(err)
	}
	res, err = c.Txn(ctx, "transfer-2", transfer(50))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("transfer 50 retried: replayed", res.Replayed, "moved", res.Succeeded)
	_, err = c.Txn(ctx, "transfer-2", transfer(60))
	fmt.Println("another transfer under the same ID: conflict", errors.Is(err, client.ErrConflict))

	kv, _, err := c.Get(ctx, alice) // linearizable: the leader, once acknowledged
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("alice:", balance(kv.Value), "version", kv.Version)
	accounts, _, err := c.Range(ctx, []byte("{acct:alice}/"), 0)
	if err != nil {
		log.Fatal(err)
	}
	for _, a := range accounts {
		fmt.Printf("%s = %d\n", a.Key, balance(a.Value))
	}

	// Output:
	// transfer 70: moved true
	// transfer 50: moved false balance 30
	// transfer 50 retried: replayed true moved false
	// another transfer under the same ID: conflict true
	// alice: 130 version 3
	// {acct:alice}/balance = 130
	// {acct:alice}/owed-to-bob = 70
}
