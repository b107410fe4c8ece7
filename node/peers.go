package node

import (
	"context"
	"fmt"
	"sync"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/oncewal/oncewal/follower"
	"github.com/oncewal/oncewal/snapshot"
	"github.com/oncewal/oncewal/store"
)

// peerDonors serves snapshots of a following member's stores, so that a
// winner behind it on some shard catches that shard up before it promotes
// (leader.Ranking.Promote): a donor per snapshot, made at its Begin and
// closed at its End or with the follower.
type peerDonors struct {
	fol *follower.Node // replaced (setFollower) when the node reopens its stores
	fs  vfs.FS
	dir string // checkpoints go under dir/shard-NNNN
	mu  sync.Mutex
	ids map[string]*snapshot.Donor
	all []*snapshot.Donor
	end bool
}

func (p *peerDonors) Begin(ctx context.Context, shard uint32) (snapshot.Manifest, error) {
	var d *snapshot.Donor
	p.mu.Lock()
	fol := p.fol
	p.mu.Unlock()
	err := fol.Follower(shard, func(f *follower.Follower) error {
		var err error
		d, err = f.Store().Donor(&snapshot.DonorOptions{FS: p.fs, Dir: store.ShardDir(p.dir, shard), RateLimit: -1})
		return err
	})
	if err != nil {
		return snapshot.Manifest{}, fmt.Errorf("node: serving a snapshot of shard %d: %w: %w", shard, snapshot.ErrClosed, err)
	}
	p.mu.Lock()
	if p.end {
		p.mu.Unlock()
		_ = d.Close()
		return snapshot.Manifest{}, fmt.Errorf("node: the follower closed: %w", snapshot.ErrClosed)
	}
	p.all = append(p.all, d)
	p.mu.Unlock()
	m, err := d.Begin(ctx, shard)
	if err != nil {
		return m, err
	}
	p.mu.Lock()
	p.ids[m.ID] = d
	p.mu.Unlock()
	return m, nil
}

// store is shard's current store in the follower node, for a client read
// at a MinLSN (clientapi.Replica); a store the node closes meanwhile
// answers the read with store.ErrClosed.
func (p *peerDonors) store(shard uint32) (*store.Store, error) {
	p.mu.Lock()
	fol := p.fol
	p.mu.Unlock()
	var st *store.Store
	err := fol.Follower(shard, func(f *follower.Follower) error {
		st = f.Store()
		return nil
	})
	return st, err
}

func (p *peerDonors) setFollower(fol *follower.Node) {
	p.mu.Lock()
	p.fol = fol
	p.mu.Unlock()
}

func (p *peerDonors) donor(id string) (*snapshot.Donor, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if d := p.ids[id]; d != nil {
		return d, nil
	}
	return nil, fmt.Errorf("node: %w: %s", snapshot.ErrUnknownSnapshot, id)
}

func (p *peerDonors) Read(ctx context.Context, id, name string, off int64, b []byte) (int, error) {
	d, err := p.donor(id)
	if err != nil {
		return 0, err
	}
	return d.Read(ctx, id, name, off, b)
}

func (p *peerDonors) End(ctx context.Context, id string) error {
	d, err := p.donor(id)
	if err != nil {
		return nil // released already
	}
	err = d.End(ctx, id)
	p.mu.Lock()
	delete(p.ids, id)
	p.mu.Unlock()
	return err
}

// Close closes every donor: before the follower's stores close.
func (p *peerDonors) Close() error {
	p.mu.Lock()
	all := p.all
	p.all, p.ids, p.end = nil, map[string]*snapshot.Donor{}, true
	p.mu.Unlock()
	for _, d := range all {
		_ = d.Close()
	}
	return nil
}
