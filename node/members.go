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
