package replication

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/oncewal/oncewal/wal"
)

// Transport errors.
var (
	// ErrDisconnected: the link dropped (peer closed, network fault, injected
	// disconnect). The connection is dead; the caller reconnects.
	ErrDisconnected = errors.New("replication: disconnected")
	// ErrClosed: this connection, listener or transport was closed locally.
	ErrClosed = errors.New("replication: closed")
	// ErrBadHello: a handshake whose shard is not the one the leader serves.
	ErrBadHello = errors.New("replication: bad hello")
	// ErrFenced: the follower has committed a leader epoch higher than this
	// leader's; this leader was deposed and must stop shipping.
	ErrFenced = errors.New("replication: leader fenced by a higher epoch")
	// ErrBadFollowerID: a follower ID that is not 1..MaxFollowerIDLen bytes
	// of [A-Za-z0-9._-] (see ValidFollowerID).
	ErrBadFollowerID = errors.New("replication: bad follower ID")
	// ErrRefused: the leader refused the connection and said why. The
	// error a follower's Dial or Recv returns wraps ErrRefused,
	// ErrDisconnected (the connection is over) and, when the transport
	// carried it, the reason's sentinel: ErrWrongShard, ErrFenced,
	// ErrStaleEpoch, ErrDiverged, ErrBehindRetention, ErrUnknownFollower,
	// ErrIdentityMismatch, ErrDuplicateFollower, ErrBadFollowerID or
	// ErrBadHello.
	ErrRefused = errors.New("replication: refused by the leader")
	// ErrDuplicateFollower: another live connection already serves this
	// follower ID (two processes were started with the same ID), or this
	// connection was replaced by a newer one of the same ID. See the
	// package documentation, "One process per follower ID".
	ErrDuplicateFollower = errors.New("replication: duplicate follower ID")
	// ErrLeaderSilent: the leader sent nothing — no batch, no heartbeat —
	// for longer than the follower's bound (follower.Options.LeaderTimeout)
	// on a connection whose leader promised heartbeats: it is stopped,
	// hung or cut off. The follower drops the connection and redials.
	ErrLeaderSilent = errors.New("replication: the leader sent nothing")
	// ErrAuthFailed: the transport could not authenticate the peer, or the
	// peer refused this side's credentials (a certificate from another CA,
	// an expired one, a name mismatch). Wrapped with ErrDisconnected and the
	// TLS or x509 error (errors.As works on them).
	ErrAuthFailed = errors.New("replication: authentication failed")
)

// EndConn ends c with reason when its transport can carry one to the
// follower (RefusingConn), else closes it.
func EndConn(c LeaderConn, reason error) {
	if rc, ok := c.(RefusingConn); ok {
		_ = rc.Refuse(reason)
		return
	}
	_ = c.Close()
}

// MaxShards bounds a deployment's shard count: shards are numbered
// 0..MaxShards-1 in every hello and batch. Jump hash (package leader's
// router) works for up to 2^31 buckets; the bound is kept far lower because
// every shard costs a WAL, a shipper and a follower store.
const MaxShards = 1 << 16

// MaxFollowerIDLen bounds a follower ID, so that it fits a fixed-size hello.
const MaxFollowerIDLen = 64

// ValidFollowerID reports whether id can name a follower: "" (anonymous) or
// 1..MaxFollowerIDLen bytes of [A-Za-z0-9._-]. The alphabet keeps IDs safe in
// file names, metric labels and log lines without quoting. The error wraps
// ErrBadFollowerID.
func ValidFollowerID(id string) error {
	if len(id) > MaxFollowerIDLen {
		return fmt.Errorf("%w: %d bytes > %d; choose an ID of 1-%d bytes of [A-Za-z0-9._-]", ErrBadFollowerID, len(id), MaxFollowerIDLen, MaxFollowerIDLen)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("%w: %q: byte %#x at %d is not in [A-Za-z0-9._-]; choose an ID of 1-%d bytes of [A-Za-z0-9._-]", ErrBadFollowerID, id, c, i, MaxFollowerIDLen)
		}
	}
	return nil
}

// Ack is the follower's message to the leader: the hello on (re)connect and
// the answer to each batch.
type Ack struct {
	Shard uint32 // the follower's shard
	// Epoch is the highest leader epoch the follower has committed. A leader
	// whose own epoch is lower has been deposed (ErrFenced).
	Epoch uint64
	// AppliedLSN is the follower's applied position: every event with an LSN
	// at or below it is applied (durable unless the follower runs NoSync). 0
	// means nothing applied yet; a log's first LSN is 1.
	AppliedLSN uint64
	// Refused reports that the batch was not applied (it starts beyond
	// AppliedLSN+1, has a SeqNo gap, comes from a stale epoch, …): resend from
	// AppliedLSN+1. Always false in a hello.
	Refused bool

	// The fields below are sent in the hello only; they are zero in acks.

	// FollowerID is the follower's stable name (ValidFollowerID); "" is an
	// anonymous follower, which only a Shipper serves. A Fanout routes each
	// connection to that follower's own stream by it.
	FollowerID string
	// LastBatch identifies the batch that ends at AppliedLSN in the
	// follower's history (zero: unknown, e.g. a store written before this
	// field existed, or nothing applied). The leader compares it with its own
	// log (CheckHello), as Raft compares prevLogIndex/prevLogTerm.
	LastBatch wal.BatchRef
}

// Listener is the leader side of a Transport: it accepts follower connections.
type Listener interface {
	// Accept waits for a follower to connect and returns the connection with
	// the follower's hello. It returns ErrClosed (wrapped) once the listener
	// or its transport is closed, and ctx.Err() when ctx ends first.
	Accept(ctx context.Context) (LeaderConn, Ack, error)
}

// LeaderConn is the leader's end of one connection to a follower.
type LeaderConn interface {
	// Send ships one encoded WAL batch. nil means the transport took the
	// batch, not that it arrived. Send does not retain batch.
	Send(ctx context.Context, batch []byte) error
	// Recv waits for the follower's next ack.
	Recv(ctx context.Context) (Ack, error)
	// Close ends the connection; the follower sees ErrDisconnected.
	// Idempotent; always returns nil for the in-process transport.
	Close() error
}

// RefusingConn is implemented by a LeaderConn whose transport can tell the
// follower why its connection was refused. A Fanout refuses a hello it will
// not serve (ErrUnknownFollower, ErrDiverged, ErrBehindRetention, …) with
// Refuse instead of Close, so the follower can log the reason instead of
// only seeing the stream end.
type RefusingConn interface {
	LeaderConn
	// Refuse ends the connection like Close, carrying reason to the
	// follower. Idempotent with Close: the first of them decides.
	Refuse(reason error) error
}

// Heartbeat is the leader's sign of life on a stream, sent every heartbeat
// interval whether or not batches flow, so a follower can tell an idle
// leader from a stopped one (see "Heartbeats" in the package
// documentation).
type Heartbeat struct {
	// LastLSN is the end of the leader's log as its stream knows it.
	LastLSN uint64
	// WALTime is the leader's WAL clock (unix ns) of the newest event it
	// logged; 0: unknown.
	WALTime int64
}

// HeartbeatConn is implemented by a LeaderConn whose transport carries
// heartbeats. The Fanout sends one every HeartbeatInterval on each
// connection in service.
type HeartbeatConn interface {
	// HeartbeatInterval is how often to send one; 0 means this follower
	// did not ask for heartbeats (an older follower, which would take the
	// frame for a bad batch): send none.
	HeartbeatInterval() time.Duration
	// SendHeartbeat queues hb without blocking; when the connection's send
	// buffer is full (batches waiting) it drops it, as those batches are
	// a sign of life themselves.
	SendHeartbeat(hb Heartbeat) error
}

// PeerConn is implemented by a LeaderConn whose transport knows its peer:
// the Fanout uses it to tell a live connection from a dead one when a
// second connection claims the same follower ID, and names both addresses
// in its log.
type PeerConn interface {
	// RemoteAddr is the follower's network address.
	RemoteAddr() string
	// LastHeard is when the follower last sent anything on the
	// connection: its hello, an ack, an answer to a heartbeat.
	LastHeard() time.Time
}

// LivenessConn is implemented by a FollowerConn whose transport carries
// the leader's heartbeats.
type LivenessConn interface {
	// HeartbeatInterval is the interval the leader promised when it
	// accepted the connection; 0: it sends none (an older leader), and
	// silence proves nothing.
	HeartbeatInterval() time.Duration
	// LastHeard is when the leader last sent anything (a batch or a
	// heartbeat), and its last heartbeat (zero before the first).
	LastHeard() (time.Time, Heartbeat)
}

// Dialer is the follower side of a Transport: it connects to the leader.
type Dialer interface {
	// Dial connects to the leader and delivers hello as the handshake. It
	// returns once the leader has accepted the connection, or with ctx.Err()
	// or ErrClosed (wrapped). A network Dialer may also return a dial error;
	// the caller retries with backoff.
	Dial(ctx context.Context, hello Ack) (FollowerConn, error)
}

// FollowerConn is the follower's end of one connection to the leader.
type FollowerConn interface {
	// Recv waits for the next batch. The returned slice is the caller's.
	Recv(ctx context.Context) ([]byte, error)
	// Send sends one ack. nil means the transport took it, not that it arrived.
	Send(ctx context.Context, ack Ack) error
	// Close ends the connection; the leader sees ErrDisconnected.
	// Idempotent.
	Close() error
}
