package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/oncewal/oncewal/corruption"
	"github.com/oncewal/oncewal/internal/keyspace"
)

// Store identity (notes for doc.go)
//
// A store records, when it is created, what it is and the options that
// change what it decides: its kind, its shard, the window capacity (which
// retries are recognised as duplicates) and the retention horizon (when an
// idle session is forgotten). Two replicas of a shard that differ in either
// option decide the same event differently, and a store reopened with a
// shorter horizon silently forgets live sessions; a store of shard 1 opened
// as shard 0 refuses every batch forever. Open therefore compares the record
// with the options before it changes anything (the way Pebble checks its
// OPTIONS file) and refuses a mismatch with a *MismatchError naming what it
// found and what was asked.
//
// The HWM log settings (HWMLogBatches, HWMLogSessions), the cache size,
// NoSync and the ledger sweep are not recorded: they change how and when
// state is written, not what is decided (OpenTracker replays the HWM log
// whatever the settings; an expired ledger entry counts as absent whether or
// not a sweep deleted it).
//
// SetRecordedOptions changes the record where that is safe (see there).

// keyIdentity holds the store's identity, written with the store's first
// commit (Open of a new store, or the first Open of a store written before
// the key existed): version byte 1 | kind u8 | shard u32 LE | window
// capacity u64 LE | retention horizon i64 LE (nanoseconds).
var keyIdentity = []byte(keyspace.MetaIdentity)

const identityVersion = 1

const identitySize = 1 + 1 + 4 + 8 + 8

// StoreKind is the kind of store an Identity names.
type StoreKind uint8

// KindShardStore is the one kind there is: a shard's store in the follower
// format. A leader's shard store (package leader) is one too — promotion
// turns a follower's store into a leader's, and a deposed leader's store is
// rebuilt as a follower's — so what tells them apart is the directory that
// holds them (Layout), not the store.
const KindShardStore StoreKind = 1

func (k StoreKind) String() string {
	if k == KindShardStore {
		return "shard store"
	}
	return fmt.Sprintf("StoreKind(%d)", uint8(k))
}

// Identity is what a store records about itself (keyIdentity).
type Identity struct {
	Kind             StoreKind
	Shard            uint32
	WindowCapacity   int
	RetentionHorizon time.Duration
}

func (id Identity) String() string {
	return fmt.Sprintf("%v of shard %d, window capacity %d, retention horizon %v",
		id.Kind, id.Shard, id.WindowCapacity, id.RetentionHorizon)
}

// identityOf is the identity a store opened with o must have (o has its
// defaults).
func identityOf(o *Options) Identity {
	return Identity{Kind: KindShardStore, Shard: o.Shard, WindowCapacity: o.WindowCapacity, RetentionHorizon: o.RetentionHorizon}
}

func (id Identity) encode() []byte {
	v := make([]byte, 0, identitySize)
	v = append(v, identityVersion, byte(id.Kind))
	v = binary.LittleEndian.AppendUint32(v, id.Shard)
	v = binary.LittleEndian.AppendUint64(v, uint64(id.WindowCapacity))
	return binary.LittleEndian.AppendUint64(v, uint64(id.RetentionHorizon))
}

// ErrMismatch: the store was created with another kind, shard or
// decision-changing option than it is being opened with. Returned as
// *MismatchError, before anything is written.
var ErrMismatch = errors.New("store: store does not match the options")

// MismatchError is Open's refusal of a store whose recorded identity differs
// from the options.
type MismatchError struct {
	Dir          string
	Found, Asked Identity
}

func (e *MismatchError) Error() string {
	var diffs []string
	if e.Found.Kind != e.Asked.Kind {
		diffs = append(diffs, fmt.Sprintf("kind %v, asked %v", e.Found.Kind, e.Asked.Kind))
	}
	if e.Found.Shard != e.Asked.Shard {
		diffs = append(diffs, fmt.Sprintf("shard %d, asked %d", e.Found.Shard, e.Asked.Shard))
	}
	if e.Found.WindowCapacity != e.Asked.WindowCapacity {
		diffs = append(diffs, fmt.Sprintf("window capacity %d, asked %d", e.Found.WindowCapacity, e.Asked.WindowCapacity))
	}
	if e.Found.RetentionHorizon != e.Asked.RetentionHorizon {
		diffs = append(diffs, fmt.Sprintf("retention horizon %v, asked %v", e.Found.RetentionHorizon, e.Asked.RetentionHorizon))
	}
	return fmt.Sprintf("store: store %s was created as a %v and is being opened as a %v: %s (see SetRecordedOptions)",
		e.Dir, e.Found, e.Asked, strings.Join(diffs, "; "))
}

func (e *MismatchError) Unwrap() error { return ErrMismatch }

// ReadIdentity reads a store's recorded identity; ok is false when the store
// records none (a new store, or one written before keyIdentity existed).
func ReadIdentity(r pebble.Reader) (id Identity, ok bool, err error) {
	v, closer, err := r.Get(keyIdentity)
	if errors.Is(err, pebble.ErrNotFound) {
		return Identity{}, false, nil
	}
	if err != nil {
		return Identity{}, false, fmt.Errorf("store: reading %s: %w", keyIdentity, err)
	}
	defer closer.Close()
	if len(v) != identitySize || v[0] != identityVersion {
		return Identity{}, false, corruption.Errorf("store: %s: unrecognised value %x", keyIdentity, v)
	}
	id = Identity{
		Kind:             StoreKind(v[1]),
		Shard:            binary.LittleEndian.Uint32(v[2:]),
		WindowCapacity:   int(binary.LittleEndian.Uint64(v[6:])),
		RetentionHorizon: time.Duration(binary.LittleEndian.Uint64(v[14:])),
	}
	return id, true, nil
}

// writeIdentity records id (and the store format, which marks an oncewal
// store) in one synced commit.
func writeIdentity(db *pebble.DB, id Identity) error {
	b := db.NewBatch()
	defer b.Close()
	if err := b.Set(keyIdentity, id.encode(), nil); err != nil {
		return err
	}
	if err := stageFormat(b); err != nil {
		return err
	}
	return guard(func() error { return b.Commit(pebble.Sync) })
}

// ErrUnsafeOptionChange: SetRecordedOptions was asked for a change that can
// make the store decide differently from what it promised.
var ErrUnsafeOptionChange = errors.New("store: unsafe change of a recorded option")

// SetRecordedOptions changes the options recorded in the store in dir (which
// must not be open) to those of opts, when that is safe, so that Open accepts
// opts from then on. It returns the identity the store had. Safe are:
//
//   - a longer RetentionHorizon: the store forgets idle sessions later, never
//     earlier than it promised. Lengthen every follower of the shard before
//     its leader: a leader whose horizon is longer than a follower's logs
//     events of sessions that follower already forgot (it would refuse them
//     as a gap), while a follower that remembers longer only recognises more
//     redeliveries.
//   - a larger WindowCapacity: the store recognises more retries, never
//     fewer. Replicas of a shard decide a retry alike only while their
//     windows are alike, so grow every replica of the shard (its leader's
//     store included) while no retry older than the old capacity can arrive.
//
// Anything else is refused with ErrUnsafeOptionChange and changes nothing:
// another shard or kind (that is another store), a shorter horizon (live
// sessions would be forgotten and their next events refused as gaps, or old
// redeliveries applied again), a smaller window (retries it promised to
// recognise would apply again). A store that records no identity yet gets
// opts' identity. The store must be a store (LayoutStore), not a node or WAL
// directory.
func SetRecordedOptions(dir string, opts *Options) (old Identity, err error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	o.EnsureDefaults()
	if err := o.Validate(); err != nil {
		return Identity{}, err
	}
	layout, detail, err := DirLayout(o.FS, dir)
	if err != nil {
		return Identity{}, err
	}
	if layout != LayoutStore {
		return Identity{}, &LayoutError{Dir: dir, Found: layout, Want: LayoutStore, Detail: detail}
	}
	asked := identityOf(&o)
	found, recorded, err := peekIdentity(o.FS, dir)
	if err != nil {
		return Identity{}, err
	}
	if recorded {
		var bad []string
		if found.Kind != asked.Kind || found.Shard != asked.Shard {
			bad = append(bad, fmt.Sprintf("the store is a %v of shard %d, not a %v of shard %d", found.Kind, found.Shard, asked.Kind, asked.Shard))
		}
		if asked.RetentionHorizon < found.RetentionHorizon {
			bad = append(bad, fmt.Sprintf("retention horizon %v is shorter than the recorded %v", asked.RetentionHorizon, found.RetentionHorizon))
		}
		if asked.WindowCapacity < found.WindowCapacity {
			bad = append(bad, fmt.Sprintf("window capacity %d is smaller than the recorded %d", asked.WindowCapacity, found.WindowCapacity))
		}
		if len(bad) > 0 {
			return found, fmt.Errorf("%w: %s: %s", ErrUnsafeOptionChange, dir, strings.Join(bad, "; "))
		}
		if found == asked {
			return found, nil
		}
	}
	db, err := pebble.Open(dir, pebbleOptions(&o, nil))
	if err != nil {
		return found, fmt.Errorf("store: opening store %s: %w", dir, err)
	}
	if err := writeIdentity(db, asked); err != nil {
		_ = guard(db.Close)
		return found, fmt.Errorf("store: recording the options of %s: %w", dir, err)
	}
	o.Logger.Warn("oncewal store: recorded options changed", "dir", dir, "was", found.String(), "now", asked.String())
	return found, guard(db.Close)
}
