package client

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	clientv1 "github.com/oncewal/oncewal/proto/oncewal/client/v1"
)

// verdict is what an attempt says to do next.
type verdict uint8

const (
	vDone verdict = iota // the call ends with step.err (nil: success)
	vMove                // try step.addr next ("": the next known address)
	vWait                // back off, then try the same address again
)

// step is the end of one attempt.
type step struct {
	v    verdict
	addr string
	// err ends the call (vDone) or says why the attempt failed.
	err error
	// sent: the request may have run (invariant 3).
	sent bool
	// epoch is the leader epoch the answer carried (0: none): an OK's or a
	// Replay's, or the one a NotLeader names with its leader (invariant 9).
	epoch uint64
	// redirect: the node answered NotLeader, naming addr as the leader
	// ("": unknown).
	redirect bool
	// replica: the answer (a read at a MinLSN) may come from a node that
	// does not lead: no proof of leadership, so calls do not start there.
	replica bool
}

// errBudget ends a call's context when its RetryTimeout is spent.
var errBudget = errors.New("retry budget spent")

// run makes attempts until one is final or the budget is spent
// (invariants 3 and 5). what names the call in errors and logs.
func (c *Client) run(ctx context.Context, what string, attempt func(ctx context.Context, addr string) step) error {
	return c.runFrom(ctx, what, "", attempt)
}

// runFrom is run whose first attempt goes to first ("": where calls start,
// c.start()): a read at a MinLSN that a replica may answer.
func (c *Client) runFrom(ctx context.Context, what, first string, attempt func(ctx context.Context, addr string) step) error {
	if c.life.Err() != nil {
		return fmt.Errorf("%w: %s not sent", ErrClosed, what)
	}
	// call ends with the caller's context or Close and cuts an attempt in
	// flight; budget (RetryTimeout) only stops new attempts and waits, so
	// the attempt in flight when it ends still gets its answer (invariant
	// 3): a call every node answered NotLeader ends ErrUnavailable, not
	// ErrOutcomeUnknown by the luck of where the deadline fell.
	call, cancelCall := context.WithCancelCause(ctx)
	defer cancelCall(nil)
	stop := context.AfterFunc(c.life, func() { cancelCall(ErrClosed) })
	defer stop()
	budget, cancelBudget := context.WithTimeoutCause(call, c.opts.RetryTimeout, errBudget)
	defer cancelBudget()

	addr := first
	if addr == "" {
		addr = c.start()
	}
	sent := false
	hops, waits := 0, 0
	counted := 0 // attempts against Options.Attempts (invariant 5)
	for n := 1; ; n++ {
		if budget.Err() != nil {
			return c.ended(ctx, budget, what, n-1, sent, nil)
		}
		actx, cancel := context.WithTimeout(call, c.opts.AttemptTimeout)
		s := attempt(actx, addr)
		cancel()
		sent = sent || s.sent
		if s.v == vDone {
			if s.err == nil && !s.replica {
				c.heard(addr, s.epoch)
			} else if errors.Is(s.err, ErrClosed) {
				return c.ended(ctx, budget, what, n, sent, s.err)
			}
			return s.err
		}
		// Looking for the leader — a NotLeader, a node the request did not
		// reach — does not count (invariant 5): during a failover every
		// member answers at once (naming the dead leader until its lease
		// ends, or nobody while they elect), which would spend Attempts in
		// a second or two of a failover that takes a lease TTL.
		if !s.redirect && (s.sent || s.v != vMove) {
			counted++
		}
		if budget.Err() != nil || counted >= c.opts.Attempts {
			return c.ended(ctx, budget, what, n, sent, s.err)
		}
		next, wait := addr, s.v == vWait
		if s.v == vMove {
			var known int
			next, known = c.after(addr)
			switch {
			case s.redirect:
				if c.redirected(addr, s.addr, s.epoch) {
					next = s.addr
				} else if s.addr != "" {
					c.opts.Logger.Debug("client: stale redirect not followed", "call", what, "addr", addr, "leader", s.addr, "epoch", s.epoch)
				}
			case s.addr != "": // the same node again (a renewed session)
				next = s.addr
			}
			// Back off before returning to an address tried since the last
			// wait: every node said no, so the cluster needs time. A first
			// replica outside the known addresses is no such hop.
			if n > 1 || first == "" {
				hops++
			}
			wait = hops >= known
		}
		c.opts.Logger.Debug("client: attempt failed, retrying", "call", what, "attempt", n, "addr", addr, "next", next, "backoff", wait, "err", s.err)
		if wait {
			hops = 0
			if c.wait(budget, waits) != nil {
				return c.ended(ctx, budget, what, n, sent, s.err)
			}
			waits++
		}
		addr = next
	}
}

// ended is the error of a call whose budget ended after n attempts:
// ErrOutcomeUnknown if one may have run, else ErrClosed, the caller's
// context error, or ErrUnavailable.
func (c *Client) ended(caller, call context.Context, what string, n int, sent bool, last error) error {
	var why error
	switch {
	case context.Cause(call) == ErrClosed || errors.Is(last, ErrClosed):
		why = ErrClosed
	case caller.Err() != nil:
		why = context.Cause(caller)
	case call.Err() != nil:
		why = fmt.Errorf("%w (RetryTimeout %v)", errBudget, c.opts.RetryTimeout)
	default:
		why = fmt.Errorf("%w (Options.Attempts %d)", errBudget, c.opts.Attempts)
	}
	if last == nil {
		last = errors.New("none")
	}
	switch {
	case sent:
		return fmt.Errorf("%w: %s: %w after %d attempts; last: %w", ErrOutcomeUnknown, what, why, n, last)
	case errors.Is(why, errBudget):
		return fmt.Errorf("%w: %s: %w after %d attempts; last: %w", ErrUnavailable, what, why, n, last)
	}
	return fmt.Errorf("client: %s: %w after %d attempts (the request did not run); last: %w", what, why, n, last)
}

// replyStep handles the reply codes every method shares; sent says
// whether an Unavailable or InFlight means the request may have run;
// epoch is the reply's.
func replyStep(addr string, code clientv1.Code, leader string, epoch uint64, msg string, sent bool) step {
	switch code {
	case clientv1.Code_NOT_LEADER:
		if leader == addr {
			leader = ""
		}
		return step{v: vMove, addr: leader, epoch: epoch, redirect: true, err: fmt.Errorf("%s does not lead (leader %q, epoch %d): %s", addr, leader, epoch, msg)}
	case clientv1.Code_UNAVAILABLE:
		return step{v: vMove, sent: sent, err: fmt.Errorf("%s is unavailable: %s", addr, msg)}
	case clientv1.Code_IN_FLIGHT:
		return step{v: vWait, sent: sent, err: fmt.Errorf("%s: another attempt is in flight: %s", addr, msg)}
	case clientv1.Code_REFUSED:
		return step{v: vDone, err: fmt.Errorf("%w: %s: %s", ErrRefused, addr, msg)}
	}
	// A code this client does not know is a refusal (client.proto, Code).
	return step{v: vDone, err: fmt.Errorf("%w: %s answered %v: %s", ErrRefused, addr, code, msg)}
}

// rpcStep handles a failed RPC: what gRPC says no retry will fix is a
// refusal; anything else moves to the next address.
func rpcStep(addr string, err error, sent bool) step {
	switch status.Code(err) {
	case codes.InvalidArgument, codes.ResourceExhausted, codes.FailedPrecondition:
		return step{v: vDone, err: fmt.Errorf("%w: %s: %w", ErrRefused, addr, err)}
	case codes.PermissionDenied, codes.Unauthenticated:
		return step{v: vDone, err: fmt.Errorf("%w: %s: %w", ErrDenied, addr, err)}
	case codes.Unimplemented:
		// The node does not serve the client service: nothing ran there.
		return step{v: vMove, err: fmt.Errorf("%s: %w", addr, err)}
	}
	return step{v: vMove, sent: sent, err: fmt.Errorf("%s: %w", addr, err)}
}

// connStep: no connection to addr could be made (a redirect to an
// address gRPC cannot parse), or the Client is closed.
func connStep(addr string, err error) step {
	if errors.Is(err, ErrClosed) {
		return step{v: vDone, err: err}
	}
	return step{v: vMove, err: fmt.Errorf("%s: %w", addr, err)}
}
