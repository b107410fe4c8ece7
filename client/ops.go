package client

import (
	"google.golang.org/protobuf/proto"

	clientv1 "github.com/oncewal/oncewal/proto/oncewal/client/v1"
)

// Op is one operation of the default payload of Submit: a node without a
// handler of its own logs one event per op, in order, in the client's
// session, and keeps its keys in that session's state — another process of
// the principal has another session, and other keys. Keys every client of
// the principal shares are Txn's (OpPut, OpAdd, OpDelete, OpGet). Make
// them with Put, Add and Delete.
type Op struct{ op *clientv1.Op }

// Put sets key to value.
func Put(key, value []byte) Op {
	return Op{&clientv1.Op{Kind: clientv1.Op_PUT, Key: key, Value: value}}
}

// Add adds delta to the integer at key.
func Add(key []byte, delta int64) Op {
	return Op{&clientv1.Op{Kind: clientv1.Op_ADD, Key: key, Delta: delta}}
}

// Delete deletes key.
func Delete(key []byte) Op { return Op{&clientv1.Op{Kind: clientv1.Op_DELETE, Key: key}} }

// MaxOps bounds the ops of one payload.
const MaxOps = clientv1.MaxOps

// Ops returns the default payload of ops (a clientv1.Ops message), for
// Submit. The node refuses (ErrRefused) a payload without ops, with more
// than MaxOps, or with an empty key.
func Ops(ops ...Op) []byte {
	m := &clientv1.Ops{Ops: make([]*clientv1.Op, len(ops))}
	for i, op := range ops {
		if m.Ops[i] = op.op; op.op == nil { // a zero Op: an op the node refuses
			m.Ops[i] = &clientv1.Op{}
		}
	}
	// Deterministic: a retry's payload must be byte for byte the first
	// attempt's (the ledger fingerprints it). Marshal fails only on a nil
	// element or a string that is not UTF-8, neither of which Ops has; an
	// empty payload would be refused (no ops) all the same.
	b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	return b
}
