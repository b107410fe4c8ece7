package clientapi

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/protobuf/proto"

	"github.com/oncewal/oncewal/idempotency"
	"github.com/oncewal/oncewal/kv"
	clientv1 "github.com/oncewal/oncewal/proto/oncewal/client/v1"
	"github.com/oncewal/oncewal/wal"
)

// Txn runs r, a conditional transaction on the caller's keys (package kv),
// once for the caller named who and returns the reply (the package doc,
// "Txn"). It is the method behind the wire, for an embedder that
// authenticates its callers itself.
func (s *Service) Txn(ctx context.Context, who string, r *clientv1.TxnRequest) *clientv1.TxnReply {
	sid := sessionID(r.GetSession())
	sh := s.l.For(sid)
	var (
		txn   *kv.Txn
		shard uint32
	)
	check := func() error {
		var err error
		if txn, err = txnOf(who, r); err != nil {
			return err
		}
		if shard, err = txn.Shard(s.l.Shards()); err != nil {
			return fmt.Errorf("%w: %w", errRefused, err)
		}
		if shard != sh.ID() {
			return fmt.Errorf("%w: the transaction's keys are in shard %d, its session in shard %d", errWrongShard, shard, sh.ID())
		}
		return nil
	}
	a := s.once(ctx, sh, request{who: who, sid: sid, id: r.GetRequestId(), action: r.GetAction(), ack: r.GetAck(), fingerprint: txnFingerprint(r)},
		check,
		func(c *idempotency.Claim) (wal.Header, []byte, error) {
			return sh.CommitResolved(c, func(rd kv.Reader, first uint64) ([]wal.Event, []byte, error) {
				events, res, err := kv.Resolve(rd, who, txn, sid, first)
				if err != nil {
					return nil, nil, kvRejection(err)
				}
				return events, encodeResult(res), nil
			})
		})
	rep := &clientv1.TxnReply{Code: a.code, Lsn: a.lsn, Epoch: a.epoch, Message: a.message, Ack: a.ack, Rejection: a.rejection,
		Shard: shard, Shards: uint32(s.l.Shards())}
	switch a.code {
	case clientv1.Code_OK, clientv1.Code_REPLAY:
		var res clientv1.TxnResult
		if err := proto.Unmarshal(a.outcome, &res); err != nil {
			// Recorded by this service: only a corrupt ledger row gets here.
			return &clientv1.TxnReply{Code: clientv1.Code_UNAVAILABLE, Epoch: a.epoch, Message: message(fmt.Sprintf(
				"request %q ran, but its recorded outcome does not decode (%v): retry with the same request ID, or ask its Status", r.GetRequestId(), err))}
		}
		rep.Result = &res
	}
	return rep
}

// errWrongShard: a transaction's session is not of its keys' shard.
var errWrongShard = errors.New("clientapi: wrong shard")

// txnFingerprint is what a retry of r must repeat: its compares and ops,
// serialized deterministically (the session, the ack policy and the action
// may change between attempts).
func txnFingerprint(r *clientv1.TxnRequest) []byte {
	b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(&clientv1.TxnRequest{
		Compares: r.GetCompares(), Success: r.GetSuccess(), Failure: r.GetFailure()})
	return b
}

// txnOf checks r's fields and makes its transaction; an error wraps
// errRefused and names every problem.
func txnOf(who string, r *clientv1.TxnRequest) (*kv.Txn, error) {
	errs := checkRequest(r.GetSession(), r.GetAck(), r.GetAction())
	if err := kv.CheckPrincipal(who); err != nil {
		errs = append(errs, err)
	}
	t := &kv.Txn{}
	for _, c := range r.GetCompares() {
		t.If = append(t.If, kv.Compare{Key: c.GetKey(), Target: kv.Target(enum(c.GetTarget())), Result: kv.CompareResult(enum(c.GetResult())),
			Value: c.GetValue(), Number: c.GetNumber(), Counter: c.GetCounter()})
	}
	ops := func(in []*clientv1.TxnOp) []kv.Op {
		var out []kv.Op
		for _, o := range in {
			out = append(out, kv.Op{Kind: kv.OpKind(enum(o.GetKind())), Key: o.GetKey(), Value: o.GetValue(), Delta: o.GetDelta()})
		}
		return out
	}
	t.Then, t.Else = ops(r.GetSuccess()), ops(r.GetFailure())
	if err := t.Validate(); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("%w: %w", errRefused, errors.Join(errs...))
	}
	return t, nil
}

// enum is a wire enum's number as kv's uint8 kinds take it; a number out
// of their range becomes 0, which kv refuses as invalid (never a kind it
// wraps around to).
func enum[E ~int32](e E) uint8 {
	if e < 0 || e > 255 {
		return 0
	}
	return uint8(e)
}

// encodeResult is a transaction's recorded outcome: its clientv1.TxnResult,
// serialized deterministically.
func encodeResult(res kv.Result) []byte {
	out := &clientv1.TxnResult{Succeeded: res.Succeeded}
	for _, o := range res.Ops {
		out.Results = append(out.Results, &clientv1.TxnOpResult{Kind: clientv1.TxnOp_Kind(o.Kind), Found: o.Found, Value: o.Value,
			Version: o.Version, ModLsn: o.ModLSN})
	}
	b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(out) // bytes and numbers only: cannot fail
	return b
}
