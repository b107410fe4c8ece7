package snapshot

import (
	"context"
	"fmt"
	"sync"
)

// ErrNoDonor: a Router has no donor for the shard asked.
var ErrNoDonor = fmt.Errorf("%w: no donor for the shard", ErrMismatch)

// Router is the Source of a node or leader of several shards: it begins each
// snapshot on the shard's own donor and routes the snapshot's reads and its
// end to that donor by the snapshot's ID.
type Router struct {
	donors func(shard uint32) Source // nil for a shard without one

	mu   sync.Mutex
	byID map[string]Source
}

var _ Source = (*Router)(nil)

// NewRouter returns a Router over donors (which returns nil for a shard
// without a donor).
func NewRouter(donors func(shard uint32) Source) *Router {
	return &Router{donors: donors, byID: map[string]Source{}}
}

var _ HeldSource = (*Router)(nil)

// Begin implements Source.
func (r *Router) Begin(ctx context.Context, shard uint32) (Manifest, error) {
	return r.BeginFor(ctx, shard, "")
}

// BeginFor implements HeldSource: the shard's donor's BeginFor, or its
// Begin if it has none.
func (r *Router) BeginFor(ctx context.Context, shard uint32, holder string) (Manifest, error) {
	var src Source
	if r.donors != nil {
		src = r.donors(shard)
	}
	if src == nil {
		return Manifest{}, fmt.Errorf("%w %d", ErrNoDonor, shard)
	}
	m, err := beginFor(ctx, src, shard, holder)
	if err != nil {
		return Manifest{}, err
	}
	r.mu.Lock()
	r.byID[m.ID] = src
	r.mu.Unlock()
	return m, nil
}

func (r *Router) source(id string) Source {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.byID[id]
}

// Read implements Source.
func (r *Router) Read(ctx context.Context, id, name string, off int64, p []byte) (int, error) {
	src := r.source(id)
	if src == nil {
		return 0, fmt.Errorf("%w: %s", ErrUnknownSnapshot, id)
	}
	return src.Read(ctx, id, name, off, p)
}

// End implements Source.
func (r *Router) End(ctx context.Context, id string) error {
	src := r.source(id)
	r.mu.Lock()
	delete(r.byID, id)
	r.mu.Unlock()
	if src == nil {
		return nil
	}
	return src.End(ctx, id)
}

// beginFor begins a snapshot for holder on src: BeginFor if src is a
// HeldSource and holder is set, else Begin.
func beginFor(ctx context.Context, src Source, shard uint32, holder string) (Manifest, error) {
	if hs, ok := src.(HeldSource); ok && holder != "" {
		return hs.BeginFor(ctx, shard, holder)
	}
	return src.Begin(ctx, shard)
}
