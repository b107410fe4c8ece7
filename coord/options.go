package coord

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/oncewal/oncewal/internal/badopts"
)

// ErrBadOptions is what EtcdOptions.Validate wraps, with every problem.
var ErrBadOptions = errors.New("coord: bad options")

// Defaults of EtcdOptions.
const (
	// DefaultLeaseTTL is 10 s, a third of Patroni's 30 s: the client renews
	// the lease every TTL/3, so a leader survives two lost renewals (an etcd
	// leader change, a GC pause), while a dead leader's successor wins
	// about one TTL after its death — the failover time this default buys
	// (issue 27 aims for under TTL + 2 s). Patroni spends its 30 s on a
	// 10 s loop and 10 s of retries that oncewal's event-driven keep-alive
	// does not need.
	DefaultLeaseTTL = 10 * time.Second
	// DefaultDialTimeout bounds reaching etcd when the coordinator opens.
	DefaultDialTimeout = 5 * time.Second
	// DefaultPrefix is where oncewal's keys live in a shared etcd.
	DefaultPrefix = "/oncewal"
)

// EtcdOptions configures NewEtcd.
type EtcdOptions struct {
	// Endpoints are etcd's client URLs (required).
	Endpoints []string
	// Prefix is the root of oncewal's keys; default DefaultPrefix.
	Prefix string
	// LeaseTTL is the election session's lease, in whole seconds (etcd's
	// unit), at least 2 s; default DefaultLeaseTTL. etcd may keep a lease
	// longer (an etcd leader change re-extends every lease), never shorter.
	LeaseTTL time.Duration
	// DialTimeout bounds the first connection; default DefaultDialTimeout.
	DialTimeout time.Duration
	// TLS, if set, is the client's TLS configuration; nil speaks plaintext.
	TLS *tls.Config
	// Logger gets the coordinator's lines; default slog.Default().
	Logger *slog.Logger
}

// EnsureDefaults fills the zero fields with their defaults, and returns o.
func (o *EtcdOptions) EnsureDefaults() *EtcdOptions {
	if o.Prefix == "" {
		o.Prefix = DefaultPrefix
	}
	if o.LeaseTTL == 0 {
		o.LeaseTTL = DefaultLeaseTTL
	}
	if o.DialTimeout == 0 {
		o.DialTimeout = DefaultDialTimeout
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// Validate reports every problem of o, joined and wrapping ErrBadOptions.
func (o *EtcdOptions) Validate() error {
	var problems []error
	if len(o.Endpoints) == 0 {
		problems = append(problems, errors.New("no Endpoints: give etcd's client URLs"))
	}
	for i, ep := range o.Endpoints {
		if ep == "" {
			problems = append(problems, fmt.Errorf("Endpoints[%d] is empty: give an etcd client URL", i))
		}
	}
	if o.Prefix == "" || o.Prefix[0] != '/' {
		problems = append(problems, fmt.Errorf("Prefix %q: give an absolute key prefix such as %q", o.Prefix, DefaultPrefix))
	}
	if o.LeaseTTL < 2*time.Second || o.LeaseTTL%time.Second != 0 {
		problems = append(problems, fmt.Errorf("LeaseTTL %v: give whole seconds, at least 2s (etcd grants leases in seconds)", o.LeaseTTL))
	}
	if o.DialTimeout <= 0 {
		problems = append(problems, fmt.Errorf("DialTimeout %v: give a positive duration", o.DialTimeout))
	}
	return badopts.Wrap(ErrBadOptions, "EtcdOptions", problems)
}
