package client

import (
	"context"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/peer"

	"github.com/oncewal/oncewal/kvroute"
	clientv1 "github.com/oncewal/oncewal/proto/oncewal/client/v1"
)

// Txn is a conditional transaction on the principal's keys, etcd's model:
// if every compare of If holds (an empty If holds), Then runs, else Else;
// each op sees the ones before it. Every key of a transaction must lie in
// one shard: give keys that change together a common hash tag, such as
// {acct:alice} in "{acct:alice}/balance" (package kvroute).
type Txn struct {
	If         []Cmp
	Then, Else []TxnOp
}

// Cmp is one compare of a transaction's If; make it with Value, Counter,
// Version, ModLSN, Exists or Missing.
type Cmp struct{ c *clientv1.Compare }

// CmpOp relates a key's target to an operand: "=", "!=", "<" or ">".
type CmpOp string

var cmpOps = map[CmpOp]clientv1.Compare_Result{"=": clientv1.Compare_EQUAL, "!=": clientv1.Compare_NOT_EQUAL,
	"<": clientv1.Compare_LESS, ">": clientv1.Compare_GREATER}

// Value compares key's value with v, bytewise ("=", "!=", "<", ">"); it is
// false for a missing key, whatever op.
func Value(key []byte, op CmpOp, v []byte) Cmp {
	return Cmp{&clientv1.Compare{Key: key, Target: clientv1.Compare_VALUE, Result: cmpOps[op], Value: v}}
}

// Version compares key's version (0: missing; 1 when created, + 1 with
// every put) with n.
func Version(key []byte, op CmpOp, n uint64) Cmp {
	return Cmp{&clientv1.Compare{Key: key, Target: clientv1.Compare_VERSION, Result: cmpOps[op], Number: n}}
}

// ModLSN compares the LSN of key's last write (0: missing) with lsn.
func ModLSN(key []byte, op CmpOp, lsn uint64) Cmp {
	return Cmp{&clientv1.Compare{Key: key, Target: clientv1.Compare_MOD_LSN, Result: cmpOps[op], Number: lsn}}
}

// Counter compares key's counter (as OpAdd keeps it; 0 when absent) with
// n as signed numbers: "no overdraft" is If(Counter(balance, ">", amount-1)).
// A key holding no counter fails it.
func Counter(key []byte, op CmpOp, n int64) Cmp {
	return Cmp{&clientv1.Compare{Key: key, Target: clientv1.Compare_COUNTER, Result: cmpOps[op], Counter: n}}
}

// Exists holds when key exists.
func Exists(key []byte) Cmp {
	return Cmp{&clientv1.Compare{Key: key, Target: clientv1.Compare_EXISTS, Result: clientv1.Compare_EQUAL, Number: 1}}
}

// Missing holds when key does not exist.
func Missing(key []byte) Cmp {
	return Cmp{&clientv1.Compare{Key: key, Target: clientv1.Compare_EXISTS, Result: clientv1.Compare_EQUAL}}
}

// TxnOp is one op of a transaction's branch; make it with OpPut, OpAdd,
// OpDelete or OpGet.
type TxnOp struct{ o *clientv1.TxnOp }

// OpPut sets key to value.
func OpPut(key, value []byte) TxnOp {
	return TxnOp{&clientv1.TxnOp{Kind: clientv1.TxnOp_PUT, Key: key, Value: value}}
}

// OpAdd adds delta to key's counter: 8 bytes, little-endian int64, 0 when
// absent. A key holding another value rejects the transaction
// (RejectedError "not_counter"), and so does an overflow ("overflow").
func OpAdd(key []byte, delta int64) TxnOp {
	return TxnOp{&clientv1.TxnOp{Kind: clientv1.TxnOp_ADD, Key: key, Delta: delta}}
}

// OpDelete deletes key (nothing if absent).
func OpDelete(key []byte) TxnOp {
	return TxnOp{&clientv1.TxnOp{Kind: clientv1.TxnOp_DELETE, Key: key}}
}

// OpGet reads key as the transaction sees it.
func OpGet(key []byte) TxnOp { return TxnOp{&clientv1.TxnOp{Kind: clientv1.TxnOp_GET, Key: key}} }

// TxnResult is a transaction's answer.
type TxnResult struct {
	// Succeeded: the compares held and Then ran (else Else ran).
	Succeeded bool
	// Ops holds one result per op of the branch that ran, in order.
	Ops []OpResult
	// LSN is the batch that logged the transaction (a replay: the log's
	// end when the retry came, which covers it); pass it as MinLSN to read
	// your writes from any replica.
	LSN uint64
	// Shard is the shard of the transaction's keys; Epoch the leader's.
	Shard uint32
	Epoch uint64
	// Replayed: an earlier attempt ran it; this is its recorded answer.
	Replayed bool
}

// OpResult is one op's answer. Found: the key existed before the op.
// Value: a get's value, an add's new counter. Version and ModLSN: a get's
// row; a put's or add's new version and the LSN of its write.
type OpResult struct {
	Found   bool
	Value   []byte
	Version uint64
	ModLSN  uint64
}

// KeyValue is one key as a read found it.
type KeyValue struct {
	Key, Value []byte
	// Version is 1 when the key was created, + 1 with every put since;
	// ModLSN the LSN of its last write.
	Version, ModLSN uint64
}

// Txn runs t once on the leader of its keys' shard, as requestID, retrying
// under the budget with the same ID (invariant 1); a retry of a completed
// transaction answers its recorded result (Replayed). Errors: those of
// Submit, and *RejectedError (ErrRejected) when a rule of the key space
// rejected it (an add to a key that is no counter), recorded as its
// answer.
func (c *Client) Txn(ctx context.Context, requestID string, t Txn, opts ...SubmitOption) (TxnResult, error) {
	sub := clientv1.SubmitRequest{RequestId: requestID, Ack: c.opts.Ack.wire()}
	for _, o := range opts {
		o(&sub)
	}
	if err := checkRequest(&sub); err != nil {
		return TxnResult{}, err
	}
	req := clientv1.TxnRequest{RequestId: requestID, Action: sub.Action, Ack: sub.Ack}
	var keys [][]byte
	for _, cmp := range t.If {
		if cmp.c == nil || cmp.c.Result == clientv1.Compare_RESULT_UNSPECIFIED {
			return TxnResult{}, fmt.Errorf("%w: not sent: a compare that is zero, or whose op is not =, !=, < or >", ErrRefused)
		}
		req.Compares = append(req.Compares, cmp.c)
		keys = append(keys, cmp.c.Key)
	}
	for _, branch := range []struct {
		ops []TxnOp
		out *[]*clientv1.TxnOp
	}{{t.Then, &req.Success}, {t.Else, &req.Failure}} {
		for _, op := range branch.ops {
			if op.o == nil {
				return TxnResult{}, fmt.Errorf("%w: not sent: a zero TxnOp", ErrRefused)
			}
			*branch.out = append(*branch.out, op.o)
			keys = append(keys, op.o.Key)
		}
	}
	if len(keys) == 0 {
		return TxnResult{}, fmt.Errorf("%w: not sent: a transaction without compares or ops", ErrRefused)
	}
	var res TxnResult
	var expired *sessionID
	err := c.run(ctx, fmt.Sprintf("txn %q", requestID), func(ctx context.Context, addr string) step {
		cc, err := c.conn(addr)
		if err != nil {
			return connStep(addr, err)
		}
		ss, s, ok := c.keysSession(ctx, cc, addr, keys[0])
		if !ok {
			return s
		}
		sid, s, ok := ss.get(ctx, c, cc, addr, expired)
		if !ok {
			return s
		}
		req.Session = sid[:]
		var p peer.Peer
		rep, err := clientv1.NewClientClient(cc).Txn(c.callContext(ctx), &req, grpc.Peer(&p))
		if err != nil {
			return rpcStep(addr, err, p.Addr != nil)
		}
		switch rep.GetCode() {
		case clientv1.Code_OK, clientv1.Code_REPLAY:
			if rep.GetCode() == clientv1.Code_OK {
				ss.used(sid)
			}
			res = TxnResult{Succeeded: rep.GetResult().GetSucceeded(), LSN: rep.GetLsn(), Shard: ss.shard, Epoch: rep.GetEpoch(),
				Replayed: rep.GetCode() == clientv1.Code_REPLAY}
			for _, o := range rep.GetResult().GetResults() {
				res.Ops = append(res.Ops, OpResult{Found: o.GetFound(), Value: o.GetValue(), Version: o.GetVersion(), ModLSN: o.GetModLsn()})
			}
			return step{v: vDone, epoch: rep.GetEpoch()}
		case clientv1.Code_WRONG_SHARD:
			// The cluster's shard count is not the one this client knew:
			// learn it and open the right shard's session (nothing ran).
			c.learnShards(rep.GetShards())
			return step{v: vMove, addr: addr, err: fmt.Errorf("%s: the keys are in shard %d of %d: %s", addr, rep.GetShard(), rep.GetShards(), rep.GetMessage())}
		}
		return writeStep(addr, requestID, req.GetAction(), rep, sid, &expired)
	})
	if err != nil {
		return TxnResult{}, err
	}
	return res, nil
}

// keysSession is the session of key's shard (invariant 10); when the
// cluster's shard count is not known yet, the Client's first session, at
// addr, says it.
func (c *Client) keysSession(ctx context.Context, cc *grpc.ClientConn, addr string, key []byte) (*sessions, step, bool) {
	shards := c.knownShards()
	if shards == 0 {
		if _, s, ok := c.sess.get(ctx, c, cc, addr, nil); !ok {
			return nil, s, false
		}
		if shards = c.knownShards(); shards == 0 {
			return nil, step{v: vMove, err: fmt.Errorf("%s did not say how many shards the cluster has", addr)}, false
		}
	}
	return c.shardSession(kvroute.Shard(key, int(shards))), step{}, true
}

// ReadOption adjusts one Get or Range.
type ReadOption func(*readOptions)

type readOptions struct {
	minLSN  map[uint32]uint64
	replica string
}

// MinLSN lets a replica at or past lsn in shard answer (read-your-writes:
// a TxnResult's LSN and Shard), where a read without it is linearizable
// and answered by the leader alone.
func MinLSN(shard uint32, lsn uint64) ReadOption {
	return func(o *readOptions) {
		if o.minLSN == nil {
			o.minLSN = map[uint32]uint64{}
		}
		o.minLSN[shard] = max(o.minLSN[shard], lsn)
	}
}

// FromReplica sends a read at a MinLSN first to the replica at addr (a
// follower's client address; any node's), which answers it from its own
// store once it has applied the MinLSN of every shard the read reads
// (read-your-writes, not linearizable). A replica still behind after its
// bounded wait answers BEHIND, and the read moves on to the leader (the
// one calls start at, else the one the replica names, else the next known
// address); so does a read the replica cannot serve. Without MinLSN — or
// before the Client knows the cluster's shard count (its first session
// tells it), for a Get — the read goes to the leader as if without
// FromReplica. An answer from addr is no proof that it leads: calls do
// not start there.
func FromReplica(addr string) ReadOption {
	return func(o *readOptions) { o.replica = addr }
}

// Get reads key: its row and whether it exists. Without MinLSN it is a
// linearizable read on the leader: it sees every write acknowledged
// before it began. With MinLSN it may be answered by any replica at or
// past it (FromReplica). It runs nothing, so it never ends with
// ErrOutcomeUnknown.
func (c *Client) Get(ctx context.Context, key []byte, opts ...ReadOption) (KeyValue, bool, error) {
	var o readOptions
	for _, f := range opts {
		f(&o)
	}
	var (
		kv    KeyValue
		found bool
	)
	// Every pair goes: the node applies its key's shard's, so the Client
	// need not know the shard count. A read may go to a replica when the
	// key's shard has one (or, the count unknown, when any shard has).
	req := &clientv1.GetRequest{Key: key}
	for shard, lsn := range o.minLSN {
		req.MinLsn = append(req.MinLsn, &clientv1.ShardLSN{Shard: shard, Lsn: lsn})
	}
	atReplica := len(req.MinLsn) > 0
	if shards := c.knownShards(); shards > 0 {
		atReplica = o.minLSN[kvroute.Shard(key, int(shards))] > 0
	}
	first := ""
	if atReplica {
		first = o.replica
	}
	err := c.runFrom(ctx, fmt.Sprintf("get %q", key), first, func(ctx context.Context, addr string) step {
		cc, err := c.conn(addr)
		if err != nil {
			return connStep(addr, err)
		}
		rep, err := clientv1.NewClientClient(cc).Get(c.callContext(ctx), req)
		if err != nil {
			return rpcStep(addr, err, false)
		}
		if s, ok := c.readStep(addr, atReplica, rep.GetCode(), rep.GetLeader(), rep.GetEpoch(), rep.GetMessage()); !ok {
			return s
		}
		found = rep.GetFound()
		if found {
			kv = KeyValue{Key: rep.GetKv().GetKey(), Value: rep.GetKv().GetValue(), Version: rep.GetKv().GetVersion(), ModLSN: rep.GetKv().GetModLsn()}
		}
		return step{v: vDone, epoch: rep.GetEpoch(), replica: atReplica}
	})
	if err != nil {
		return KeyValue{}, false, err
	}
	return kv, found, nil
}

// Range reads the keys that start with prefix, in key order, at most limit
// (0: the node's maximum, 10,000); more says keys remain after the last.
// A prefix with a complete hash tag reads its one shard, linearizably
// (without MinLSN); any other reads every shard, each linearizably. With
// a MinLSN for every shard it reads, any replica at or past them may
// answer (FromReplica); one shard without is the leader's to read.
func (c *Client) Range(ctx context.Context, prefix []byte, limit int, opts ...ReadOption) (kvs []KeyValue, more bool, err error) {
	if limit < 0 || limit > 1<<31-1 {
		return nil, false, fmt.Errorf("%w: not sent: limit %d", ErrRefused, limit)
	}
	var o readOptions
	for _, f := range opts {
		f(&o)
	}
	req := &clientv1.RangeRequest{Prefix: prefix, Limit: uint32(limit)}
	for shard, lsn := range o.minLSN {
		req.MinLsn = append(req.MinLsn, &clientv1.ShardLSN{Shard: shard, Lsn: lsn})
	}
	first := ""
	if len(req.MinLsn) > 0 {
		first = o.replica
	}
	err = c.runFrom(ctx, fmt.Sprintf("range %q", prefix), first, func(ctx context.Context, addr string) step {
		cc, err := c.conn(addr)
		if err != nil {
			return connStep(addr, err)
		}
		rep, err := clientv1.NewClientClient(cc).Range(c.callContext(ctx), req)
		if err != nil {
			return rpcStep(addr, err, false)
		}
		if s, ok := c.readStep(addr, len(req.MinLsn) > 0, rep.GetCode(), rep.GetLeader(), rep.GetEpoch(), rep.GetMessage()); !ok {
			return s
		}
		kvs, more = kvs[:0], rep.GetMore()
		for _, kv := range rep.GetKvs() {
			kvs = append(kvs, KeyValue{Key: kv.GetKey(), Value: kv.GetValue(), Version: kv.GetVersion(), ModLSN: kv.GetModLsn()})
		}
		return step{v: vDone, epoch: rep.GetEpoch(), replica: len(req.MinLsn) > 0}
	})
	if err != nil {
		return nil, false, err
	}
	return kvs, more, nil
}

// readStep handles a read's answer: ok for an OK to take. BEHIND moves
// on to the leader (the one calls start at, else the one the reply names,
// else the next known address); so does an OK of a read at a MinLSN
// (atMin) whose epoch is below the highest this Client has seen: the
// replica has applied nothing of the current leader's term and may hold
// an older term's tail, which an LSN alone does not tell from the write
// the MinLSN names. The rest as every method's.
func (c *Client) readStep(addr string, atMin bool, code clientv1.Code, leader string, epoch uint64, msg string) (step, bool) {
	if code == clientv1.Code_OK {
		_, seen := c.Leader()
		if !atMin || epoch >= seen {
			return step{}, true
		}
		code, msg = clientv1.Code_BEHIND, fmt.Sprintf("its state is of epoch %d, below the leader epoch %d this client has seen", epoch, seen)
	}
	if code == clientv1.Code_BEHIND {
		next, _ := c.Leader()
		if next == "" || next == addr {
			next = leader
		}
		if next == addr {
			next = ""
		}
		return step{v: vMove, addr: next, err: fmt.Errorf("%s is behind the read's minimum LSN: %s", addr, msg)}, false
	}
	return replyStep(addr, code, leader, epoch, msg, false), false
}
