package clientapi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/oncewal/oncewal/internal/badopts"
	clientv1 "github.com/oncewal/oncewal/proto/oncewal/client/v1"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/wal"
	"google.golang.org/protobuf/proto"
)

// ErrBadOptions: New was given no leader or unusable options.
var ErrBadOptions = errors.New("clientapi: bad options")

// PrincipalMetadata is the gRPC metadata key an insecure server
// (Options.Insecure: loopback tests only) takes a caller's name from.
const PrincipalMetadata = "oncewal-principal"

// Request is what a handler is asked to run: the caller's authenticated
// name (its ledger scope), the session the request logs in, its request ID
// and action, and its payload as the client sent it.
type Request struct {
	Principal string
	Session   session.ID
	RequestID string
	Action    string
	Payload   []byte
}

// Handler maps a fresh request to the events to log and the outcome to
// record, without side effects of its own: the events and the outcome are
// logged in one batch (leader.Shard.Commit), and a retry replays the
// outcome. Events get their SeqNo, idempotency key and time from the
// leader (leave them zero) and must be of sessions of the request's shard
// (the request's own session always is). An error refuses the request
// (Refused, with the error's text) and releases its claim: a retry runs
// the handler again. It runs while the request's claim is held, which the
// service extends every Options.Heartbeat meanwhile (a logged record), so a
// slow handler keeps its request ID; with the heartbeat off, a handler
// that outlives the ledger's lease (default 1 minute) loses the claim and
// its commit is refused.
type Handler func(ctx context.Context, r Request) (events []wal.Event, outcome []byte, err error)

// DefaultHandler runs the default payload (a clientv1.Ops message): one
// event per op, in order, in the request's session, whose state keeps the
// keys (per session: the principal's shared keys are Txn's); the outcome
// is empty.
// A payload that does not decode, or holds an op that is not a put with a
// key, an add with a key and no value, or a delete with a key alone, or
// more than clientv1.MaxOps ops, is refused.
func DefaultHandler(_ context.Context, r Request) ([]wal.Event, []byte, error) {
	ops, err := DecodeOps(r.Payload)
	if err != nil {
		return nil, nil, err
	}
	events := make([]wal.Event, len(ops.GetOps()))
	for i, op := range ops.GetOps() {
		events[i] = wal.Event{Op: defaultOps[op.GetKind()], Session: r.Session, Key: op.GetKey(), Value: op.GetValue(), Delta: op.GetDelta()}
	}
	return events, nil, nil
}

// defaultOps maps the default payload's op kinds to the session ops of
// package wal.
var defaultOps = map[clientv1.Op_Kind]wal.Op{clientv1.Op_PUT: wal.OpPut, clientv1.Op_ADD: wal.OpAdd, clientv1.Op_DELETE: wal.OpDelete}

// ErrBadPayload: a Submit's payload is not the default payload a node
// without a handler of its own runs.
var ErrBadPayload = errors.New("clientapi: the payload is not the default payload of put/add/delete ops")

// DecodeOps decodes and checks a default payload; an error wraps
// ErrBadPayload and says which op is wrong.
func DecodeOps(payload []byte) (*clientv1.Ops, error) {
	var ops clientv1.Ops
	if err := proto.Unmarshal(payload, &ops); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadPayload, err)
	}
	if n := len(ops.GetOps()); n == 0 || n > clientv1.MaxOps {
		return nil, fmt.Errorf("%w: %d ops, want 1 to %d", ErrBadPayload, n, clientv1.MaxOps)
	}
	for i, op := range ops.GetOps() {
		var bad string
		switch k := op.GetKind(); {
		case len(op.GetKey()) == 0:
			bad = "an empty key"
		case defaultOps[k] == 0:
			bad = fmt.Sprintf("the unknown kind %v", k)
		case k != clientv1.Op_PUT && len(op.GetValue()) != 0:
			bad = fmt.Sprintf("a value on a %v", k)
		case k != clientv1.Op_ADD && op.GetDelta() != 0:
			bad = fmt.Sprintf("a delta on a %v", k)
		}
		if bad != "" {
			return nil, fmt.Errorf("%w: op %d has %s", ErrBadPayload, i, bad)
		}
	}
	return &ops, nil
}

// DefaultReadWait is Options.ReadWait's default: long enough for a
// follower a few batches behind, short enough that a client tries another
// replica well within its budget.
const DefaultReadWait = time.Second

// Options configures a Service.
type Options struct {
	// Handler maps a request to its events and outcome. Default
	// DefaultHandler.
	Handler Handler
	// Insecure takes a caller's name from the gRPC metadata
	// oncewal-principal when it has no certificate: for a plaintext server
	// in tests on loopback only — anyone who reaches the port can then
	// claim any name. Default false: a caller needs a client certificate.
	Insecure bool
	// Heartbeat is how often the claim of a request whose handler is still
	// running is extended (idempotency.Ledger.Extend: a logged record), so
	// that a handler slower than the ledger's lease keeps its request ID
	// and its commit is not refused. Default: a third of the ledger's
	// lease. Negative: never (a handler then has one lease).
	Heartbeat time.Duration
	// MinAck is the weakest ack policy the service answers under: a Submit
	// asking for less waits for MinAck before it answers OK or Replay
	// (invariant 2), and says so in the reply's Message. A node whose
	// fencing after an election counts on every acknowledged write having
	// met the cluster's policy sets it to that policy: a client asking for
	// less must not make a write the fencing cannot see. Default
	// clientv1.Ack_ACK_LEADER (0): each request's own policy.
	MinAck clientv1.Ack
	// Leading reports whether this node may still answer as the leader:
	// nil while it surely leads, else why its leadership may have ended (a
	// lease whose deadline has passed). It is consulted before a request
	// is claimed and again after the ack wait, the last thing before OK,
	// Replay, a Status or a new session is answered (invariants 2 and 7);
	// it is called from every request's goroutine, so it must be safe for
	// concurrent use, cheap, and must not block. Default nil: the node always
	// leads (a leader of fixed role).
	Leading func() error
	// ReadWait bounds how long a Get or Range whose MinLSN this node has
	// not applied yet waits for it before answering BEHIND. Default
	// DefaultReadWait.
	ReadWait time.Duration
	// Logger receives a line per request that could not be served
	// (Unavailable, its answer withheld by Leading included) and per
	// handler panic. Default slog.Default().
	Logger *slog.Logger
}

// EnsureDefaults fills unset fields with their documented defaults and
// returns o.
func (o *Options) EnsureDefaults() *Options {
	if o.Handler == nil {
		o.Handler = DefaultHandler
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.ReadWait == 0 {
		o.ReadWait = DefaultReadWait
	}
	return o
}

// Validate reports every invalid field wrapping ErrBadOptions: a nil
// Options, a MinAck that is no ack policy, a negative ReadWait (every
// other field has a usable zero value).
func (o *Options) Validate() error {
	if o == nil {
		return fmt.Errorf("%w: nil Options", ErrBadOptions)
	}
	var errs []error
	if !validAck(o.MinAck) {
		errs = append(errs, fmt.Errorf("MinAck %d is not an ack policy: use 0 (leader), 1 (one), 2 (majority) or 3 (all)", o.MinAck))
	}
	if o.ReadWait < 0 {
		errs = append(errs, fmt.Errorf("ReadWait %v is negative", o.ReadWait))
	}
	return badopts.Wrap(ErrBadOptions, "Options", errs)
}
