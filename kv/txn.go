package kv

import (
	"fmt"
	"strings"

	"github.com/oncewal/oncewal/kvroute"
)

// Target is what a Compare looks at.
type Target uint8

// Compare targets. The zero value is invalid, so a forgotten field is
// refused instead of comparing something.
const (
	TargetValue   Target = 1 // the value's bytes (Compare.Value)
	TargetVersion Target = 2 // the version (Compare.Number); 0 when absent
	TargetModLSN  Target = 3 // the LSN of the last write (Compare.Number); 0 when absent
	TargetExists  Target = 4 // 1 if the key exists, 0 if not (Compare.Number: 0 or 1)
	// TargetCounter: the key's counter, as Add keeps it (8 bytes,
	// little-endian int64; 0 when absent), compared as a signed number
	// with Compare.Counter. A key whose value is no counter fails every
	// counter compare. Counters are little-endian, so a value compare does
	// not order them: this does.
	TargetCounter Target = 5
)

var targetNames = [...]string{TargetValue: "value", TargetVersion: "version", TargetModLSN: "modlsn", TargetExists: "exists", TargetCounter: "counter"}

func (t Target) valid() bool { return t >= TargetValue && t <= TargetCounter }

// String returns value|version|modlsn|exists, or "target(N)".
func (t Target) String() string {
	if t.valid() {
		return targetNames[t]
	}
	return fmt.Sprintf("target(%d)", uint8(t))
}

// CompareResult is the relation a Compare requires between the key's
// current target and the compare's operand.
type CompareResult uint8

// Compare results; the zero value is invalid.
const (
	Equal    CompareResult = 1
	NotEqual CompareResult = 2
	Less     CompareResult = 3 // current < operand
	Greater  CompareResult = 4 // current > operand
)

var resultNames = [...]string{Equal: "=", NotEqual: "!=", Less: "<", Greater: ">"}

func (r CompareResult) valid() bool { return r >= Equal && r <= Greater }

// String returns = != < >, or "result(N)".
func (r CompareResult) String() string {
	if r.valid() {
		return resultNames[r]
	}
	return fmt.Sprintf("result(%d)", uint8(r))
}

// holds reports whether c (-1, 0, +1: current against operand) satisfies r.
func (r CompareResult) holds(c int) bool {
	switch r {
	case Equal:
		return c == 0
	case NotEqual:
		return c != 0
	case Less:
		return c < 0
	case Greater:
		return c > 0
	}
	return false
}

// Compare is one condition of a transaction's If: Key's Target, as the key
// stands before the transaction, in relation Result to the operand — Value
// for TargetValue, Counter for TargetCounter, Number for the others. The
// fields the target does not
// use must be zero.
type Compare struct {
	Key    []byte
	Target Target
	Result CompareResult
	Value  []byte
	Number uint64
	// Counter is TargetCounter's operand.
	Counter int64
}

// OpKind is the kind of a transaction's op.
type OpKind uint8

// Op kinds; the zero value is invalid.
const (
	Put    OpKind = 1 // Key := Value
	Delete OpKind = 2 // delete Key (nothing to do if absent)
	Add    OpKind = 3 // Key's counter += Delta (absent: 0)
	Get    OpKind = 4 // read Key as the transaction sees it
)

var kindNames = [...]string{Put: "put", Delete: "delete", Add: "add", Get: "get"}

func (k OpKind) valid() bool { return k >= Put && k <= Get }

// String returns put|delete|add|get, or "kind(N)".
func (k OpKind) String() string {
	if k.valid() {
		return kindNames[k]
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Op is one operation of a transaction's Then or Else. Put uses Key and
// Value, Add Key and Delta, Delete and Get Key only; the fields an op does
// not use must be zero.
type Op struct {
	Kind  OpKind
	Key   []byte
	Value []byte
	Delta int64
}

// Txn is a conditional transaction, etcd's model: if every compare of If
// holds (an empty If holds), Then runs, else Else; the ops of the branch
// run in order, each seeing the effects of the ones before it.
type Txn struct {
	If   []Compare
	Then []Op
	Else []Op
}

// Result is what a transaction answered.
type Result struct {
	// Succeeded: the compares held and Then ran (else Else ran).
	Succeeded bool
	// Ops holds one result per op of the branch that ran, in order.
	Ops []OpResult
}

// OpResult is one op's answer.
type OpResult struct {
	Kind OpKind
	// Found: the key existed before the op (for a Get: it exists; for a
	// Delete: there was something to delete).
	Found bool
	// Value: a Get's value (nil if absent); an Add's new counter (8 bytes,
	// little-endian int64). Nil for Put and Delete.
	Value []byte
	// Version and ModLSN: a Get's row (0 if absent); for a Put or an Add
	// the key's new version and the LSN of the event that wrote it; for a
	// Delete that deleted, version 0 and the LSN of its event.
	Version uint64
	ModLSN  uint64
}

// maxProblems bounds the problems an ErrInvalidTxn lists.
const maxProblems = 10

// Validate returns nil for a transaction of a valid shape, else an error
// wrapping ErrInvalidTxn that lists every problem (the first maxProblems
// and how many more): no op in either branch, more than MaxTxnOps in a
// list, more than MaxTxnBytes of keys and values, an empty or oversized key
// or value, unknown targets, results and kinds, a field the target or kind
// does not use, an Exists operand other than 0 or 1.
func (t *Txn) Validate() error {
	var probs []string
	bad := func(format string, args ...any) { probs = append(probs, fmt.Sprintf(format, args...)) }
	if len(t.Then) == 0 && len(t.Else) == 0 {
		bad("no op in Then or Else")
	}
	for _, l := range []struct {
		name string
		n    int
	}{{"If", len(t.If)}, {"Then", len(t.Then)}, {"Else", len(t.Else)}} {
		if l.n > MaxTxnOps {
			bad("%s has %d entries, at most %d", l.name, l.n, MaxTxnOps)
		}
	}
	total := 0
	checkKey := func(where string, k []byte) {
		total += len(k)
		switch {
		case len(k) == 0:
			bad("%s: empty key", where)
		case len(k) > MaxKey:
			bad("%s: key of %d bytes > %d", where, len(k), MaxKey)
		}
	}
	checkValue := func(where string, v []byte) {
		total += len(v)
		if len(v) > MaxValue {
			bad("%s: value of %d bytes > %d", where, len(v), MaxValue)
		}
	}
	for i := range t.If {
		c := &t.If[i]
		where := fmt.Sprintf("If[%d]", i)
		checkKey(where, c.Key)
		checkValue(where, c.Value)
		if !c.Result.valid() {
			bad("%s: unknown result %s", where, c.Result)
		}
		if c.Target != TargetCounter && c.Counter != 0 {
			bad("%s: a %s compare with a counter operand", where, c.Target)
		}
		switch c.Target {
		case TargetValue:
			if c.Number != 0 {
				bad("%s: a value compare with a number", where)
			}
		case TargetCounter:
			if len(c.Value) != 0 || c.Number != 0 {
				bad("%s: a counter compare with a value or a number", where)
			}
		case TargetVersion, TargetModLSN, TargetExists:
			if len(c.Value) != 0 {
				bad("%s: a %s compare with a value", where, c.Target)
			}
			if c.Target == TargetExists && c.Number > 1 {
				bad("%s: exists compares with 0 or 1, not %d", where, c.Number)
			}
		default:
			bad("%s: unknown target %s", where, c.Target)
		}
	}
	for _, br := range []struct {
		name string
		ops  []Op
	}{{"Then", t.Then}, {"Else", t.Else}} {
		for i := range br.ops {
			op := &br.ops[i]
			where := fmt.Sprintf("%s[%d] %s", br.name, i, op.Kind)
			checkKey(where, op.Key)
			checkValue(where, op.Value)
			switch op.Kind {
			case Put:
				if op.Delta != 0 {
					bad("%s: carries a delta", where)
				}
			case Add:
				if len(op.Value) != 0 {
					bad("%s: carries a value", where)
				}
			case Delete, Get:
				if len(op.Value) != 0 || op.Delta != 0 {
					bad("%s: carries a value or delta", where)
				}
			default:
				bad("%s: unknown kind", where)
			}
		}
	}
	if total > MaxTxnBytes {
		bad("%d bytes of keys and values > %d", total, MaxTxnBytes)
	}
	if len(probs) == 0 {
		return nil
	}
	if len(probs) > maxProblems {
		probs = append(probs[:maxProblems], fmt.Sprintf("and %d more", len(probs)-maxProblems))
	}
	return fmt.Errorf("%w: %s", ErrInvalidTxn, strings.Join(probs, "; "))
}

// Shard returns the shard, among shards, of every key of the transaction
// (its compares' and its ops'; kvroute.Shard). Keys in different shards
// are ErrCrossShard, naming two of them; a transaction without keys is
// ErrInvalidTxn.
func (t *Txn) Shard(shards int) (uint32, error) {
	var first []byte
	var shard uint32
	var seen bool
	var err error
	visit := func(k []byte) {
		if err != nil {
			return
		}
		s := kvroute.Shard(k, shards)
		switch {
		case !seen:
			first, shard, seen = k, s, true
		case s != shard:
			err = fmt.Errorf("%w: key %q is in shard %d, key %q in shard %d of %d; a transaction's keys must share "+
				"one shard: give them a common hash tag such as {acct:alice} (only the bytes inside the first {...} "+
				"decide the shard)", ErrCrossShard, first, shard, k, s, shards)
		}
	}
	for i := range t.If {
		visit(t.If[i].Key)
	}
	for _, ops := range [][]Op{t.Then, t.Else} {
		for i := range ops {
			visit(ops[i].Key)
		}
	}
	if err != nil {
		return 0, err
	}
	if !seen {
		return 0, fmt.Errorf("%w: no keys, so no shard", ErrInvalidTxn)
	}
	return shard, nil
}
