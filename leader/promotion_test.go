package leader

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/wal"
)

// TestPromotion runs the scripted promotion table in testdata/promotion.
// Commands:
//
//	rank
//	HOLDER [shard=N] [epoch=N] [lsn=N] [last=EPOCH/CRC] [unknown]
//	    ...one candidate per line, in the order given to Rank (the store is
//	    named HOLDER/SHARD; defaults: shard 0, epoch 0, lsn 0, no last
//	    batch); prints every shard's leaders, what each candidate has ahead
//	    of it, the holders, Leader, Promote and the highest epoch seen
//	epoch [asked=N]
//	    the epoch to promote the last ranked candidates at, or the refusal
//	    with the sentinel it wraps
func TestPromotion(t *testing.T) {
	var r Ranking
	datadriven.RunTest(t, "testdata/promotion", func(t *testing.T, td *datadriven.TestData) string {
		switch td.Cmd {
		case "rank":
			r = Rank(parseCandidates(t, td))
			return fmtRanking(r)
		case "epoch":
			var asked uint64
			td.MaybeScanArgs(t, "asked", &asked)
			e, err := r.Epoch(asked, "--epoch")
			if err != nil {
				return fmtEpochErr(err)
			}
			return fmt.Sprintf("epoch %d\n", e)
		}
		t.Fatalf("%s: unknown command %q", td.Pos, td.Cmd)
		return ""
	})
}

func parseCandidates(t *testing.T, td *datadriven.TestData) []Candidate {
	var cands []Candidate
	for _, line := range strings.Split(strings.TrimSpace(td.Input), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		c := Candidate{Holder: f[0]}
		for _, kv := range f[1:] {
			if kv == "unknown" {
				c.Unknown = true
				continue
			}
			k, v, ok := strings.Cut(kv, "=")
			if !ok {
				t.Fatalf("%s: bad argument %q", td.Pos, kv)
			}
			switch k {
			case "shard":
				c.Shard = uint32(parseUint(t, v))
			case "epoch":
				c.Pos.Epoch = parseUint(t, v)
			case "lsn":
				c.Pos.AppliedLSN = parseUint(t, v)
			case "last":
				e, crc, ok := strings.Cut(v, "/")
				if !ok {
					t.Fatalf("%s: last=%q: want EPOCH/CRC", td.Pos, v)
				}
				n, err := strconv.ParseUint(crc, 16, 32)
				if err != nil {
					t.Fatal(err)
				}
				c.Pos.LastBatch = wal.BatchRef{Epoch: parseUint(t, e), CRC: uint32(n)}
			default:
				t.Fatalf("%s: unknown argument %q", td.Pos, k)
			}
		}
		c.Name = fmt.Sprintf("%s/%d", c.Holder, c.Shard)
		cands = append(cands, c)
	}
	return cands
}

func parseUint(t *testing.T, s string) uint64 {
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func fmtRanking(r Ranking) string {
	var b strings.Builder
	names := func(idx []int) string {
		var s []string
		for _, i := range idx {
			s = append(s, r.cands[i].Name)
		}
		return strings.Join(s, " ")
	}
	for _, s := range r.Shards {
		fmt.Fprintf(&b, "shard %d: leaders %s", s.Shard, names(s.Leaders))
		if s.Best >= 0 {
			fmt.Fprintf(&b, "; best %s", r.cands[s.Best].Name)
		}
		if s.Diverged {
			b.WriteString("; diverged")
		}
		b.WriteByte('\n')
	}
	for i, c := range r.cands {
		switch ahead := r.Ahead(i); {
		case c.Unknown:
			fmt.Fprintf(&b, "%s: unknown\n", c.Name)
		case r.MostAdvanced[i]:
			fmt.Fprintf(&b, "%s: most advanced\n", c.Name)
		default:
			fmt.Fprintf(&b, "%s: behind %s\n", c.Name, names(ahead))
		}
	}
	var hs []string
	for _, h := range r.Holders {
		hs = append(hs, fmt.Sprintf("%s leads %d of %d", h.Holder, h.Leads, h.Shards))
	}
	fmt.Fprintf(&b, "holders: %s\n", strings.Join(hs, ", "))
	fmt.Fprintf(&b, "leader: %s\npromote: %s\n", orNone(r.Leader), orNone(r.Promote))
	fmt.Fprintf(&b, "seen: epoch %d", r.Seen)
	if r.SeenBy != "" {
		fmt.Fprintf(&b, " (%s)", r.SeenBy)
	}
	b.WriteByte('\n')
	return b.String()
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

func fmtEpochErr(err error) string {
	for _, s := range []struct {
		name string
		err  error
	}{{"ErrStaleEpoch", replication.ErrStaleEpoch}, {"ErrEpochExhausted", replication.ErrEpochExhausted}} {
		if errors.Is(err, s.err) {
			return fmt.Sprintf("refused (%s): %v\n", s.name, err)
		}
	}
	return fmt.Sprintf("refused: %v\n", err)
}
