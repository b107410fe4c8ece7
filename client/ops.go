package client

import "github.com/oncewal/oncewal/internal/clientwire"

// Op is one operation of the default payload: a node without a handler of
// its own logs one event per op, in order, in the client's session. Make
// them with Put, Add and Delete.
type Op struct{ op clientwire.Op }

// Put sets key to value.
func Put(key, value []byte) Op {
	return Op{clientwire.Op{Kind: clientwire.OpPut, Key: key, Value: value}}
}

// Add adds delta to the integer at key.
func Add(key []byte, delta int64) Op {
	return Op{clientwire.Op{Kind: clientwire.OpAdd, Key: key, Delta: delta}}
}

// Delete deletes key.
func Delete(key []byte) Op { return Op{clientwire.Op{Kind: clientwire.OpDelete, Key: key}} }

// MaxOps bounds the ops of one payload.
const MaxOps = clientwire.MaxOps

// Ops returns the default payload of ops, for Submit. The node refuses
// (ErrRefused) a payload without ops, with more than MaxOps, or with an
// empty key.
func Ops(ops ...Op) []byte {
	w := make([]clientwire.Op, len(ops))
	for i, op := range ops {
		w[i] = op.op
	}
	return clientwire.AppendOps(nil, w)
}
