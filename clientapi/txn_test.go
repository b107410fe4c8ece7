package clientapi_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"

	"github.com/oncewal/oncewal/clientapi"
	"github.com/oncewal/oncewal/kvroute"
	"github.com/oncewal/oncewal/leader"
	clientv1 "github.com/oncewal/oncewal/proto/oncewal/client/v1"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/store"
	"github.com/oncewal/oncewal/wal"
)

// sessionIn opens a session in shard.
func sessionIn(t *testing.T, cc *grpc.ClientConn, shard uint32) []byte {
	t.Helper()
	rep := openSession(t, cc, &clientv1.OpenSessionRequest{Shard: shard})
	require.Equal(t, shard, rep.Shard)
	return rep.Session
}

func txn(t *testing.T, cc *grpc.ClientConn, r *clientv1.TxnRequest) *clientv1.TxnReply {
	t.Helper()
	var rep clientv1.TxnReply
	require.NoError(t, call(cc, clientv1.Client_Txn_FullMethodName, r, &rep))
	return &rep
}

func get(t *testing.T, cc *grpc.ClientConn, key string) *clientv1.GetReply {
	t.Helper()
	var rep clientv1.GetReply
	require.NoError(t, call(cc, clientv1.Client_Get_FullMethodName, &clientv1.GetRequest{Key: []byte(key)}, &rep))
	return &rep
}

func counterOf(kv *clientv1.KeyValue) int64 { return int64(binary.LittleEndian.Uint64(kv.GetValue())) }

// transfer is a bank transfer of amount from one account to another as
// one transaction: if the source's balance (a counter) is at least amount,
// both adds run; else it reads the balance. The accounts share a hash
// tag, so one shard.
func transfer(sess []byte, id, from, to string, amount int64) *clientv1.TxnRequest {
	return &clientv1.TxnRequest{Session: sess, RequestId: id, Action: fmt.Sprintf("move %d from %s to %s", amount, from, to),
		Compares: []*clientv1.Compare{{Key: []byte(from), Target: clientv1.Compare_COUNTER, Result: clientv1.Compare_GREATER, Counter: amount - 1}},
		Success:  []*clientv1.TxnOp{{Kind: clientv1.TxnOp_ADD, Key: []byte(from), Delta: -amount}, {Kind: clientv1.TxnOp_ADD, Key: []byte(to), Delta: amount}},
		Failure:  []*clientv1.TxnOp{{Kind: clientv1.TxnOp_GET, Key: []byte(from)}}}
}

// TestTxnKeysOutliveSessions: keys belong to the principal, not the
// session: a put in one session is read, compared and changed from
// another; another principal's keys of the same name are its own; a retry
// replays the recorded branch and results; the same ID with other ops is
// a conflict; a session of another shard is WRONG_SHARD with the keys'
// shard, and keys of two shards are refused.
func TestTxnKeysOutliveSessions(t *testing.T) {
	r := newRig(t, leader.Options{Shards: 4}, nil)
	cc := r.client("bank")
	shard := kvroute.Shard([]byte("{bank}alice"), 4)
	s1, s2 := sessionIn(t, cc, shard), sessionIn(t, cc, shard)
	rep := txn(t, cc, &clientv1.TxnRequest{Session: s1, RequestId: "open", Success: []*clientv1.TxnOp{
		{Kind: clientv1.TxnOp_ADD, Key: []byte("{bank}alice"), Delta: 100}}})
	require.Equal(t, clientv1.Code_OK, rep.Code, rep.Message)
	require.True(t, rep.Result.Succeeded)
	require.Equal(t, uint64(1), rep.Result.Results[0].Version)

	move := transfer(s2, "t1", "{bank}alice", "{bank}bob", 30)
	rep = txn(t, cc, move)
	require.Equal(t, clientv1.Code_OK, rep.Code, rep.Message)
	require.True(t, rep.Result.Succeeded, "alice has 100 in another session's write")
	again := txn(t, cc, move)
	require.Equal(t, clientv1.Code_REPLAY, again.Code, again.Message)
	require.True(t, again.Result.Succeeded)
	require.Equal(t, rep.Result.Results[1].Value, again.Result.Results[1].Value)
	other := transfer(s2, "t1", "{bank}alice", "{bank}bob", 31)
	require.Equal(t, clientv1.Code_CONFLICT, txn(t, cc, other).Code)

	g := get(t, cc, "{bank}alice")
	require.Equal(t, clientv1.Code_OK, g.Code, g.Message)
	require.True(t, g.Found)
	require.Equal(t, int64(70), counterOf(g.Kv))
	require.Equal(t, uint64(2), g.Kv.Version)
	require.Equal(t, shard, g.Shard)
	require.GreaterOrEqual(t, g.Lsn, rep.Lsn)
	require.False(t, get(t, r.client("mallory"), "{bank}alice").Found, "another principal's key space is its own")

	wrong := sessionIn(t, cc, (shard+1)%4)
	w := txn(t, cc, transfer(wrong, "t2", "{bank}alice", "{bank}bob", 1))
	require.Equal(t, clientv1.Code_WRONG_SHARD, w.Code, w.Message)
	require.Equal(t, shard, w.Shard)
	require.Equal(t, uint32(4), w.Shards)
	var a, b string
	for i := 0; a == "" || b == ""; i++ {
		k := fmt.Sprintf("k%d", i)
		if kvroute.Shard([]byte(k), 4) == shard {
			a = k
		} else {
			b = k
		}
	}
	cross := txn(t, cc, &clientv1.TxnRequest{Session: s1, RequestId: "x", Success: []*clientv1.TxnOp{
		{Kind: clientv1.TxnOp_PUT, Key: []byte(a)}, {Kind: clientv1.TxnOp_PUT, Key: []byte(b)}}})
	require.Equal(t, clientv1.Code_REFUSED, cross.Code)
	require.Contains(t, cross.Message, "hash tag")
}

// TestTxnNoOverdraftConcurrently: 20 concurrent transfers of 10 out of an
// account of 105, each "if balance > 9 then move": exactly 10 succeed,
// the balance never goes below 0, and the money is conserved.
func TestTxnNoOverdraftConcurrently(t *testing.T) {
	r := newRig(t, leader.Options{Shards: 2}, nil)
	cc := r.client("bank")
	shard := kvroute.Shard([]byte("{b}"), 2)
	s := sessionIn(t, cc, shard)
	require.Equal(t, clientv1.Code_OK, txn(t, cc, &clientv1.TxnRequest{Session: s, RequestId: "seed", Success: []*clientv1.TxnOp{
		{Kind: clientv1.TxnOp_ADD, Key: []byte("{b}from"), Delta: 105}}}).Code)
	var wg sync.WaitGroup
	var mu sync.Mutex
	moved := 0
	for i := range 20 {
		wg.Go(func() {
			rep := txn(t, cc, transfer(s, fmt.Sprintf("m%d", i), "{b}from", "{b}to", 10))
			require.Equal(t, clientv1.Code_OK, rep.Code, rep.Message)
			if rep.Result.Succeeded {
				mu.Lock()
				moved++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	require.Equal(t, 10, moved)
	require.Equal(t, int64(5), counterOf(get(t, cc, "{b}from").Kv), "the last transfer of 10 found 5: declined")
	require.Equal(t, int64(100), counterOf(get(t, cc, "{b}to").Kv))
}

// TestRejectionRecorded: a handler's RejectedError is recorded under the
// request ID: the reply is REJECTED with its code and detail, a retry
// answers the same rejection without running the handler again (so a
// declined transfer never succeeds later), and Status says REJECTED; a
// Transient one is refused and runs again on retry. An add to a key that
// is no counter is a recorded rejection too.
func TestRejectionRecorded(t *testing.T) {
	var mu sync.Mutex
	runs := map[string]int{}
	funds := false
	h := func(ctx context.Context, q clientapi.Request) ([]wal.Event, []byte, error) {
		mu.Lock()
		defer mu.Unlock()
		runs[q.RequestID]++
		switch q.RequestID {
		case "declined":
			if !funds {
				return nil, nil, fmt.Errorf("checking the balance: %w", &clientapi.RejectedError{Code: "insufficient_funds", Detail: "balance 5, need 10"})
			}
		case "later":
			if !funds {
				return nil, nil, &clientapi.RejectedError{Code: "locked", Detail: "try later", Transient: true}
			}
		}
		return []wal.Event{{Op: wal.OpAdd, Session: q.Session, Key: []byte("n"), Delta: 1}}, []byte("done"), nil
	}
	r := newRig(t, leader.Options{Shards: 1}, &clientapi.Options{Handler: h})
	cc := r.client("ann")
	sid := session.ID(openSession(t, cc, &clientv1.OpenSessionRequest{}).Session)
	for _, id := range []string{"declined", "later"} {
		rep := submit(t, cc, &clientv1.SubmitRequest{Session: sid[:], RequestId: id, Payload: []byte("p")})
		if id == "declined" {
			require.Equal(t, clientv1.Code_REJECTED, rep.Code, rep.Message)
			require.Equal(t, "insufficient_funds", rep.Rejection.GetCode())
			require.Equal(t, "balance 5, need 10", rep.Rejection.GetDetail())
		} else {
			require.Equal(t, clientv1.Code_REFUSED, rep.Code, rep.Message)
			require.Contains(t, rep.Message, "try later")
		}
	}
	mu.Lock()
	funds = true
	mu.Unlock()
	rep := submit(t, cc, &clientv1.SubmitRequest{Session: sid[:], RequestId: "declined", Payload: []byte("p")})
	require.Equal(t, clientv1.Code_REJECTED, rep.Code, "a declined request never succeeds on retry: %s", rep.Message)
	require.Equal(t, "insufficient_funds", rep.Rejection.GetCode())
	st := status(t, cc, &clientv1.StatusRequest{Session: sid[:], RequestId: "declined"})
	require.Equal(t, clientv1.Code_REJECTED, st.Code)
	require.Equal(t, "balance 5, need 10", st.Rejection.GetDetail())
	require.Equal(t, clientv1.Code_OK, submit(t, cc, &clientv1.SubmitRequest{Session: sid[:], RequestId: "later", Payload: []byte("p")}).Code)
	mu.Lock()
	require.Equal(t, map[string]int{"declined": 1, "later": 2}, runs)
	mu.Unlock()
	require.Equal(t, int64(1), r.counter(sid, "n"))

	// The key space's own rejection.
	s := sessionIn(t, cc, 0)
	require.Equal(t, clientv1.Code_OK, txn(t, cc, &clientv1.TxnRequest{Session: s, RequestId: "p", Success: []*clientv1.TxnOp{
		{Kind: clientv1.TxnOp_PUT, Key: []byte("name"), Value: []byte("ann")}}}).Code)
	add := &clientv1.TxnRequest{Session: s, RequestId: "a", Success: []*clientv1.TxnOp{{Kind: clientv1.TxnOp_ADD, Key: []byte("name"), Delta: 1}}}
	for range 2 {
		rep := txn(t, cc, add)
		require.Equal(t, clientv1.Code_REJECTED, rep.Code, rep.Message)
		require.Equal(t, "not_counter", rep.Rejection.GetCode())
	}
}

// TestReadsAreLinearizableOnTheLeader: a Get after an acknowledged write
// sees it; a Get whose MinLSN the leader has not applied answers BEHIND
// after Options.ReadWait, naming how far behind; a Range over a tagged
// prefix reads its one shard, one without a tag every shard, in key
// order, and says when more keys remain.
func TestReadsAreLinearizableOnTheLeader(t *testing.T) {
	r := newRig(t, leader.Options{Shards: 4}, &clientapi.Options{ReadWait: 50e6})
	cc := r.client("rita")
	var last uint64
	for i := range 12 {
		k := fmt.Sprintf("{u%d}/name", i%3)
		if i >= 3 {
			k = fmt.Sprintf("{u%d}/n%02d", i%3, i)
		}
		rep := txn(t, cc, &clientv1.TxnRequest{Session: sessionIn(t, cc, kvroute.Shard([]byte(k), 4)), RequestId: k,
			Success: []*clientv1.TxnOp{{Kind: clientv1.TxnOp_PUT, Key: []byte(k), Value: []byte(fmt.Sprint(i))}}})
		require.Equal(t, clientv1.Code_OK, rep.Code, rep.Message)
		g := get(t, cc, k)
		require.True(t, g.Found)
		require.Equal(t, fmt.Sprint(i), string(g.Kv.Value), "read after an acknowledged write sees it")
		require.Equal(t, rep.Result.Results[0].ModLsn, g.Kv.ModLsn, "the read sees the write's row")
		require.Less(t, g.Kv.ModLsn, rep.Lsn, "the reply's LSN ends the batch, after the row")
		last = g.Lsn
	}
	var behind clientv1.GetReply
	require.NoError(t, call(cc, clientv1.Client_Get_FullMethodName, &clientv1.GetRequest{Key: []byte("{u0}/name"), MinLsn: []*clientv1.ShardLSN{{Shard: kvroute.Shard([]byte("{u0}/name"), 4), Lsn: last + 1000}}}, &behind))
	require.Equal(t, clientv1.Code_BEHIND, behind.Code)
	require.Contains(t, behind.Message, "behind the read's minimum")

	var one clientv1.RangeReply
	require.NoError(t, call(cc, clientv1.Client_Range_FullMethodName, &clientv1.RangeRequest{Prefix: []byte("{u1}/")}, &one))
	require.Equal(t, clientv1.Code_OK, one.Code, one.Message)
	require.Len(t, one.Lsn, 1, "a tagged prefix reads one shard")
	require.Len(t, one.Kvs, 4, "%v", one.Kvs)
	var all clientv1.RangeReply
	require.NoError(t, call(cc, clientv1.Client_Range_FullMethodName, &clientv1.RangeRequest{Limit: 5}, &all))
	require.Equal(t, clientv1.Code_OK, all.Code, all.Message)
	require.Len(t, all.Kvs, 5)
	require.True(t, all.More)
	require.Equal(t, "{u0}/n03", string(all.Kvs[0].Key))
	for i := 1; i < len(all.Kvs); i++ {
		require.Less(t, string(all.Kvs[i-1].Key), string(all.Kvs[i].Key))
	}
	require.Len(t, all.Lsn, 4, "an untagged prefix reads every shard")
}

// refusingValidator is an Applier whose Validate rejects a put of "bad" by
// a business rule (a RejectedError) and of "busy" transiently; Apply keeps
// nothing (the test looks at answers and the ledger only).
type refusingValidator struct{}

func (refusingValidator) Apply(*pebble.Batch, []wal.Event) error { return nil }

func (refusingValidator) Validate(_ *pebble.Batch, events []wal.Event) error {
	for _, ev := range events {
		switch string(ev.Value) {
		case "bad":
			return &clientapi.RejectedError{Code: "bad_value", Detail: "the value may not be bad"}
		case "busy":
			return &clientapi.RejectedError{Code: "busy", Detail: "later", Transient: true}
		}
	}
	return nil
}

// TestValidatorRejectionRecorded: a Validator's RejectedError reaches the
// service wrapped in store.ErrRejected and is recorded like a handler's:
// REJECTED with its code, the same on retry, REJECTED in Status; a
// transient one is refused and not recorded.
func TestValidatorRejectionRecorded(t *testing.T) {
	r := newRig(t, leader.Options{Shards: 1, Store: store.Options{Applier: refusingValidator{}}}, nil)
	cc := r.client("val")
	sid := session.ID(openSession(t, cc, &clientv1.OpenSessionRequest{}).Session)
	for range 2 {
		rep := submit(t, cc, &clientv1.SubmitRequest{Session: sid[:], RequestId: "v1", Payload: ops(put("k", "bad"))})
		require.Equal(t, clientv1.Code_REJECTED, rep.Code, rep.Message)
		require.Equal(t, "bad_value", rep.Rejection.GetCode())
	}
	require.Equal(t, clientv1.Code_REJECTED, status(t, cc, &clientv1.StatusRequest{Session: sid[:], RequestId: "v1"}).Code)
	rep := submit(t, cc, &clientv1.SubmitRequest{Session: sid[:], RequestId: "v2", Payload: ops(put("k", "busy"))})
	require.Equal(t, clientv1.Code_REFUSED, rep.Code, rep.Message)
	require.Equal(t, clientv1.Code_UNKNOWN, status(t, cc, &clientv1.StatusRequest{Session: sid[:], RequestId: "v2"}).Code, "a transient refusal records nothing")
	require.Equal(t, clientv1.Code_OK, submit(t, cc, &clientv1.SubmitRequest{Session: sid[:], RequestId: "v3", Payload: ops(put("k", "good"))}).Code)
}
