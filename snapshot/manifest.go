package snapshot

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/oncewal/oncewal/wal"
	"lukechampine.com/blake3"
)

// Typed refusals. Every one leaves the store the caller wants to replace as
// it was (invariant 1).
var (
	// ErrMismatch: the snapshot is of another shard or store identity than
	// the one wanted.
	ErrMismatch = errors.New("snapshot: snapshot of another shard or store identity")
	// ErrOlderEpoch: the snapshot's epoch is below the epoch the caller has
	// already seen (Want.MinEpoch); it belongs to a deposed history.
	ErrOlderEpoch = errors.New("snapshot: snapshot of an older epoch")
	// ErrDonorBehind: the donor's cut is below the LSN the caller needs
	// (Want.MinLSN): installing it would not let the caller continue.
	ErrDonorBehind = errors.New("snapshot: donor is behind")
	// ErrCorrupt: a file's or the manifest's BLAKE3 sum does not match, or
	// the staged store does not describe itself as the manifest does.
	ErrCorrupt = errors.New("snapshot: corrupt snapshot")
	// ErrTruncated: the transfer ended before a file was complete.
	ErrTruncated = errors.New("snapshot: truncated transfer")
	// ErrUnknownSnapshot: the source no longer holds the snapshot a read
	// names (it was released, or the donor restarted); Fetch starts over.
	ErrUnknownSnapshot = errors.New("snapshot: unknown snapshot")
	// ErrClosed: the donor's store is closed or closing (its owner's
	// DonorOptions.Hold refused the Begin — a leader's is leader.ErrClosed,
	// which the error wraps too — or the store closed under the cut). It
	// will not serve again; Fetch returns at once instead of retrying the
	// Begin, and the caller finds the current leader (a follower goes back
	// to its Dialer, then asks its donor again if the leader refuses it).
	ErrClosed = errors.New("snapshot: donor closed")
)

// Cut describes a store at the moment of the snapshot, read from the
// snapshot's own files (invariant 3).
type Cut struct {
	Shard      uint32
	Epoch      uint64 // the highest epoch the store committed
	AppliedLSN uint64
	LastBatch  wal.BatchRef
	// Identity is the store's recorded identity (kind, shard and the
	// decision-changing options) in its printed form; a store rebuilt from
	// the snapshot must have the same.
	Identity string
}

// File is one file of a snapshot, relative to the snapshot's directory.
type File struct {
	Name string
	Size int64
	Sum  string // BLAKE3-256, hex
}

// Manifest names a snapshot: the cut and its files. ID is the BLAKE3 sum of
// everything else in it, so one value checks the whole snapshot.
type Manifest struct {
	ID  string
	Cut Cut
	// Serial names the Begin that took the snapshot on its donor (the
	// donor's random name and a count). Two cuts of an idle store hold the
	// same bytes; without it two fetchers' Begins would get one ID, and the
	// donor could neither serve nor release them apart. Omitted when empty,
	// so a manifest of a donor older than the field sums as it did there: a
	// new fetcher can rebuild from an old donor (followers upgrade first).
	Serial string `json:",omitempty"`
	Files  []File
}

// Bytes is the snapshot's size.
func (m *Manifest) Bytes() int64 {
	var n int64
	for _, f := range m.Files {
		n += f.Size
	}
	return n
}

// sum is the manifest's ID: BLAKE3 over its canonical JSON without the ID.
func (m *Manifest) sum() string {
	body := *m
	body.ID = ""
	b, err := json.Marshal(body)
	if err != nil { // cannot fail: plain data
		panic(err)
	}
	s := blake3.Sum256(b)
	return hex.EncodeToString(s[:])
}

// seal sets the manifest's ID.
func (m *Manifest) seal() { m.ID = m.sum() }

// Check verifies the manifest's own sum.
func (m *Manifest) Check() error {
	if m.ID == "" || m.ID != m.sum() {
		return fmt.Errorf("%w: manifest sum %q does not match its contents", ErrCorrupt, m.ID)
	}
	for _, f := range m.Files {
		if !validName(f.Name) || f.Size < 0 {
			return fmt.Errorf("%w: bad file entry %q (%d bytes)", ErrCorrupt, f.Name, f.Size)
		}
	}
	return nil
}

// Want is what the caller needs of a snapshot.
type Want struct {
	Shard uint32
	// Identity, if set, must equal the snapshot's Cut.Identity.
	Identity string
	// MinEpoch: a snapshot whose epoch is below it is refused
	// (ErrOlderEpoch).
	MinEpoch uint64
	// MinLSN: a snapshot whose applied LSN is below it is refused
	// (ErrDonorBehind).
	MinLSN uint64
	// Describe, if set, reads the staged store after the transfer; its
	// answer must equal the manifest's cut (else ErrCorrupt).
	Describe Describer
}

// check refuses a manifest that does not fit w.
func (w *Want) check(m *Manifest) error {
	c := m.Cut
	switch {
	case c.Shard != w.Shard:
		return fmt.Errorf("%w: snapshot of shard %d, want shard %d", ErrMismatch, c.Shard, w.Shard)
	case w.Identity != "" && c.Identity != w.Identity:
		return fmt.Errorf("%w: snapshot of a %s, want a %s", ErrMismatch, c.Identity, w.Identity)
	case c.Epoch < w.MinEpoch:
		return fmt.Errorf("%w: snapshot at epoch %d, want at least %d", ErrOlderEpoch, c.Epoch, w.MinEpoch)
	case c.AppliedLSN < w.MinLSN:
		return fmt.Errorf("%w: snapshot at LSN %d, want at least %d", ErrDonorBehind, c.AppliedLSN, w.MinLSN)
	}
	return nil
}

// validName accepts a checkpoint's plain file names only: no directories,
// no path tricks.
func validName(name string) bool {
	if name == "" || name == "." || name == ".." || len(name) > 255 {
		return false
	}
	for _, r := range name {
		if r == '/' || r == '\\' || r == 0 {
			return false
		}
	}
	return true
}
