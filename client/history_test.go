package client_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/stretchr/testify/require"

	"github.com/oncewal/oncewal/client"
	"github.com/oncewal/oncewal/internal/ledgerrecord"
	"github.com/oncewal/oncewal/wal"
)

// totalKey is the counter every request adds 1 to: it must end equal to
// the number of requests that took effect.
const totalKey = "total"

// answer is one Submit of a request as its caller saw it.
type answer struct {
	res       client.Result
	err       error
	call, ret int64 // ticks of the history's clock, for porcupine
}

func (a answer) ok() bool { return a.err == nil }

// request is one request ID of one client and every answer it got.
type request struct {
	client, id string
	mu         sync.Mutex
	answers    []answer
}

// key is the request's own counter: it must end at 1 if the request took
// effect, 0 if not, never more.
func (r *request) key() string { return "req/" + r.id }

func (r *request) payload() []byte {
	return client.Ops(client.Add([]byte(r.key()), 1), client.Add([]byte(totalKey), 1))
}

// history records every request of every client.
type history struct {
	ticks    atomic.Int64
	mu       sync.Mutex
	reqs     []*request
	answered atomic.Int64 // answers so far (any), for the tests to pace faults
}

// submit sends r once through cl and records the answer.
func (h *history) submit(ctx context.Context, cl *client.Client, r *request) answer {
	a := answer{call: h.ticks.Add(1)}
	a.res, a.err = cl.Submit(ctx, r.id, r.payload(), client.WithAction("add 1 to "+r.key()))
	a.ret = h.ticks.Add(1)
	r.mu.Lock()
	r.answers = append(r.answers, a)
	r.mu.Unlock()
	h.answered.Add(1)
	return a
}

// drive runs client name's workload of n requests through cl: each is
// submitted; one in ten twice at once (a duplicate in flight); three in
// ten again after its answer, as a caller that lost the answer would —
// and one whose outcome was unknown is retried once more the same way.
func (h *history) drive(ctx context.Context, cl *client.Client, name string, n int, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 0xc11e))
	for i := range n {
		r := &request{client: name, id: fmt.Sprintf("%s-%04d", name, i)}
		h.mu.Lock()
		h.reqs = append(h.reqs, r)
		h.mu.Unlock()
		dup, again := rng.IntN(10) == 0, rng.IntN(10) < 3
		var wg sync.WaitGroup
		if dup {
			wg.Go(func() { h.submit(ctx, cl, r) })
		}
		a := h.submit(ctx, cl, r)
		wg.Wait()
		if again || errors.Is(a.err, client.ErrOutcomeUnknown) {
			h.submit(ctx, cl, r)
		}
		if ctx.Err() != nil {
			return
		}
	}
}

// verdict is what the oracle concluded, for the test's log.
type verdict struct{ requests, acked, unknown, took, replays int }

func (v verdict) String() string {
	return fmt.Sprintf("%d requests: %d acknowledged, %d never told, %d took effect, %d replayed answers",
		v.requests, v.acked, v.unknown, v.took, v.replays)
}

// check is the oracle over one store set's effects (the leader's or a
// follower's): every request the client was told succeeded took effect
// exactly once; one it was never told took effect at most once (and not
// at all if every answer said it did not run); the shared counter is the
// number of requests that took effect; and every answer is one the
// client's contract allows.
func (h *history) check(t *testing.T, where string, eff map[string]int64) verdict {
	t.Helper()
	var v verdict
	var took int64
	for _, r := range h.reqs {
		v.requests++
		n := eff[r.key()]
		acked, notRun := false, true // notRun: every answer said it did not run
		for _, a := range r.answers {
			switch {
			case a.ok():
				acked = true
			case errors.Is(a.err, client.ErrOutcomeUnknown):
			case errors.Is(a.err, client.ErrUnavailable):
				continue
			default:
				t.Fatalf("%s: request %s: an answer the client should not give here: %v", where, r.id, a.err)
			}
			notRun = false
		}
		switch {
		case acked:
			v.acked++
			require.Equal(t, int64(1), n, "%s: request %s was acknowledged; it took effect %d times", where, r.id, n)
		case notRun:
			require.Zero(t, n, "%s: request %s: every answer said it did not run, yet it took effect", where, r.id)
		default:
			v.unknown++
			require.LessOrEqual(t, n, int64(1), "%s: request %s (outcome never told) took effect %d times", where, r.id, n)
		}
		took += n
		if n == 1 {
			v.took++
		}
	}
	require.Equal(t, took, eff[totalKey], "%s: the shared counter is not the number of requests that took effect", where)
	return v
}

// checkAnswers: every request has at most one fresh (not replayed) OK, and
// every success answers the one run's outcome (the handler makes each
// run's outcome unique).
func (h *history) checkAnswers(t *testing.T) (replays int) {
	t.Helper()
	for _, r := range h.reqs {
		fresh, outcome := 0, ""
		for _, a := range r.answers {
			if !a.ok() {
				continue
			}
			if a.res.Replayed {
				replays++
			} else {
				fresh++
			}
			if outcome == "" {
				outcome = string(a.res.Outcome)
			}
			require.Equal(t, outcome, string(a.res.Outcome), "request %s: two answers with different outcomes: it ran twice", r.id)
		}
		require.LessOrEqual(t, fresh, 1, "request %s answered OK (not replayed) %d times: it ran more than once", r.id, fresh)
	}
	return replays
}

// pIn and pOut are a porcupine operation of the request model: a
// successful Submit of request ID, answered fresh (it ran) or replayed,
// with its outcome.
type (
	pIn  struct{ id string }
	pOut struct {
		fresh   bool
		outcome string
	}
)

// requestModel is the sequential contract of one request ID: the first
// successful answer in the linearization either ran it (fresh) or replays
// a run whose answer was lost; every later answer is a replay of that
// run's outcome — a fresh answer after the request has an outcome means it
// ran twice. Unsuccessful answers (outcome unknown, unavailable) are left
// out of the history: the model allows both "it ran" and "it did not"
// for them, so they constrain nothing.
var requestModel = porcupine.Model{
	Partition: func(ops []porcupine.Operation) [][]porcupine.Operation {
		by := map[string][]porcupine.Operation{}
		var order []string
		for _, op := range ops {
			id := op.Input.(pIn).id
			if _, ok := by[id]; !ok {
				order = append(order, id)
			}
			by[id] = append(by[id], op)
		}
		out := make([][]porcupine.Operation, 0, len(order))
		for _, id := range order {
			out = append(out, by[id])
		}
		return out
	},
	Init: func() any { return "" },
	Step: func(state, _, output any) (bool, any) {
		s, o := state.(string), output.(pOut)
		switch {
		case s == "":
			return true, o.outcome
		case o.fresh:
			return false, s
		default:
			return o.outcome == s, s
		}
	},
	DescribeOperation: func(in, out any) string {
		return fmt.Sprintf("%s -> fresh=%v %s", in.(pIn).id, out.(pOut).fresh, out.(pOut).outcome)
	},
}

// checkLinearizable runs porcupine on every client's successful answers.
func (h *history) checkLinearizable(t *testing.T) {
	t.Helper()
	byClient := map[string][]porcupine.Operation{}
	for _, r := range h.reqs {
		for _, a := range r.answers {
			if a.ok() {
				byClient[r.client] = append(byClient[r.client], porcupine.Operation{Input: pIn{r.id},
					Output: pOut{!a.res.Replayed, string(a.res.Outcome)}, Call: a.call, Return: a.ret})
			}
		}
	}
	for name, ops := range byClient {
		res := porcupine.CheckOperationsTimeout(requestModel, ops, 30*time.Second)
		require.Equal(t, porcupine.Ok, res, "client %s: history not linearizable against the request model", name)
	}
}

// checkWAL reads every shard's log in walDir: each request ID has at most
// one ledger complete record, an acknowledged one exactly one, whose
// outcome is the one its answers gave.
func (h *history) checkWAL(t *testing.T, walDir string, shards int) {
	t.Helper()
	completes := map[[2]string][]ledgerrecord.Record{}
	for s := range uint32(shards) {
		rd, err := wal.OpenReader(walDir, s)
		require.NoError(t, err)
		for {
			_, raw, err := rd.Next()
			if errors.Is(err, io.EOF) {
				break // the end of what was logged
			}
			require.NoError(t, err)
			_, evs, err := wal.DecodeBatch(raw, nil)
			require.NoError(t, err)
			for i := range evs {
				if !evs[i].Op.IsLedger() {
					continue
				}
				rec, err := evs[i].LedgerRecord()
				require.NoError(t, err)
				if rec.Kind == ledgerrecord.Complete {
					rec.Outcome = bytes.Clone(rec.Outcome) // it points into the reader's buffer
					k := [2]string{rec.Scope, rec.Key}
					completes[k] = append(completes[k], rec)
				}
			}
		}
		require.NoError(t, rd.Close())
	}
	for _, r := range h.reqs {
		recs := completes[[2]string{r.client, r.id}]
		require.LessOrEqual(t, len(recs), 1, "request %s has %d complete records in the WAL", r.id, len(recs))
		for _, a := range r.answers {
			if a.ok() {
				require.Len(t, recs, 1, "acknowledged request %s has no complete record in the WAL", r.id)
				require.Equal(t, string(a.res.Outcome), string(recs[0].Outcome), "request %s: the answer's outcome is not the WAL's", r.id)
			}
		}
	}
}
