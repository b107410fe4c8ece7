package clienthistory

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/stretchr/testify/require"

	"github.com/oncewal/oncewal/client"
)

// Total is the counter every request adds 1 to: it must end equal to the
// number of requests that took effect (invariant 3).
const Total = "total"

// Answer is one Submit of a request as its caller saw it.
type Answer struct {
	Res       client.Result
	Err       error
	Call, Ret int64     // ticks of the history's clock, for porcupine
	At        time.Time // when the answer came, for a test's timings
}

// OK reports whether the Submit succeeded.
func (a Answer) OK() bool { return a.Err == nil }

// Request is one request ID of one client and every answer it got.
type Request struct {
	Client, ID string
	mu         sync.Mutex
	answers    []Answer
}

// Key is the request's own counter: it must end at 1 if the request took
// effect, 0 if not, never more.
func (r *Request) Key() string { return "req/" + r.ID }

// Payload is the request's operations: add 1 to Key and to Total.
func (r *Request) Payload() []byte {
	return client.Ops(client.Add([]byte(r.Key()), 1), client.Add([]byte(Total), 1))
}

// Answers returns a copy of the answers so far.
func (r *Request) Answers() []Answer {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Answer(nil), r.answers...)
}

// Acked reports whether any answer was OK.
func (r *Request) Acked() bool {
	for _, a := range r.Answers() {
		if a.OK() {
			return true
		}
	}
	return false
}

// History records every request of every client. The zero value is ready.
type History struct {
	// OnAnswer, if set before the first Submit, sees every answer as it
	// is recorded (a test measuring failovers by the epochs it answers).
	OnAnswer func(*Request, Answer)

	ticks    atomic.Int64
	mu       sync.Mutex
	reqs     []*Request
	answered atomic.Int64
	stopped  atomic.Bool
}

// Answered is the number of answers so far (any), to pace faults.
func (h *History) Answered() int64 { return h.answered.Load() }

// Stop makes every Drive return after its current request, without
// cutting a Submit short (a cancelled context would answer it with the
// caller's context error, which tells nothing about the request).
func (h *History) Stop() { h.stopped.Store(true) }

// Requests returns every request so far.
func (h *History) Requests() []*Request {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]*Request(nil), h.reqs...)
}

// NewRequest records a new request ID of client name.
func (h *History) NewRequest(name, id string) *Request {
	r := &Request{Client: name, ID: id}
	h.mu.Lock()
	h.reqs = append(h.reqs, r)
	h.mu.Unlock()
	return r
}

// Submit sends r once through cl and records the answer.
func (h *History) Submit(ctx context.Context, cl *client.Client, r *Request) Answer {
	a := Answer{Call: h.ticks.Add(1)}
	a.Res, a.Err = cl.Submit(ctx, r.ID, r.Payload(), client.WithAction("add 1 to "+r.Key()))
	a.Ret, a.At = h.ticks.Add(1), time.Now()
	r.mu.Lock()
	r.answers = append(r.answers, a)
	r.mu.Unlock()
	h.answered.Add(1)
	if h.OnAnswer != nil {
		h.OnAnswer(r, a)
	}
	return a
}

// Drive runs client name's workload of n requests (n <= 0: until Stop or
// ctx ends) through cl: each is submitted; one in ten twice at once (a
// duplicate in flight); three in ten again after its answer, as a caller
// that lost the answer would — and one whose outcome was unknown is
// retried once more the same way.
func (h *History) Drive(ctx context.Context, cl *client.Client, name string, n int, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 0xc11e))
	for i := 0; n <= 0 || i < n; i++ {
		if ctx.Err() != nil || h.stopped.Load() {
			return
		}
		r := h.NewRequest(name, fmt.Sprintf("%s-%04d", name, i))
		dup, again := rng.IntN(10) == 0, rng.IntN(10) < 3
		var wg sync.WaitGroup
		if dup {
			wg.Go(func() { h.Submit(ctx, cl, r) })
		}
		a := h.Submit(ctx, cl, r)
		wg.Wait()
		if again || errors.Is(a.Err, client.ErrOutcomeUnknown) {
			h.Submit(ctx, cl, r)
		}
	}
}

// Verdict is what the oracle concluded, for the test's log.
type Verdict struct{ Requests, Acked, Unknown, Took, Replays int }

func (v Verdict) String() string {
	return fmt.Sprintf("%d requests: %d acknowledged, %d never told, %d took effect, %d replayed answers",
		v.Requests, v.Acked, v.Unknown, v.Took, v.Replays)
}

// Check is the oracle over one replica's effects (its counters summed over
// sessions): invariants 1–3. Every answer must be one the client's
// contract allows here: OK, ErrOutcomeUnknown or ErrUnavailable.
func (h *History) Check(t testing.TB, where string, eff map[string]int64) Verdict {
	t.Helper()
	var v Verdict
	var took int64
	for _, r := range h.Requests() {
		v.Requests++
		n := eff[r.Key()]
		acked, notRun := false, true // notRun: every answer said it did not run
		for _, a := range r.Answers() {
			switch {
			case a.OK():
				acked = true
			case errors.Is(a.Err, client.ErrOutcomeUnknown):
			case errors.Is(a.Err, client.ErrUnavailable):
				continue
			default:
				t.Fatalf("%s: request %s: an answer the client should not give here: %v", where, r.ID, a.Err)
			}
			notRun = false
		}
		switch {
		case acked:
			v.Acked++
			require.Equal(t, int64(1), n, "%s: request %s was acknowledged; it took effect %d times", where, r.ID, n)
		case notRun:
			require.Zero(t, n, "%s: request %s: every answer said it did not run, yet it took effect", where, r.ID)
		default:
			v.Unknown++
			require.LessOrEqual(t, n, int64(1), "%s: request %s (outcome never told) took effect %d times", where, r.ID, n)
		}
		took += n
		if n == 1 {
			v.Took++
		}
	}
	require.Equal(t, took, eff[Total], "%s: the shared counter is not the number of requests that took effect", where)
	return v
}

// CheckAnswers is invariant 4: every request has at most one fresh (not
// replayed) OK, and every success answers the one run's outcome. It
// returns the number of replayed answers.
func (h *History) CheckAnswers(t testing.TB) (replays int) {
	t.Helper()
	for _, r := range h.Requests() {
		fresh, outcome := 0, ""
		for _, a := range r.Answers() {
			if !a.OK() {
				continue
			}
			if a.Res.Replayed {
				replays++
			} else {
				fresh++
			}
			if outcome == "" {
				outcome = string(a.Res.Outcome)
			}
			require.Equal(t, outcome, string(a.Res.Outcome), "request %s: two answers with different outcomes: it ran twice", r.ID)
		}
		require.LessOrEqual(t, fresh, 1, "request %s answered OK (not replayed) %d times: it ran more than once", r.ID, fresh)
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

// CheckLinearizable is invariant 5: porcupine on every client's
// successful answers.
func (h *History) CheckLinearizable(t testing.TB) {
	t.Helper()
	byClient := map[string][]porcupine.Operation{}
	for _, r := range h.Requests() {
		for _, a := range r.Answers() {
			if a.OK() {
				byClient[r.Client] = append(byClient[r.Client], porcupine.Operation{Input: pIn{r.ID},
					Output: pOut{!a.Res.Replayed, string(a.Res.Outcome)}, Call: a.Call, Return: a.Ret})
			}
		}
	}
	for name, ops := range byClient {
		res := porcupine.CheckOperationsTimeout(requestModel, ops, 30*time.Second)
		require.Equal(t, porcupine.Ok, res, "client %s: history not linearizable against the request model", name)
	}
}

// CheckEpochsGrow: no write is acknowledged at an epoch below one already
// acknowledged before it was sent (by the history's clock, over every
// client): once a successor has answered, a deposed leader (a zombie
// woken from a pause, one cut from etcd) answers nothing — node invariants
// 1 and 3 as a client sees them. It returns the epochs that acknowledged
// writes, in order.
func (h *History) CheckEpochsGrow(t testing.TB) []uint64 {
	t.Helper()
	var oks []Answer
	byAnswer := map[int64]string{}
	for _, r := range h.Requests() {
		for _, a := range r.Answers() {
			if a.OK() {
				oks = append(oks, a)
				byAnswer[a.Call] = r.ID
			}
		}
	}
	byRet := slices.Clone(oks)
	slices.SortFunc(byRet, func(a, b Answer) int { return cmp.Compare(a.Ret, b.Ret) })
	slices.SortFunc(oks, func(a, b Answer) int { return cmp.Compare(a.Call, b.Call) })
	var epochs []uint64
	var high Answer // the highest epoch among answers returned so far
	j := 0
	for _, b := range oks {
		for ; j < len(byRet) && byRet[j].Ret < b.Call; j++ {
			if byRet[j].Res.Epoch > high.Res.Epoch {
				high = byRet[j]
			}
		}
		require.GreaterOrEqual(t, b.Res.Epoch, high.Res.Epoch,
			"request %s was acknowledged at epoch %d after request %s had been at epoch %d: a deposed leader answered",
			byAnswer[b.Call], b.Res.Epoch, byAnswer[high.Call], high.Res.Epoch)
		epochs = append(epochs, b.Res.Epoch)
	}
	slices.Sort(epochs)
	return slices.Compact(epochs)
}
