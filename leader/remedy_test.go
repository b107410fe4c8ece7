package leader

import (
	"errors"
	"strings"
	"testing"

	"github.com/oncewal/oncewal/replication"

	"github.com/oncewal/oncewal/wal"
)

// fixedLog is a HelloLog that holds LSNs first..last and no batch
// identities.
type fixedLog struct{ first, last uint64 }

func (l fixedLog) Retained() (uint64, uint64) { return l.first, l.last }
func (l fixedLog) BatchEndingAt(uint64) (wal.BatchRef, bool, error) {
	return wal.BatchRef{}, false, nil
}
func (l fixedLog) Boundary() EpochBoundary { return EpochBoundary{} }

// TestRefusalTextsSayWhatToDo: every refusal a leader gives names its cause
// and what the operator does about it, and keeps its sentinel (errors.Is).
// (They named the cause only: `unknown follower: "f3" is not registered`.)
func TestRefusalTextsSayWhatToDo(t *testing.T) {
	fo := newFanout(FanoutOptions{ShipperOptions: ShipperOptions{Shard: 2}, Followers: []string{"f1"}}, false)
	route := func(h replication.Ack) error {
		fo.mu.Lock()
		defer fo.mu.Unlock()
		_, err := fo.routeLocked(h)
		return err
	}
	l := &shipLoop{p: &peer{id: "f1"}, o: &ShipperOptions{Epoch: func() uint64 { return 2 }}}
	for _, tc := range []struct {
		name     string
		err      error
		sentinel error
		remedy   string
	}{
		{"unknown follower", route(replication.Ack{Shard: 2, FollowerID: "f3"}), replication.ErrUnknownFollower,
			`"f3" is not registered with the leader of shard 2: add f3 to the leader's followers (oncewal leader --followers)`},
		{"anonymous follower", route(replication.Ack{Shard: 2}), replication.ErrUnknownFollower, "oncewal follower --id"},
		{"bad follower ID", route(replication.Ack{Shard: 2, FollowerID: "a b"}), replication.ErrBadFollowerID, "choose an ID of 1-64 bytes"},
		{"diverged", CheckHello(replication.Ack{AppliedLSN: 9, LastBatch: wal.BatchRef{Epoch: 1, CRC: 1}}, fixedLog{1, 5}), replication.ErrDiverged,
			"rebuild the follower's store from a snapshot (oncewal follower --rebuild auto"},
		{"behind retention", CheckHello(replication.Ack{AppliedLSN: 2, LastBatch: wal.BatchRef{Epoch: 1, CRC: 1}}, fixedLog{10, 20}), replication.ErrBehindRetention,
			"oncewal leader --max-retained-bytes"},
		{"fenced", l.fencedErr(3), replication.ErrFenced, "a newer leader was promoted; stop this one"},
	} {
		if !errors.Is(tc.err, tc.sentinel) || !strings.Contains(tc.err.Error(), tc.remedy) {
			t.Errorf("%s: %v; want %v saying %q", tc.name, tc.err, tc.sentinel, tc.remedy)
		}
	}
}
