package follower_test

import (
	"bytes"
	"fmt"
	"maps"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/oncewal/oncewal/sim"
	"github.com/stretchr/testify/require"
)

// requestModel is the sequential specification of the request API the
// failover simulation's clients use, for porcupine: a request (key, counter,
// delta) executes the first time its key is seen — the counter grows by
// delta and the answer is sim.FailoverOutcome of the counter's value
// then — and every later request of the key answers that recorded outcome
// again, verbatim, without touching the counter. A history is correct iff
// some order of its operations, consistent with real time (an operation
// that returned before another was called comes first), follows this
// specification: every key executed once, every answer either that
// execution or its replay, and every execution saw all earlier ones.
//
// Requests of different counters are independent (a key belongs to one
// counter), so the history is checked per counter.
var requestModel = porcupine.Model{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		by := map[int][]porcupine.Operation{}
		for _, op := range history {
			c := op.Input.(reqInput).counter
			by[c] = append(by[c], op)
		}
		var out [][]porcupine.Operation
		for _, c := range sortedKeys(by) {
			out = append(out, by[c])
		}
		return out
	},
	Init: func() any { return reqState{} },
	Step: func(state, input, output any) (bool, any) {
		st, in, out := state.(reqState), input.(reqInput), output.([]byte)
		if rec, ok := st.done[in.key]; ok {
			return rec == string(out), st // a replay of the recorded outcome
		}
		want := sim.FailoverOutcome(in.key, in.counter, in.delta, st.value)
		if !bytes.Equal(want, out) {
			return false, st
		}
		next := reqState{value: st.value + in.delta, done: maps.Clone(st.done)}
		if next.done == nil {
			next.done = map[string]string{}
		}
		next.done[in.key] = string(out)
		return true, next
	},
	Equal: func(a, b any) bool {
		x, y := a.(reqState), b.(reqState)
		return x.value == y.value && maps.Equal(x.done, y.done)
	},
	DescribeOperation: func(input, output any) string {
		in := input.(reqInput)
		return fmt.Sprintf("%s(add %d to c%d) -> %q", in.key, in.delta, in.counter, output)
	},
	DescribeState: func(state any) string {
		st := state.(reqState)
		return fmt.Sprintf("value %d, %d keys recorded", st.value, len(st.done))
	},
}

type reqInput struct {
	key     string
	counter int
	delta   int64
}

// reqState is one counter's value and the outcomes recorded for its keys.
// Step never mutates a state; it copies the map.
type reqState struct {
	value int64
	done  map[string]string
}

func sortedKeys(m map[int][]porcupine.Operation) []int {
	out := make([]int, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Ints(out)
	return out
}

// checkHistory checks a failover run's client history with porcupine. Lost
// answers (asynchronous replication, died with A) are left out: they are
// not part of the surviving history (the run itself verifies they are
// exactly the asynchronous window).
func checkHistory(t *testing.T, h []sim.ClientOp) porcupine.CheckResult {
	t.Helper()
	ops := make([]porcupine.Operation, 0, len(h))
	for _, o := range h {
		if o.Lost {
			continue
		}
		require.NotZero(t, o.Return, "operation %d (%s) never answered", o.Client, o.Key)
		ops = append(ops, porcupine.Operation{ClientId: o.Client, Call: o.Call, Return: o.Return,
			Input: reqInput{key: o.Key, counter: o.Counter, delta: o.Delta}, Output: o.Outcome})
	}
	res, _ := porcupine.CheckOperationsVerbose(requestModel, ops, 10*time.Second)
	return res
}

// TestFailoverHistoryCheckerCatchesViolations: the model and the checker
// are not vacuous. A real run's history passes; the same history with a
// request executed twice (a later answer computed afresh instead of
// replayed), with a replay that differs from the recorded outcome, or with
// an execution that missed an earlier one (a stale counter read) fails.
func TestFailoverHistoryCheckerCatchesViolations(t *testing.T) {
	res, err := sim.RunFailover(sim.FailoverOptions{Dir: t.TempDir(), Seed: 7, Requests: 30})
	require.NoError(t, err)
	require.True(t, res.Verified, "%v", res.VerifyErr)
	require.Equal(t, porcupine.Ok, checkHistory(t, res.History))

	// Find a key answered at least twice, sequentially.
	byKey := map[string][]int{}
	for i, o := range res.History {
		byKey[o.Key] = append(byKey[o.Key], i)
	}
	var first, second int = -1, -1
	for _, idx := range byKey {
		if len(idx) >= 2 && res.History[idx[0]].Return < res.History[idx[1]].Call {
			first, second = idx[0], idx[1]
			break
		}
	}
	require.NotEqual(t, -1, first)
	mutate := func(f func(h []sim.ClientOp)) []sim.ClientOp {
		h := append([]sim.ClientOp(nil), res.History...)
		f(h)
		return h
	}
	// Executed twice: the second answer as a fresh execution would give it.
	twice := mutate(func(h []sim.ClientOp) {
		o := h[first]
		var after int64
		_, err := fmt.Sscanf(string(o.Outcome[strings.LastIndex(string(o.Outcome), "=")+1:]), " %d", &after)
		require.NoError(t, err)
		h[second].Outcome = sim.FailoverOutcome(o.Key, o.Counter, o.Delta, after)
	})
	require.Equal(t, porcupine.Illegal, checkHistory(t, twice), "a double execution passed")
	// A replay that is not verbatim.
	altered := mutate(func(h []sim.ClientOp) { h[second].Outcome = append(bytes.Clone(h[second].Outcome), ' ') })
	require.Equal(t, porcupine.Illegal, checkHistory(t, altered), "an altered replay passed")
	// An execution that missed its predecessor on the counter (a stale
	// read): the second key executed on a counter answers as if the first
	// had not happened.
	before := func(o sim.ClientOp) int64 {
		var after int64
		_, err := fmt.Sscanf(string(o.Outcome[strings.LastIndex(string(o.Outcome), "=")+1:]), " %d", &after)
		require.NoError(t, err)
		return after - o.Delta
	}
	stale := mutate(func(h []sim.ClientOp) {
		for _, o1 := range h { // the first execution on its counter saw 0 ...
			if o1.Lost || before(o1) != 0 {
				continue
			}
			for _, o2 := range h { // ... the second saw the first's delta
				if o2.Lost || o2.Counter != o1.Counter || o2.Key == o1.Key || before(o2) != o1.Delta {
					continue
				}
				for _, i := range byKey[o2.Key] {
					h[i].Outcome = sim.FailoverOutcome(o2.Key, o2.Counter, o2.Delta, 0)
				}
				return
			}
		}
		t.Fatal("no counter with two executions")
	})
	require.Equal(t, porcupine.Illegal, checkHistory(t, stale), "a stale read passed")
}
