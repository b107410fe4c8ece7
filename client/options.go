package client

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"google.golang.org/grpc/backoff"

	"github.com/oncewal/oncewal/internal/badopts"
	clientv1 "github.com/oncewal/oncewal/proto/oncewal/client/v1"
)

// ErrBadOptions: Options are unusable (see Validate); nothing was dialled.
var ErrBadOptions = errors.New("client: bad options")

// Ack is the ack policy a Submit waits for before the node answers. The
// zero value means the default, AckMajority.
type Ack uint8

// Ack policies. They are one above the wire's numbers (clientv1.Ack) so that the zero
// value can mean "the default".
const (
	// AckLeader: durable in the leader's WAL. A leader lost before its
	// followers received the request takes the answer with it: a follower
	// promoted in its place runs a retry again.
	AckLeader Ack = 1 + Ack(clientv1.Ack_ACK_LEADER)
	// AckOne: durable on the leader and one follower.
	AckOne Ack = 1 + Ack(clientv1.Ack_ACK_ONE)
	// AckMajority: durable on a majority of the replicas, the leader
	// counted (leader.AckMajority): the leader and one of two followers,
	// two of three.
	AckMajority Ack = 1 + Ack(clientv1.Ack_ACK_MAJORITY)
	// AckAll: durable on the leader and every follower; one slow follower
	// slows every request.
	AckAll Ack = 1 + Ack(clientv1.Ack_ACK_ALL)
)

func (a Ack) wire() clientv1.Ack { return clientv1.Ack(a) - 1 }

func (a Ack) String() string {
	switch a {
	case AckLeader:
		return "leader"
	case AckOne:
		return "one"
	case AckMajority:
		return "majority"
	case AckAll:
		return "all"
	}
	return fmt.Sprintf("Ack(%d)", uint8(a))
}

// Defaults of Options.
const (
	// DefaultAck is majority: an answer acknowledged by a majority is on
	// every set of nodes a promotion can be made from (the most advanced
	// of a majority is promoted), so a retry after a failover replays it
	// instead of running it again, while one slow or lost follower does
	// not stall requests as AckAll would.
	DefaultAck            = AckMajority
	DefaultAttempts       = 20
	DefaultRetryTimeout   = 30 * time.Second
	DefaultAttemptTimeout = 10 * time.Second
)

// DefaultBackoff is the wait between attempts: shorter than gRPC's
// backoff.DefaultConfig (1 s growing to 120 s, made for reconnecting a
// channel), because a client waiting out a failover wants to find the new
// leader within its RetryTimeout.
var DefaultBackoff = backoff.Config{
	BaseDelay:  50 * time.Millisecond,
	Multiplier: 1.6,
	Jitter:     0.2,
	MaxDelay:   2 * time.Second,
}

// Options configures a Client. Exactly one of TLS and Insecure must be set.
type Options struct {
	// Addrs are the nodes to reach (host:port, the nodes' gRPC port), one or
	// several: any node leads the client to the leader. Required.
	Addrs []string
	// TLS is the client's mutual-TLS configuration
	// (grpctransport.ClientTLSConfig or LoadClientTLS): RootCAs to verify
	// the nodes, and a client certificate whose URI SAN
	// oncewal://client/NAME names the principal the node scopes request IDs
	// by. MinVersion is raised to TLS 1.3.
	TLS *tls.Config
	// Insecure dials plaintext. Only for tests and loopback experiments:
	// anyone on the path reads the requests, and the principal is whatever
	// Principal says.
	Insecure bool
	// Principal names the caller when Insecure (sent in the gRPC metadata
	// oncewal-principal); required then, and refused with TLS, where the
	// certificate names the caller.
	Principal string
	// Ack is the ack policy of Submits that do not give their own
	// (WithAck). Default DefaultAck (AckMajority).
	Ack Ack
	// Attempts bounds the attempts of one call that reach a node able to
	// take the request (each one request to one node, after an
	// OpenSession if the session needs one). Looking for the leader — an
	// attempt answered NotLeader, or one that did not reach its node — does
	// not count: RetryTimeout bounds a failover. Default DefaultAttempts
	// (20).
	Attempts int
	// RetryTimeout bounds the retrying of one call, attempts and backoff
	// together: no attempt starts after it. The attempt in flight when it
	// ends may finish, within its AttemptTimeout, so that the call ends
	// with that attempt's answer instead of an unknown outcome. The
	// caller's context bounds the call strictly. Default
	// DefaultRetryTimeout (30s).
	RetryTimeout time.Duration
	// AttemptTimeout bounds one attempt, connecting and the node's ack wait
	// included. Default DefaultAttemptTimeout (10s).
	AttemptTimeout time.Duration
	// Backoff paces attempts (see invariant 5) and the gRPC connections'
	// redials. A zero Backoff means DefaultBackoff; a set one is used as
	// is (Jitter 0: no jitter).
	Backoff backoff.Config
	// Logger receives a line per retried attempt (Debug) and per renewed
	// session (Info). Default slog.Default().
	Logger *slog.Logger

	// now reads the clock that paces session renewal (invariant 6); tests
	// set it. Default time.Now.
	now func() time.Time
}

// EnsureDefaults fills unset fields with their defaults and returns o.
func (o *Options) EnsureDefaults() *Options {
	if o.Ack == 0 {
		o.Ack = DefaultAck
	}
	if o.Attempts == 0 {
		o.Attempts = DefaultAttempts
	}
	if o.RetryTimeout == 0 {
		o.RetryTimeout = DefaultRetryTimeout
	}
	if o.AttemptTimeout == 0 {
		o.AttemptTimeout = DefaultAttemptTimeout
	}
	if o.Backoff == (backoff.Config{}) {
		o.Backoff = DefaultBackoff
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.now == nil {
		o.now = time.Now
	}
	return o
}

// Validate reports every invalid field in one error wrapping ErrBadOptions
// (zero fields are valid: they mean the default).
func (o *Options) Validate() error {
	var errs []error
	if len(o.Addrs) == 0 {
		errs = append(errs, errors.New("Addrs is empty: name at least one node (host:port)"))
	}
	for _, a := range o.Addrs {
		if _, _, err := net.SplitHostPort(a); err != nil {
			errs = append(errs, fmt.Errorf("address %q is not host:port: %w", a, err))
		}
	}
	errs = append(errs, o.checkTransport()...)
	if o.Ack > AckAll {
		errs = append(errs, fmt.Errorf("Ack %d is not one of AckLeader, AckOne, AckMajority, AckAll", o.Ack))
	}
	for _, f := range []struct {
		name string
		v    int64
	}{{"Attempts", int64(o.Attempts)}, {"RetryTimeout", int64(o.RetryTimeout)}, {"AttemptTimeout", int64(o.AttemptTimeout)}} {
		if f.v < 0 {
			errs = append(errs, fmt.Errorf("%s %d is negative", f.name, f.v))
		}
	}
	if b := o.Backoff; b != (backoff.Config{}) {
		if b.BaseDelay <= 0 {
			errs = append(errs, fmt.Errorf("Backoff.BaseDelay %v is not positive", b.BaseDelay))
		}
		if b.MaxDelay < b.BaseDelay {
			errs = append(errs, fmt.Errorf("Backoff.MaxDelay %v is below BaseDelay %v", b.MaxDelay, b.BaseDelay))
		}
		if !(b.Multiplier >= 1) { // NaN too
			errs = append(errs, fmt.Errorf("Backoff.Multiplier %v is below 1", b.Multiplier))
		}
		if !(b.Jitter >= 0 && b.Jitter <= 1) {
			errs = append(errs, fmt.Errorf("Backoff.Jitter %v is outside [0, 1]", b.Jitter))
		}
	}
	return badopts.Wrap(ErrBadOptions, "Options", errs)
}

// checkTransport enforces what the node's client service requires: mutual
// TLS that verifies the node, or plaintext with a principal for tests.
func (o *Options) checkTransport() []error {
	switch {
	case o.TLS != nil && o.Insecure:
		return []error{errors.New("both TLS and Insecure set: choose one")}
	case o.Insecure:
		if o.Principal == "" {
			return []error{errors.New("Insecure without Principal: name the caller (the node scopes request IDs by it)")}
		}
		return nil
	case o.TLS == nil:
		return []error{errors.New("TLS is required (set Insecure only for tests on loopback)")}
	}
	var errs []error
	if o.Principal != "" {
		errs = append(errs, fmt.Errorf("Principal %q with TLS: the certificate names the caller; leave Principal empty", o.Principal))
	}
	if o.TLS.InsecureSkipVerify {
		errs = append(errs, errors.New("TLS.InsecureSkipVerify is not allowed (the node must be verified)"))
	}
	if o.TLS.RootCAs == nil {
		errs = append(errs, errors.New("TLS.RootCAs is required (the CA the nodes' certificates must chain to)"))
	}
	if len(o.TLS.Certificates) == 0 && o.TLS.GetClientCertificate == nil {
		errs = append(errs, errors.New("TLS has no client certificate (the node requires one naming oncewal://client/NAME)"))
	}
	return errs
}
