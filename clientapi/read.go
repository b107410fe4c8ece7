package clientapi

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/oncewal/oncewal/kv"
	"github.com/oncewal/oncewal/kvroute"
	"github.com/oncewal/oncewal/leader"
	clientv1 "github.com/oncewal/oncewal/proto/oncewal/client/v1"
	"github.com/oncewal/oncewal/store"
)

// Get reads key of the caller who's key space on this leader (the package
// doc, "Reads"). It is the method behind the wire, for an embedder that
// authenticates its callers itself.
func (s *Service) Get(ctx context.Context, who string, r *clientv1.GetRequest) *clientv1.GetReply {
	key := r.GetKey()
	shard := kvroute.Shard(key, s.l.Shards())
	sh, _ := s.l.Shard(shard) // a shard kvroute gives exists
	rep := &clientv1.GetReply{Epoch: sh.Epoch(), Shard: shard}
	if err := kv.CheckRead(who, key, false, 0); err != nil {
		rep.Code, rep.Message = clientv1.Code_REFUSED, message(err.Error()+": "+remedy(clientv1.Code_REFUSED))
		return rep
	}
	var (
		row   kv.Row
		found bool
	)
	rd := s.read(ctx, sh, minLSNs(r.GetMinLsn())[shard], func(x *store.KVSnap) (err error) {
		row, found, err = x.Get(who, key)
		return err
	})
	rep.Code, rep.Lsn, rep.Message = rd.code, rd.lsn, rd.message
	if rd.code == clientv1.Code_OK && found {
		rep.Found, rep.Kv = true, &clientv1.KeyValue{Key: key, Value: row.Value, Version: row.Version, ModLsn: row.ModLSN}
	}
	return rep
}

// Range reads the caller who's keys under r's prefix on this leader, in
// key order (the package doc, "Reads"): from the prefix's shard when the
// prefix holds a complete hash tag, else from every shard, each read at
// its own applied LSN (a range over several shards is linearizable shard
// by shard, not as a whole).
func (s *Service) Range(ctx context.Context, who string, r *clientv1.RangeRequest) *clientv1.RangeReply {
	return rangeRead(who, r, s.l.Shards(), func(shard uint32, minLSN uint64, fn func(*store.KVSnap) error) (readResult, uint64) {
		sh, _ := s.l.Shard(shard)
		return s.read(ctx, sh, minLSN, fn), sh.Epoch()
	})
}

// rangeShards are the shards a Range of prefix reads: the prefix's own
// when it holds a complete hash tag, else every one of the n.
func rangeShards(prefix []byte, n int) []uint32 {
	if one, ok := kvroute.PrefixShard(prefix, n); ok {
		return []uint32{one}
	}
	shards := make([]uint32, n)
	for i := range shards {
		shards[i] = uint32(i)
	}
	return shards
}

// minLSNs is a read's min_lsn by shard (the highest given for each).
func minLSNs(pairs []*clientv1.ShardLSN) map[uint32]uint64 {
	mins := map[uint32]uint64{}
	for _, m := range pairs {
		mins[m.GetShard()] = max(mins[m.GetShard()], m.GetLsn())
	}
	return mins
}

// rangeRead answers a Range of who's keys over n shards, each shard read
// by read (its result, and the epoch to report), merged in key order.
func rangeRead(who string, r *clientv1.RangeRequest, n int, read func(shard uint32, minLSN uint64, fn func(*store.KVSnap) error) (readResult, uint64)) *clientv1.RangeReply {
	rep := &clientv1.RangeReply{}
	limit := int(min(r.GetLimit(), uint32(kv.MaxRangeLimit+1)))
	if err := kv.CheckRead(who, r.GetPrefix(), true, limit); err != nil {
		rep.Code, rep.Message = clientv1.Code_REFUSED, message(err.Error()+": "+remedy(clientv1.Code_REFUSED))
		return rep
	}
	if limit == 0 {
		limit = kv.MaxRangeLimit
	}
	shards := rangeShards(r.GetPrefix(), n)
	mins := minLSNs(r.GetMinLsn())
	for _, shard := range shards {
		var (
			pairs []store.KVPair
			more  bool
		)
		rd, epoch := read(shard, mins[shard], func(x *store.KVSnap) (err error) {
			pairs, more, err = x.Range(who, r.GetPrefix(), limit)
			return err
		})
		rep.Epoch = max(rep.Epoch, epoch)
		if rd.code != clientv1.Code_OK {
			return &clientv1.RangeReply{Code: rd.code, Epoch: rep.Epoch, Leader: rd.leader, Message: message(fmt.Sprintf("shard %d: %s", shard, rd.message))}
		}
		rep.Lsn = append(rep.Lsn, &clientv1.ShardLSN{Shard: shard, Lsn: rd.lsn})
		rep.More = rep.More || more
		for _, p := range pairs {
			rep.Kvs = append(rep.Kvs, &clientv1.KeyValue{Key: p.Key, Value: p.Row.Value, Version: p.Row.Version, ModLsn: p.Row.ModLSN})
		}
	}
	if len(shards) > 1 {
		slices.SortFunc(rep.Kvs, func(a, b *clientv1.KeyValue) int { return bytes.Compare(a.Key, b.Key) })
	}
	if len(rep.Kvs) > limit {
		rep.Kvs, rep.More = rep.Kvs[:limit], true
	}
	rep.Code = clientv1.Code_OK
	return rep
}

// readResult is how one shard's read ended: OK at lsn, or the code and
// message to answer.
type readResult struct {
	code    clientv1.Code
	lsn     uint64
	message string
	leader  string // a replica's BEHIND or NOT_LEADER: where the leader is
}

// read runs fn on one snapshot of sh's key space once the shard has
// applied minLSN (waiting up to Options.ReadWait: BEHIND after it), then
// waits until the state it read is acknowledged under Options.MinAck and
// answers only while this node still leads (invariant 8): what it read is
// then every write acknowledged before the read began, and nothing a
// failover could undo.
func (s *Service) read(ctx context.Context, sh *leader.Shard, minLSN uint64, fn func(*store.KVSnap) error) readResult {
	if err := s.leading(); err != nil {
		return readResult{code: clientv1.Code_NOT_LEADER, message: notLeadingMessage(err)}
	}
	applied := func() uint64 { a, _ := sh.Position(); return a }
	if err := waitApplied(ctx, applied, sh.ID(), minLSN, s.opts.ReadWait); err != nil {
		return notCaughtUp(err, applied())
	}
	var lsn uint64
	if rd := snapRead(sh.Store(), func(x *store.KVSnap) error {
		lsn = x.AppliedLSN()
		return fn(x)
	}); rd.code != clientv1.Code_OK {
		return rd
	}
	if err := s.waitAck(ctx, sh, lsn, s.opts.MinAck); err != nil {
		return readResult{code: clientv1.Code_UNAVAILABLE, message: message(fmt.Sprintf(
			"the read at LSN %d of shard %d is not acknowledged under ack policy %v: %v; read again", lsn, sh.ID(), AckName(s.opts.MinAck), err))}
	}
	if err := s.leading(); err != nil {
		return readResult{code: clientv1.Code_NOT_LEADER, message: notLeadingMessage(err)}
	}
	return readResult{code: clientv1.Code_OK, lsn: lsn}
}

// snapRead runs fn on one snapshot of st's key space (store.KVRead): OK,
// or the code and message of its error — REFUSED for a read the key space
// refuses, UNAVAILABLE for a store that cannot be read.
func snapRead(st *store.Store, fn func(*store.KVSnap) error) readResult {
	err := st.KVRead(fn)
	if err == nil {
		return readResult{code: clientv1.Code_OK}
	}
	code := clientv1.Code_UNAVAILABLE
	if errors.Is(err, kv.ErrInvalidRead) || errors.Is(err, kv.ErrInvalidPrincipal) {
		code = clientv1.Code_REFUSED
	}
	return readResult{code: code, message: message(err.Error() + ": " + remedy(code))}
}

// errBehind: a replica has not applied a read's MinLSN within the wait.
var errBehind = errors.New("clientapi: behind the read's minimum LSN")

// notCaughtUp answers a read whose shard, at applied, did not reach its
// MinLSN (waitApplied's err): BEHIND after the wait, UNAVAILABLE when the
// caller gave up first.
func notCaughtUp(err error, applied uint64) readResult {
	code := clientv1.Code_UNAVAILABLE
	if errors.Is(err, errBehind) {
		code = clientv1.Code_BEHIND
	}
	return readResult{code: code, lsn: applied, message: message(err.Error())}
}

// waitApplied polls applied until it reaches minLSN, for at most wait.
func waitApplied(ctx context.Context, applied func() uint64, shard uint32, minLSN uint64, wait time.Duration) error {
	if applied() >= minLSN {
		return nil
	}
	deadline := time.Now().Add(wait)
	for d := 100 * time.Microsecond; ; d = min(2*d, 10*time.Millisecond) {
		at := applied()
		switch {
		case at >= minLSN:
			return nil
		case !time.Now().Before(deadline):
			return fmt.Errorf("%w: shard %d has applied LSN %d, %d behind the read's minimum %d after waiting %v: read from another replica or the leader",
				errBehind, shard, at, minLSN-at, minLSN, wait)
		}
		t := time.NewTimer(min(d, time.Until(deadline)))
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("waiting for shard %d to apply LSN %d (at %d): %w", shard, minLSN, at, ctx.Err())
		case <-t.C:
		}
	}
}
