package client_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncewal/oncewal/client"
	"github.com/oncewal/oncewal/kvroute"
)

func counter(n int64) []byte { return binary.LittleEndian.AppendUint64(nil, uint64(n)) }

// TestKeysOutliveClients: a principal's keys outlive every Client: keys
// written by one Client (one process, its own sessions) over 4 shards are
// read, compared and changed by a new Client of the same principal, once
// each; the requests spread over every shard, one session per shard.
func TestKeysOutliveClients(t *testing.T) {
	c := newCluster(t, 4, "f1")
	ctx := context.Background()
	perShard := map[uint32]int{}
	first := c.newClient("bank", client.AckMajority, 3, c.addr)
	for i := range 40 {
		key := []byte(fmt.Sprintf("acct/%02d", i))
		res, err := first.Txn(ctx, fmt.Sprintf("open-%02d", i), client.Txn{Then: []client.TxnOp{client.OpAdd(key, 100)}})
		require.NoError(t, err)
		require.Equal(t, kvroute.Shard(key, 4), res.Shard)
		perShard[res.Shard]++
	}
	require.Len(t, perShard, 4, "one principal's requests spread over every shard: %v", perShard)
	for s, n := range perShard {
		require.GreaterOrEqual(t, n, 4, "shard %d took %d of 40", s, n)
	}
	require.NoError(t, first.Close())

	second := c.newClient("bank", client.AckMajority, 3, c.addr)
	for i := range 40 {
		key := []byte(fmt.Sprintf("acct/%02d", i))
		kv, found, err := second.Get(ctx, key)
		require.NoError(t, err)
		require.True(t, found, "%s written by an earlier client", key)
		require.Equal(t, counter(100), kv.Value)
		require.Equal(t, uint64(1), kv.Version)
	}
	// A retry of an earlier process's request ID replays, runs nothing.
	res, err := second.Txn(ctx, "open-07", client.Txn{Then: []client.TxnOp{client.OpAdd([]byte("acct/07"), 100)}})
	require.NoError(t, err)
	require.True(t, res.Replayed)
	kv, _, err := second.Get(ctx, []byte("acct/07"))
	require.NoError(t, err)
	require.Equal(t, counter(100), kv.Value, "the retry ran nothing")
	all, more, err := second.Range(ctx, []byte("acct/"), 0)
	require.NoError(t, err)
	require.False(t, more)
	require.Len(t, all, 40)
	other := c.newClient("mallory", client.AckMajority, 3, c.addr)
	_, found, err := other.Get(ctx, []byte("acct/07"))
	require.NoError(t, err)
	require.False(t, found, "another principal's keys are its own")
}

// TestTxnNoOverdraft: "no overdraft" is one transaction with a hash tag:
// a transfer that would overdraw runs its Else branch (reading the
// balance), never the debit, and a retry of it with the same ID answers
// the same; an add to a key that is no counter is a recorded rejection
// (errors.As *RejectedError, the same on retry).
func TestTxnNoOverdraft(t *testing.T) {
	c := newCluster(t, 4)
	ctx := context.Background()
	cl := c.newClient("bank", client.AckLeader, 3, c.addr)
	alice, bob := []byte("{acct:alice}/balance"), []byte("{acct:alice}/owed-to-bob")
	_, err := cl.Txn(ctx, "seed", client.Txn{Then: []client.TxnOp{client.OpAdd(alice, 50)}})
	require.NoError(t, err)
	// No overdraft: debit only if the balance covers the amount.
	move := func(id string, amount int64) (client.TxnResult, error) {
		return cl.Txn(ctx, id, client.Txn{
			If:   []client.Cmp{client.Counter(alice, ">", amount-1)},
			Then: []client.TxnOp{client.OpAdd(alice, -amount), client.OpAdd(bob, amount)},
			Else: []client.TxnOp{client.OpGet(alice)},
		})
	}
	res, err := move("t1", 30)
	require.NoError(t, err)
	require.True(t, res.Succeeded)
	res, err = move("t2", 30) // 20 left: declined, the Else branch reads it
	require.NoError(t, err)
	require.False(t, res.Succeeded)
	require.Equal(t, counter(20), res.Ops[0].Value)
	_, err = move("t3", 20)
	require.NoError(t, err)
	again, err := move("t2", 30) // the declined one, retried after t3
	require.NoError(t, err)
	require.True(t, again.Replayed)
	require.False(t, again.Succeeded, "a declined transfer never succeeds on retry")
	kv, _, err := cl.Get(ctx, alice)
	require.NoError(t, err)
	require.Equal(t, counter(0), kv.Value, "never below zero")

	_, err = cl.Txn(ctx, "name", client.Txn{Then: []client.TxnOp{client.OpPut([]byte("{acct:alice}/name"), []byte("Alice"))}})
	require.NoError(t, err)
	for range 2 {
		_, err = cl.Txn(ctx, "bad-add", client.Txn{Then: []client.TxnOp{client.OpAdd([]byte("{acct:alice}/name"), 1)}})
		var rej *client.RejectedError
		require.True(t, errors.As(err, &rej), "%v", err)
		require.Equal(t, "not_counter", rej.Code)
		require.ErrorIs(t, err, client.ErrRejected)
	}
	_, err = cl.Txn(ctx, "cross", client.Txn{Then: []client.TxnOp{client.OpPut([]byte("a"), nil), client.OpPut([]byte("b"), nil), client.OpPut([]byte("c"), nil), client.OpPut([]byte("d"), nil)}})
	require.ErrorIs(t, err, client.ErrRefused, "keys of several shards are refused")
	_, err = cl.Txn(ctx, "bad-op", client.Txn{If: []client.Cmp{client.Value(alice, ">=", nil)}, Then: []client.TxnOp{client.OpGet(alice)}})
	require.ErrorIs(t, err, client.ErrRefused)
}

// TestStatusOfTxn: a transaction's ledger entry is in its keys' shard:
// Status with OfTxn finds it (done, or rejected with its code), where the
// Client's Submit session's shard may not.
func TestStatusOfTxn(t *testing.T) {
	c := newCluster(t, 4)
	ctx := context.Background()
	cl := c.newClient("bank", client.AckLeader, 3, c.addr)
	for i := range 8 {
		key := []byte(fmt.Sprintf("s/%d", i))
		_, err := cl.Txn(ctx, fmt.Sprintf("st-%d", i), client.Txn{Then: []client.TxnOp{client.OpPut(key, []byte("x"))}})
		require.NoError(t, err)
		st, err := cl.Status(ctx, fmt.Sprintf("st-%d", i), client.OfTxn(key))
		require.NoError(t, err)
		require.Equal(t, client.StateDone, st.State, "%s", key)
	}
	_, err := cl.Txn(ctx, "st-bad", client.Txn{Then: []client.TxnOp{client.OpAdd([]byte("s/0"), 1)}})
	require.ErrorIs(t, err, client.ErrRejected)
	st, err := cl.Status(ctx, "st-bad", client.OfTxn([]byte("s/0")))
	require.NoError(t, err)
	require.Equal(t, client.StateRejected, st.State)
	require.Equal(t, "not_counter", st.Rejection.Code)
}
