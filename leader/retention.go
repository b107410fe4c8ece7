package leader

import (
	"cmp"
	"slices"

	"github.com/oncewal/oncewal/wal"
)

// retentionPlan is the decision of one retention pass.
type retentionPlan struct {
	DeleteBelow uint64   // delete every segment wholly below this LSN
	Drop        []string // slots released by the bound, lowest first
	Retained    int64    // bytes the log keeps after the pass
}

// planRetention decides one retention pass, purely. The log keeps every LSN
// from the lowest live slot's acknowledged position on — the follower needs
// what follows it, and the batch ending at it lets the leader verify the
// follower's hello against the log (replication.CheckHello) — and from
// local on (the leader's own store re-applies the log beyond its durable
// position after a crash). When that keeps more than maxBytes (> 0), the
// lowest live slots are dropped, one at a time, until the log fits or no
// slot below local is left: one dead follower cannot fill the disk. segs
// are the log's segments in LSN order; the last one is being written and is
// never deleted.
func planRetention(slots []slot, local uint64, segs []wal.SegmentInfo, maxBytes int64) retentionPlan {
	live := make([]slot, 0, len(slots))
	for _, s := range slots {
		if !s.Dropped {
			live = append(live, s)
		}
	}
	slices.SortStableFunc(live, func(a, b slot) int { return cmp.Compare(a.Acked, b.Acked) })
	var p retentionPlan
	for {
		need := local
		if len(live) > 0 {
			need = min(need, live[0].Acked)
		}
		p.DeleteBelow, p.Retained = need, retainedFrom(segs, need)
		if maxBytes <= 0 || p.Retained <= maxBytes || len(live) == 0 || live[0].Acked >= local {
			return p
		}
		p.Drop = append(p.Drop, live[0].ID)
		live = live[1:]
	}
}

// retainedFrom is the size of the segments that hold an LSN at or above
// need (segment i holds FirstLSN_i .. FirstLSN_{i+1}-1), plus the last one
// always.
func retainedFrom(segs []wal.SegmentInfo, need uint64) int64 {
	var n int64
	for i, s := range segs {
		if i == len(segs)-1 || segs[i+1].FirstLSN > need {
			n += s.Size
		}
	}
	return n
}
