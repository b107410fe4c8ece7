package leader

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/store"
)

// Candidate is one store of one shard as a promotion weighs it: who holds
// it and the position its hello would state. The promotion policy (Rank)
// reads nothing else, so it runs on what a caller read from stopped stores
// (oncewal promote, inspect), from paused followers (sim) or heard from
// nodes (a failover controller).
type Candidate struct {
	// Holder is who would be promoted with this store: a directory named to
	// promote or inspect, a node. A holder's candidates are its stores, one
	// per shard it holds.
	Holder string
	// Name names this store in answers and errors (a store directory);
	// "" stands for Holder.
	Name  string
	Shard uint32
	// Pos is the store's position: its committed Epoch, AppliedLSN and
	// LastBatch (store.ReadPosition, Receiver.Hello); the other
	// fields of an Ack are not read.
	Pos replication.Ack
	// Unknown: the store's position could not be read. It is compared with
	// nothing, never most advanced, and while any candidate is Unknown no
	// holder is Leader or Promote: the unread store might be ahead.
	Unknown bool
}

func (c Candidate) name() string {
	if c.Name == "" {
		return c.Holder
	}
	return c.Name
}

// Ranking is the promotion policy's answer for a set of candidates (the
// rules: Promotion in the package doc). Candidate indexes refer to the
// slice given to Rank, whose order breaks every tie.
type Ranking struct {
	cands []Candidate
	// Shards holds every shard some candidate holds, ascending.
	Shards []ShardRank
	// MostAdvanced[i] reports whether no candidate of candidate i's shard
	// is ahead of it (false for an Unknown one).
	MostAdvanced []bool
	// Holders lists every holder in the order of its first candidate, with
	// the number of shards it is most advanced on.
	Holders []HolderRank
	// Leader is the first holder that is most advanced on every shard: the
	// one to promote as it is. "" when none is (a promotion then needs
	// copies: Promote) or a position is Unknown.
	Leader string
	// Promote is the holder to promote: Leader, else the first holder of a
	// store of every shard that is most advanced on the most shards, whose
	// other stores must first be replaced by copies of their shards' Best
	// (the fewest copies). "" when a position is Unknown or no holder holds
	// every shard.
	Promote string
	// Seen is the highest epoch any candidate holds — its committed epoch
	// or its last batch's — and SeenBy names the first candidate holding
	// it ("" when Seen is 0). A promotion must go above it (Epoch).
	Seen   uint64
	SeenBy string
}

// ShardRank is one shard's answer.
type ShardRank struct {
	Shard uint32
	// Leaders are the candidates of the shard that no other is ahead of,
	// in the order given; they are level (store.ComparePositions
	// answers 0 between any two of them). Empty when none was read.
	Leaders []int
	// Best is Leaders[0], the store this shard's history continues (-1
	// when Leaders is empty).
	Best int
	// Diverged: two Leaders stand level but name different last batches,
	// both known — histories that cannot both be the shard's (two leaders
	// at one epoch). The order does not tell them apart; Rank still names
	// Best, as oncewal promote always has, and leaves stopping to the
	// caller.
	Diverged bool
}

// HolderRank is one holder's answer.
type HolderRank struct {
	Holder string
	// Shards is how many shards it holds a store of, Leads how many of
	// them it is most advanced on (by its first store of each).
	Shards, Leads int
}

// Rank applies the promotion policy to cands, the stores of one or more
// shards. Stores of a shard are ordered by store.ComparePositions
// (the last batch's epoch, then the applied LSN); a holder leads a shard
// when no candidate of that shard is ahead of its store there, and leads
// as a whole (Leader) when it leads every shard any candidate holds.
// Ties go to the earlier candidate. Rank does no I/O and never fails.
func Rank(cands []Candidate) Ranking {
	r := Ranking{cands: cands, MostAdvanced: make([]bool, len(cands))}
	unknown := false
	for i, c := range cands {
		if c.Unknown {
			unknown = true
			continue
		}
		if e := max(c.Pos.Epoch, c.Pos.LastBatch.Epoch); e > r.Seen {
			r.Seen, r.SeenBy = e, c.name()
		}
		r.MostAdvanced[i] = len(r.Ahead(i)) == 0
	}
	for i := range cands {
		r.addToShard(i)
		r.addToHolder(i)
	}
	slices.SortFunc(r.Shards, func(a, b ShardRank) int { return cmp.Compare(a.Shard, b.Shard) })
	if !unknown {
		r.choose()
	}
	return r
}

func (r *Ranking) addToShard(i int) {
	c := r.cands[i]
	k := slices.IndexFunc(r.Shards, func(s ShardRank) bool { return s.Shard == c.Shard })
	if k < 0 {
		r.Shards = append(r.Shards, ShardRank{Shard: c.Shard, Best: -1})
		k = len(r.Shards) - 1
	}
	if !r.MostAdvanced[i] {
		return
	}
	s := &r.Shards[k]
	if len(s.Leaders) == 0 {
		s.Best = i
	}
	for _, j := range s.Leaders {
		a, b := c.Pos.LastBatch, r.cands[j].Pos.LastBatch
		s.Diverged = s.Diverged || !a.IsZero() && !b.IsZero() && a != b
	}
	s.Leaders = append(s.Leaders, i)
}

func (r *Ranking) addToHolder(i int) {
	c := r.cands[i]
	h := slices.IndexFunc(r.Holders, func(h HolderRank) bool { return h.Holder == c.Holder })
	if h < 0 {
		r.Holders = append(r.Holders, HolderRank{Holder: c.Holder})
		h = len(r.Holders) - 1
	}
	if slices.ContainsFunc(r.cands[:i], func(o Candidate) bool { return o.Holder == c.Holder && o.Shard == c.Shard }) {
		return // a holder named twice: its first store of the shard speaks for it
	}
	r.Holders[h].Shards++
	if r.MostAdvanced[i] {
		r.Holders[h].Leads++
	}
}

// choose sets Leader and Promote; every position is known.
func (r *Ranking) choose() {
	best := -1
	for i, h := range r.Holders {
		if h.Shards < len(r.Shards) {
			continue // a copy replaces a store; it does not add a shard
		}
		if best < 0 || h.Leads > r.Holders[best].Leads {
			best = i
		}
		if r.Leader == "" && h.Leads == len(r.Shards) {
			r.Leader = h.Holder
		}
	}
	if best >= 0 {
		r.Promote = r.Holders[best].Holder
	}
}

// Ahead returns the candidates of candidate i's shard that are ahead of it,
// in the order given: what a promotion of i's holder would lose (nil when
// i is Unknown).
func (r Ranking) Ahead(i int) []int {
	c := r.cands[i]
	if c.Unknown {
		return nil
	}
	var ahead []int
	for j, o := range r.cands {
		if !o.Unknown && o.Shard == c.Shard && store.ComparePositions(o.Pos, c.Pos) > 0 {
			ahead = append(ahead, j)
		}
	}
	return ahead
}

// Epoch is the epoch to promote at over the candidates (PromotionEpoch
// with Seen and SeenBy).
func (r Ranking) Epoch(asked uint64, what string) (uint64, error) {
	return PromotionEpoch(asked, what, r.Seen, r.SeenBy)
}

// PromotionEpoch is the epoch a promotion takes when seen is the highest
// epoch any store or log concerned holds (seenBy names where): asked, which
// must be above seen (replication.ErrStaleEpoch) and at most
// replication.MaxEpoch (replication.ErrEpochExhausted); or when asked is 0,
// seen + 1 (replication.NextEpoch: ErrEpochExhausted when seen is already
// MaxEpoch). what names where asked came from (a flag, an option).
func PromotionEpoch(asked uint64, what string, seen uint64, seenBy string) (uint64, error) {
	if asked == 0 {
		return replication.NextEpoch(seen, seenBy)
	}
	if err := replication.CheckEpoch(what, asked); err != nil {
		return 0, err
	}
	if asked <= seen {
		return 0, fmt.Errorf("%w: %s %d is not above epoch %d, which %s has seen", replication.ErrStaleEpoch, what, asked, seen, seenBy)
	}
	return asked, nil
}
