package node

import (
	"fmt"
	"slices"
	"strings"

	"github.com/oncewal/oncewal/leader"
	"github.com/oncewal/oncewal/replication"
)

// fenceNeed is how many members a winner must hear, itself counted, before
// it promotes (invariant 2): every member but one (the deposed leader) may
// have been its follower, F of them, and the policy acknowledged a write
// once A of them had it; hearing F − A + 1 meets every such set. A cluster
// of one hears itself.
func fenceNeed(members int, ack leader.AckPolicy) int {
	f := members - 1
	if f <= 0 {
		return 1
	}
	return f - ack.Need(f) + 1
}

// termEpoch is the epoch of the term won at election revision rev, given the
// cluster's epoch base and the highest epoch seen (stores, promises, the last
// term), and the base the winner records with it (invariant 1).
func termEpoch(base, rev, seen uint64) (epoch, newBase uint64, err error) {
	epoch = base + rev
	if epoch < base || epoch <= seen {
		if epoch, err = replication.NextEpoch(seen, "this cluster"); err != nil {
			return 0, 0, err
		}
	}
	if epoch > replication.MaxEpoch {
		return 0, 0, fmt.Errorf("%w: term %d at epoch base %d", replication.ErrEpochExhausted, rev, base)
	}
	return epoch, epoch - rev, nil
}

type choiceKind int

const (
	choiceWait    choiceKind = iota // too few members heard yet
	choicePromote                   // the winner is the most advanced: lead
	choiceHandoff                   // another member is: hand over to it
	choiceRaise                     // a member holds the term's epoch or a later one
	choiceCatchUp                   // the winner promotes once it copied the shards others are ahead on
	choiceStuck                     // no member holds a store of every shard
)

func (k choiceKind) String() string {
	return [...]string{"wait", "promote", "handoff", "raise", "catch-up", "stuck"}[k]
}

// choice is what a fencing winner does with the reports it heard.
type shardSource struct {
	shard uint32
	from  string
}

func (s shardSource) String() string { return fmt.Sprintf("shard %d from %s", s.shard, s.from) }

type choice struct {
	kind choiceKind
	to   string // handoff: the member to hand over to
	// catchUp: the shards the winner copies first, each from the member
	// most advanced on it.
	catchUp []shardSource
	seen    uint64   // raise: the highest epoch heard
	heard   []string // the members heard, the winner first
	why     string
}

// choose decides a fencing term t for its winner me from the reports of
// members (invariants 1 and 2): pure, so a table drives it. A store whose
// position a member could not read (a store being rebuilt or reopened) is
// left out: it promised nothing, so it is no part of the fenced set, and
// each shard needs need members whose stores were heard.
func choose(me string, t term, members Members, reports map[string]report, shards int, need int) choice {
	var heard []report
	for id, r := range reports {
		if r.Term == t.Term && r.Epoch == t.Epoch && members.Has(id) {
			heard = append(heard, r)
		}
	}
	// The winner first, so that ties go to it (no handoff for nothing).
	slices.SortFunc(heard, func(a, b report) int {
		switch {
		case a.ID == me:
			return -1
		case b.ID == me:
			return 1
		}
		return strings.Compare(a.ID, b.ID)
	})
	c := choice{}
	for _, r := range heard {
		c.heard = append(c.heard, r.ID)
	}
	if len(heard) == 0 || heard[0].ID != me {
		c.kind, c.why = choiceWait, "the winner's own report is not in yet"
		return c
	}
	known := make([]int, shards)
	var cands []leader.Candidate
	for _, r := range heard {
		for _, p := range r.Positions {
			if int(p.Shard) < shards {
				known[p.Shard]++
				cands = append(cands, leader.Candidate{Holder: r.ID, Shard: p.Shard, Pos: p})
			}
		}
	}
	for s, k := range known {
		if k < need {
			c.kind, c.why = choiceWait, fmt.Sprintf("shard %d: heard %d of the %d stores fencing needs", s, k, need)
			return c
		}
	}
	rank := leader.Rank(cands)
	if rank.Seen >= t.Epoch {
		c.kind, c.seen = choiceRaise, rank.Seen
		c.why = fmt.Sprintf("%s holds epoch %d, at or above this term's %d", rank.SeenBy, rank.Seen, t.Epoch)
		return c
	}
	for _, s := range rank.Shards {
		if s.Diverged {
			c.kind = choiceStuck
			c.why = fmt.Sprintf("shard %d: two stores stand level with different last batches — two histories at one epoch; an operator must choose (oncewal inspect, oncewal promote)", s.Shard)
			return c
		}
	}
	switch {
	case rank.Leader == me:
		c.kind = choicePromote
	case rank.Leader != "":
		c.kind, c.to = choiceHandoff, rank.Leader
		c.why = fmt.Sprintf("%s is more advanced", rank.Leader)
	case rank.Promote == me:
		// Nobody is ahead everywhere: the winner, most advanced on the
		// most shards, copies the others from their best stores.
		c.kind = choiceCatchUp
		for i, cand := range cands {
			if cand.Holder == me && !rank.MostAdvanced[i] {
				best := cands[rank.Shards[shardIndex(rank, cand.Shard)].Best]
				c.catchUp = append(c.catchUp, shardSource{shard: cand.Shard, from: best.Holder})
			}
		}
		c.why = fmt.Sprintf("nobody is the most advanced on every shard (%s)", describeRank(rank))
	case rank.Promote != "":
		c.kind, c.to = choiceHandoff, rank.Promote
		c.why = fmt.Sprintf("%s is the most advanced on the most shards (%s)", rank.Promote, describeRank(rank))
	default:
		c.kind = choiceStuck
		c.why = fmt.Sprintf("no member heard (%v) is the most advanced on every one of the %d shards: %s", c.heard, shards, describeRank(rank))
		if len(heard) < len(members.IDs) {
			// A member not heard yet may be: wait for it.
			c.kind = choiceWait
		}
	}
	return c
}

func shardIndex(r leader.Ranking, shard uint32) int {
	for i, s := range r.Shards {
		if s.Shard == shard {
			return i
		}
	}
	panic(fmt.Sprintf("node: shard %d not ranked", shard))
}

func describeRank(r leader.Ranking) string {
	var parts []string
	for _, h := range r.Holders {
		parts = append(parts, fmt.Sprintf("%s leads %d of %d", h.Holder, h.Leads, h.Shards))
	}
	return strings.Join(parts, ", ")
}
