package leader

import (
	"fmt"
	"path/filepath"
	"strconv"

	"github.com/oncewal/oncewal/internal/rawdb"
	"github.com/oncewal/oncewal/store"

	"github.com/oncewal/oncewal/snapshot"
)

// SnapshotsDirName is the directory, in the leader's directory, that holds
// the checkpoints its donors serve (one subdirectory per shard).
const SnapshotsDirName = "snapshots"

// Donor returns a snapshot donor of shard's local store (package snapshot):
// a follower that cannot continue from this leader's log — diverged, behind
// its retention, new after retention dropped the log's start, a deposed
// leader's store — rebuilds from it. From before each cut until the
// snapshot is released (or idles out), the shard's retention keeps the log
// from the store's position on, so the rebuilt follower continues from the
// snapshot's LSN through the ordinary path. o may be nil; its Dir defaults
// to SnapshotsDirName/shard-N in the leader's directory, FS to the store's,
// Describe to store.Describe, Pin to that retention pin. The donor holds
// off the leader's Close while it cuts (DonorOptions.Hold): after Close, a
// Begin is refused with ErrClosed, as is Donor itself.
func (l *Leader) Donor(shard uint32, o *snapshot.DonorOptions) (*snapshot.Donor, error) {
	s, err := l.Shard(shard)
	if err != nil {
		return nil, err
	}
	release, err := l.hold()
	if err != nil {
		return nil, err
	}
	defer release()
	var do snapshot.DonorOptions
	if o != nil {
		do = *o
	}
	if do.Dir == "" {
		do.Dir = filepath.Join(l.dir, SnapshotsDirName, "shard-"+strconv.FormatUint(uint64(shard), 10))
	}
	if do.FS == nil {
		do.FS = l.opts.Store.FS
	}
	if do.Describe == nil {
		do.Describe = store.Describe
	}
	if do.Pin == nil {
		do.Pin = s.pinRetention
	}
	if hold := do.Hold; hold == nil {
		do.Hold = l.hold
	} else {
		do.Hold = func() (func(), error) {
			release, err := l.hold()
			if err != nil {
				return nil, err
			}
			r, err := hold()
			if err != nil {
				release()
				return nil, err
			}
			return func() { r(); release() }, nil
		}
	}
	d, err := snapshot.NewDonor(rawdb.Of(s.store), &do)
	if err != nil {
		return nil, fmt.Errorf("leader: donor of shard %d: %w", shard, err)
	}
	return d, nil
}

// pinRetention keeps the shard's log from its store's current position on
// until release is called (idempotent). Without shipping nothing deletes the
// log, and nothing needs pinning.
func (s *Shard) pinRetention() (release func(), err error) {
	sh := s.ship
	if sh == nil {
		return func() {}, nil
	}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	local, _ := s.log.Position()
	if sh.pins == nil {
		sh.pins = map[int]uint64{}
	}
	sh.nextPin++
	id := sh.nextPin
	sh.pins[id] = local
	return func() {
		sh.mu.Lock()
		delete(sh.pins, id)
		sh.mu.Unlock()
	}, nil
}
