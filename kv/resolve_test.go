package kv_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"

	"github.com/oncewal/oncewal/kv"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/wal"
)

// fakeStore is a map-backed kv.Reader standing for the committed store: the
// resolve script seeds it and applies each transaction's events to it, as a
// replica would.
type fakeStore struct {
	rows    map[string]kv.Row
	corrupt map[string]bool
	next    uint64 // the LSN the next transaction starts at by default
}

func (f *fakeStore) Get(scoped []byte) (kv.Row, bool, error) {
	if f.corrupt[string(scoped)] {
		return kv.Row{}, false, fmt.Errorf("row %q: %w", scoped, kv.ErrCorrupt)
	}
	r, ok := f.rows[string(scoped)]
	return r, ok, nil
}

// apply applies events as the store does: a kvput writes the whole row at
// the event's version and LSN, a kvdelete removes it.
func (f *fakeStore) apply(events []wal.Event) {
	for _, ev := range events {
		switch ev.Op {
		case wal.OpKVPut:
			f.rows[string(ev.Key)] = kv.Row{Value: slices.Clone(ev.Value), Version: uint64(ev.Delta), ModLSN: ev.LSN}
		case wal.OpKVDelete:
			delete(f.rows, string(ev.Key))
		}
		f.next = ev.LSN + 1
	}
}

var sid = session.ID{0xaa}

// TestResolve runs the scripts in testdata/resolve. Commands:
//
//	put [principal=P] key=K value=V [version=N]
//	    seeds the store (default principal alice; version: one more than
//	    the key's; modLSN: the next LSN, which then advances)
//	delete [principal=P] key=K
//	corrupt [principal=P] key=K
//	    reading the key fails (a corrupt row)
//	txn [principal=P] [first=LSN] [shards=N]
//	if <value|version|modlsn|exists|counter> KEY <=|!=|<|>> OPERAND
//	then|else put KEY VALUE | delete KEY | add KEY DELTA | get KEY
//	    one line per compare and op; shards=N first prints the
//	    transaction's shard (Txn.Shard) and stops on its error. The
//	    events, if resolved, are applied to the store.
//	dump
//	    the store's rows
//
// A KEY or VALUE token is literal, "" for empty, x*N for N copies of x,
// or c:N for the 8-byte counter N.
func TestResolve(t *testing.T) {
	datadriven.Walk(t, "testdata/resolve", func(t *testing.T, path string) {
		f := &fakeStore{rows: map[string]kv.Row{}, corrupt: map[string]bool{}, next: 1}
		datadriven.RunTest(t, path, func(t *testing.T, td *datadriven.TestData) string {
			principal := "alice"
			if td.HasArg("principal") {
				td.ScanArgs(t, "principal", &principal)
				principal = string(token(t, principal))
			}
			key := func() []byte {
				var k string
				td.ScanArgs(t, "key", &k)
				return kv.Scoped(principal, token(t, k))
			}
			switch td.Cmd {
			case "put":
				k := key()
				var v string
				td.ScanArgs(t, "value", &v)
				r := kv.Row{Value: token(t, v), Version: f.rows[string(k)].Version + 1, ModLSN: f.next}
				if td.HasArg("version") {
					td.ScanArgs(t, "version", &r.Version)
				}
				f.rows[string(k)] = r
				f.next++
				return ""
			case "delete":
				delete(f.rows, string(key()))
				return ""
			case "corrupt":
				f.corrupt[string(key())] = true
				return ""
			case "dump":
				var sb strings.Builder
				for _, k := range slices.Sorted(maps.Keys(f.rows)) {
					r := f.rows[k]
					fmt.Fprintf(&sb, "%s = %s version %d modlsn %d\n", showScoped(t, []byte(k)), show(r.Value), r.Version, r.ModLSN)
				}
				return sb.String()
			case "txn":
				return runTxn(t, td, f, principal)
			}
			t.Fatalf("%s: unknown command %q", td.Pos, td.Cmd)
			return ""
		})
	})
}

func runTxn(t *testing.T, td *datadriven.TestData, f *fakeStore, principal string) string {
	txn := parseTxn(t, td.Input)
	var sb strings.Builder
	if td.HasArg("shards") {
		var n int
		td.ScanArgs(t, "shards", &n)
		s, err := txn.Shard(n)
		if err != nil {
			return fmt.Sprintf("shard: %s\n", showErr(err))
		}
		fmt.Fprintf(&sb, "shard %d of %d\n", s, n)
	}
	first := f.next
	if td.HasArg("first") {
		td.ScanArgs(t, "first", &first)
	}
	events, res, err := kv.Resolve(f, principal, txn, sid, first)
	if err != nil {
		if len(events) != 0 || res.Succeeded || res.Ops != nil {
			t.Fatalf("%s: an error came with events or a result", td.Pos)
		}
		sb.WriteString(showErr(err) + "\n")
		return sb.String()
	}
	if res.Succeeded {
		sb.WriteString("succeeded (then)\n")
	} else {
		sb.WriteString("failed (else)\n")
	}
	for i, ev := range events {
		if ev.LSN != first+uint64(i) || ev.Session != sid {
			t.Fatalf("%s: event %d has LSN %d, session %s", td.Pos, i, ev.LSN, ev.Session)
		}
		// The events are valid WAL events: they encode and decode to themselves.
		raw, err := wal.AppendBatch(nil, 0, 1, ev.LSN, []wal.Event{ev})
		if err != nil {
			t.Fatalf("%s: event %d does not encode: %v", td.Pos, i, err)
		}
		if _, back, err := wal.DecodeBatch(raw, nil); err != nil || back[0].Op != ev.Op || string(back[0].Key) != string(ev.Key) {
			t.Fatalf("%s: event %d does not decode to itself: %v", td.Pos, i, err)
		}
		switch ev.Op {
		case wal.OpKVPut:
			fmt.Fprintf(&sb, "  event %d: kvput %s = %s version %d\n", ev.LSN, showScoped(t, ev.Key), show(ev.Value), ev.Delta)
		default:
			fmt.Fprintf(&sb, "  event %d: %s %s\n", ev.LSN, ev.Op, showScoped(t, ev.Key))
		}
	}
	for _, r := range res.Ops {
		fmt.Fprintf(&sb, "  %s:", r.Kind)
		if r.Found {
			sb.WriteString(" found")
		} else {
			sb.WriteString(" absent")
		}
		if r.Value != nil {
			sb.WriteString(" " + show(r.Value))
		}
		fmt.Fprintf(&sb, " version %d modlsn %d\n", r.Version, r.ModLSN)
	}
	f.apply(events)
	return sb.String()
}

func parseTxn(t *testing.T, input string) *kv.Txn {
	txn := &kv.Txn{}
	for _, line := range strings.Split(input, "\n") {
		fs := strings.Fields(line)
		if len(fs) == 0 {
			continue
		}
		switch fs[0] {
		case "if":
			if len(fs) != 5 {
				t.Fatalf("compare %q: want if TARGET KEY RESULT OPERAND", line)
			}
			c := kv.Compare{Key: token(t, fs[2])}
			c.Target = map[string]kv.Target{"value": kv.TargetValue, "version": kv.TargetVersion,
				"modlsn": kv.TargetModLSN, "exists": kv.TargetExists, "counter": kv.TargetCounter, "bad": 99}[fs[1]]
			c.Result = map[string]kv.CompareResult{"=": kv.Equal, "!=": kv.NotEqual, "<": kv.Less, ">": kv.Greater, "?": 0}[fs[3]]
			switch c.Target {
			case kv.TargetValue:
				c.Value = token(t, fs[4])
			case kv.TargetCounter:
				n, err := strconv.ParseInt(fs[4], 10, 64)
				if err != nil {
					t.Fatalf("compare %q: %v", line, err)
				}
				c.Counter = n
			default:
				n, err := strconv.ParseUint(fs[4], 10, 64)
				if err != nil {
					t.Fatalf("compare %q: %v", line, err)
				}
				c.Number = n
			}
			txn.If = append(txn.If, c)
		case "then", "else":
			if len(fs) < 3 {
				t.Fatalf("op %q: want then|else KIND KEY [ARG]", line)
			}
			op := kv.Op{Key: token(t, fs[2])}
			op.Kind = map[string]kv.OpKind{"put": kv.Put, "delete": kv.Delete, "add": kv.Add, "get": kv.Get, "bad": 77}[fs[1]]
			if len(fs) > 3 {
				switch op.Kind {
				case kv.Add:
					d, err := strconv.ParseInt(fs[3], 10, 64)
					if err != nil {
						t.Fatalf("op %q: %v", line, err)
					}
					op.Delta = d
				default:
					op.Value = token(t, fs[3])
				}
			}
			if fs[0] == "then" {
				txn.Then = append(txn.Then, op)
			} else {
				txn.Else = append(txn.Else, op)
			}
		case "repeat": // repeat N then|else|if ...: N copies of the line
			n, err := strconv.Atoi(fs[1])
			if err != nil {
				t.Fatal(err)
			}
			inner := parseTxn(t, strings.Join(fs[2:], " "))
			for range n {
				txn.If = append(txn.If, inner.If...)
				txn.Then = append(txn.Then, inner.Then...)
				txn.Else = append(txn.Else, inner.Else...)
			}
		default:
			t.Fatalf("txn line %q: want if, then, else or repeat", line)
		}
	}
	return txn
}

func token(t *testing.T, s string) []byte {
	switch {
	case s == `""`:
		return []byte{}
	case strings.HasPrefix(s, "c:"):
		n, err := strconv.ParseInt(s[2:], 10, 64)
		if err != nil {
			t.Fatalf("counter %q: %v", s, err)
		}
		return binary.LittleEndian.AppendUint64(nil, uint64(n))
	case strings.Contains(s, "*"):
		i := strings.LastIndex(s, "*")
		n, err := strconv.Atoi(s[i+1:])
		if err != nil {
			t.Fatalf("token %q: %v", s, err)
		}
		return []byte(strings.Repeat(s[:i], n))
	}
	return []byte(s)
}

// show prints a value: a counter-sized one also as its number, a long one
// by its length.
func show(v []byte) string {
	switch {
	case len(v) > 24:
		return fmt.Sprintf("<%d bytes>", len(v))
	case len(v) == 8:
		return fmt.Sprintf("%q (c:%d)", v, int64(binary.LittleEndian.Uint64(v)))
	}
	return fmt.Sprintf("%q", v)
}

func showScoped(t *testing.T, scoped []byte) string {
	p, k, err := kv.SplitScoped(scoped)
	if err != nil {
		t.Fatalf("scoped key %q: %v", scoped, err)
	}
	if len(p) > 24 {
		p = fmt.Sprintf("<%d bytes>", len(p))
	}
	if len(k) > 24 {
		return fmt.Sprintf("%s/<%d bytes>", p, len(k))
	}
	return p + "/" + string(k)
}

// showErr names the error's sentinel and prints its message.
func showErr(err error) string {
	for _, s := range []struct {
		name string
		err  error
	}{{"ErrInvalidTxn", kv.ErrInvalidTxn}, {"ErrInvalidPrincipal", kv.ErrInvalidPrincipal}, {"ErrCrossShard", kv.ErrCrossShard},
		{"ErrNotCounter", kv.ErrNotCounter}, {"ErrOverflow", kv.ErrOverflow}, {"ErrResultTooLarge", kv.ErrResultTooLarge},
		{"ErrCorrupt", kv.ErrCorrupt}} {
		if errors.Is(err, s.err) {
			return fmt.Sprintf("error %s: %v", s.name, err)
		}
	}
	return fmt.Sprintf("error (untyped): %v", err)
}
