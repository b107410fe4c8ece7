package node

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/oncewal/oncewal/replication"
)

// The keys of a cluster's data space (package doc, "The records").
const (
	keyMembers   = "members"
	keyEpochBase = "epoch_base"
	keyTerm      = "term"
	reportPrefix = "report/"
)

// ErrBadRecord: a record in the coordinator does not decode. Nothing acts on
// it; fix or delete the key (etcdctl) — it was not written by this version.
var ErrBadRecord = errors.New("node: bad record in the coordinator")

// Term states.
const (
	stateFencing = "fencing"
	stateLeading = "leading"
	stateHandoff = "handoff"
)

// term is the record its winner writes (guarded by its election key).
type term struct {
	// Term is the winner's election key create revision (coord Epoch).
	Term  uint64 `json:"term"`
	Epoch uint64 `json:"epoch"`
	ID    string `json:"id"`
	Addr  string `json:"addr"`
	State string `json:"state"`
	// To names the member a handoff term hands the leadership to.
	To string `json:"to,omitempty"`
	// Starts holds, per shard, the first LSN the leading term writes
	// (state leading): a member behind it would need the leader's batches
	// of older epochs, which its promise of this term refuses, so it
	// rebuilds that shard first (follow).
	Starts []uint64 `json:"starts,omitempty"`
}

// report is what a member tells a fencing winner.
type report struct {
	ID string `json:"id"`
	// Addr is where the member serves snapshots of its stores while it
	// follows (a winner behind it catches up from there).
	Addr string `json:"addr"`
	// Term and Epoch are the fencing term's; a report of another term is
	// not heard.
	Term  uint64 `json:"term"`
	Epoch uint64 `json:"epoch"`
	// Positions are the member's stores, one per shard, after the promise:
	// final under every older epoch. Unknown lists shards whose position
	// could not be read (the store failed): such a member is heard but
	// never promoted.
	Positions []replication.Ack `json:"positions"`
	Unknown   []uint32          `json:"unknown,omitempty"`
	// Deposed: the member's replica is a leader's (it led an earlier term).
	Deposed bool `json:"deposed,omitempty"`
}

// Members is a cluster's replica set as the coordinator keeps it.
type Members struct {
	IDs []string `json:"ids"`
}

// Has reports whether id is a member.
func (m Members) Has(id string) bool { return slices.Contains(m.IDs, id) }

func decodeJSON[T any](what string, b []byte) (T, error) {
	var v T
	if err := json.Unmarshal(b, &v); err != nil {
		return v, fmt.Errorf("%w: %s: %w", ErrBadRecord, what, err)
	}
	return v, nil
}

func encodeJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("node: encoding %T: %v", v, err)) // plain structs of strings and numbers
	}
	return b
}

func decodeBase(b []byte) (uint64, error) {
	v, err := strconv.ParseUint(string(b), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%w: %s: %w", ErrBadRecord, keyEpochBase, err)
	}
	return v, nil
}

func encodeBase(v uint64) []byte { return strconv.AppendUint(nil, v, 10) }

// view is the cluster's records as last watched.
type view struct {
	members Members
	base    uint64
	term    term // zero: none yet
	reports map[string]report
	bad     []error // records that did not decode
}

func readView(data map[string][]byte) view {
	v := view{reports: map[string]report{}}
	for k, b := range data {
		var err error
		switch {
		case k == keyMembers:
			v.members, err = decodeJSON[Members](k, b)
		case k == keyEpochBase:
			v.base, err = decodeBase(b)
		case k == keyTerm:
			v.term, err = decodeJSON[term](k, b)
		case len(k) > len(reportPrefix) && k[:len(reportPrefix)] == reportPrefix:
			var r report
			if r, err = decodeJSON[report](k, b); err == nil {
				v.reports[r.ID] = r
			}
		}
		if err != nil {
			v.bad = append(v.bad, err)
		}
	}
	slices.Sort(v.members.IDs)
	return v
}
