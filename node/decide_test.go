package node

import (
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
	"github.com/oncewal/oncewal/leader"
	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/wal"
)

// TestFence runs the winner's decisions (fenceNeed, termEpoch, choose) over
// testdata/fence: pure functions, no coordinator, no store.
func TestFence(t *testing.T) {
	datadriven.RunTest(t, "testdata/fence", func(t *testing.T, td *datadriven.TestData) string {
		switch td.Cmd {
		case "need":
			var members int
			var ack string
			td.ScanArgs(t, "members", &members)
			td.ScanArgs(t, "ack", &ack)
			return fmt.Sprintf("need %d\n", fenceNeed(members, parseAck(t, ack)))
		case "epoch":
			var base, rev, seen uint64
			td.ScanArgs(t, "base", &base)
			td.ScanArgs(t, "term", &rev)
			td.ScanArgs(t, "seen", &seen)
			e, nb, err := termEpoch(base, rev, seen)
			if err != nil {
				return fmt.Sprintf("error: %v\n", err)
			}
			return fmt.Sprintf("epoch %d, base %d\n", e, nb)
		case "choose":
			var me, members string
			var rev, epoch uint64
			var shards, need int
			td.ScanArgs(t, "me", &me)
			td.ScanArgs(t, "term", &rev)
			td.ScanArgs(t, "epoch", &epoch)
			td.ScanArgs(t, "members", &members)
			td.ScanArgs(t, "shards", &shards)
			td.ScanArgs(t, "need", &need)
			c := choose(me, term{Term: rev, Epoch: epoch, ID: me, State: stateFencing},
				Members{IDs: strings.Split(members, ",")}, parseReports(t, td), shards, need)
			out := fmt.Sprintf("%v", c.kind)
			if c.to != "" {
				out += " to " + c.to
			}
			for _, cu := range c.catchUp {
				out += ", " + cu.String()
			}
			if c.kind == choiceRaise {
				out += fmt.Sprintf(" past %d", c.seen)
			}
			out += fmt.Sprintf("\nheard %v\n", c.heard)
			if c.why != "" {
				out += "why: " + c.why + "\n"
			}
			return out
		}
		t.Fatalf("%s: unknown command %q", td.Pos, td.Cmd)
		return ""
	})
}

func parseAck(t *testing.T, s string) leader.AckPolicy {
	switch s {
	case "one":
		return leader.AckOne
	case "majority":
		return leader.AckMajority
	case "all":
		return leader.AckAll
	}
	t.Fatalf("unknown ack policy %q", s)
	return 0
}

// parseReports reads one report per line: ID term=T epoch=E then
// pos=SHARD/EPOCH/LSN/LASTEPOCH[/CRC] per store (the last batch's CRC
// defaults to 1) and unknown=SHARD.
func parseReports(t *testing.T, td *datadriven.TestData) map[string]report {
	out := map[string]report{}
	for _, line := range strings.Split(strings.TrimSpace(td.Input), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		r := report{ID: f[0]}
		for _, kv := range f[1:] {
			k, v, _ := strings.Cut(kv, "=")
			switch k {
			case "term":
				r.Term = mustUint(t, v)
			case "epoch":
				r.Epoch = mustUint(t, v)
			case "pos":
				p := strings.Split(v, "/")
				if len(p) != 4 && len(p) != 5 {
					t.Fatalf("%s: pos=%s: want SHARD/EPOCH/LSN/LASTEPOCH[/CRC]", td.Pos, v)
				}
				crc := uint32(1)
				if len(p) == 5 {
					crc = uint32(mustUint(t, p[4]))
				}
				r.Positions = append(r.Positions, replication.Ack{Shard: uint32(mustUint(t, p[0])), Epoch: mustUint(t, p[1]),
					AppliedLSN: mustUint(t, p[2]), LastBatch: wal.BatchRef{Epoch: mustUint(t, p[3]), CRC: crc}})
			case "unknown":
				r.Unknown = append(r.Unknown, uint32(mustUint(t, v)))
			default:
				t.Fatalf("%s: unknown argument %q", td.Pos, kv)
			}
		}
		out[r.ID] = r
	}
	return out
}

func mustUint(t *testing.T, s string) uint64 {
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}
