package node

import (
	"context"
	"fmt"
	"slices"

	"github.com/oncewal/oncewal/coord"
	"github.com/oncewal/oncewal/replication"
)

// ReadMembers returns cluster's members as the coordinator holds them now.
func ReadMembers(ctx context.Context, c coord.Coordinator, cluster string) (Members, error) {
	b, ok, err := c.Get(ctx, cluster, keyMembers)
	if err != nil || !ok {
		return Members{}, err
	}
	m, err := decodeJSON[Members](keyMembers, b)
	slices.Sort(m.IDs)
	return m, err
}

// AddMember adds id to cluster's members (an ID already there is left as
// it is). The leader starts shipping to it; it starts following.
func AddMember(ctx context.Context, c coord.Coordinator, cluster, id string) (Members, error) {
	if id == "" {
		return Members{}, fmt.Errorf("%w: an empty member ID", coord.ErrBadInput)
	}
	if err := replication.ValidFollowerID(id); err != nil {
		return Members{}, fmt.Errorf("%w: member ID: %w", coord.ErrBadInput, err)
	}
	return updateMembers(ctx, c, cluster, func(m *Members) {
		if !m.Has(id) {
			m.IDs = append(m.IDs, id)
		}
	})
}

// RemoveMember removes id from cluster's members: the leader drops its
// slots and refuses it; it stops following and campaigning.
func RemoveMember(ctx context.Context, c coord.Coordinator, cluster, id string) (Members, error) {
	return updateMembers(ctx, c, cluster, func(m *Members) {
		m.IDs = slices.DeleteFunc(m.IDs, func(s string) bool { return s == id })
	})
}

func updateMembers(ctx context.Context, c coord.Coordinator, cluster string, edit func(*Members)) (Members, error) {
	var out Members
	err := c.Update(ctx, cluster, keyMembers, func(old []byte, ok bool) ([]byte, error) {
		var m Members
		if ok {
			var err error
			if m, err = decodeJSON[Members](keyMembers, old); err != nil {
				return nil, err
			}
		}
		edit(&m)
		slices.Sort(m.IDs)
		out = m
		return encodeJSON(m), nil
	})
	return out, err
}

// Term is the cluster's term as its winner published it: the epoch it
// fences or leads at, the winner's ID and address, and its state.
type Term struct {
	// Term is the winner's election key create revision.
	Term  uint64 `json:"term"`
	Epoch uint64 `json:"epoch"`
	ID    string `json:"id"`
	Addr  string `json:"addr"`
	// State is fencing, leading or handoff (to To).
	State string `json:"state"`
	To    string `json:"to,omitempty"`
}

// Leading reports whether the term's winner leads (fenced and promoted).
func (t Term) Leading() bool { return t.State == stateLeading }

// ReadTerm returns cluster's term as the coordinator holds it now; ok is
// false when no member has won one yet. A term that does not decode is
// ErrBadRecord.
func ReadTerm(ctx context.Context, c coord.Coordinator, cluster string) (_ Term, ok bool, _ error) {
	b, ok, err := c.Get(ctx, cluster, keyTerm)
	if err != nil || !ok {
		return Term{}, false, err
	}
	t, err := decodeJSON[term](keyTerm, b)
	if err != nil {
		return Term{}, false, err
	}
	return Term{Term: t.Term, Epoch: t.Epoch, ID: t.ID, Addr: t.Addr, State: t.State, To: t.To}, true, nil
}
