package node

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"

	"github.com/oncewal/oncewal/clientapi"
	"github.com/oncewal/oncewal/internal/badopts"
	"github.com/oncewal/oncewal/leader"
	clientv1 "github.com/oncewal/oncewal/proto/oncewal/client/v1"
	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/replication/grpctransport"
	"github.com/oncewal/oncewal/snapshot"
)

// GRPCOptions configures NewGRPC.
type GRPCOptions struct {
	// Listen is the address the node serves at (required): replication,
	// snapshots and the client service while it leads, the client service
	// (clientapi.Replica: reads at a MinLSN, NotLeader for the rest) while
	// it follows.
	Listen string
	// ServerTLS is the server's mutual TLS (grpctransport.LoadServerTLS);
	// DialTLS the TLS a follower dials the leader with
	// (grpctransport.LoadClientTLS), its certificate naming this node.
	// Exactly one of both set and Insecure.
	ServerTLS, DialTLS *tls.Config
	// Insecure speaks plaintext, and takes client names from metadata:
	// loopback tests only.
	Insecure bool
	// Client is the template of the client service (Handler, Heartbeat,
	// ReadWait — also a follower's, for reads at a MinLSN); MinAck,
	// Leading and Insecure are the node's.
	Client clientapi.Options
	// Logger gets the transport's lines. Default slog.Default().
	Logger *slog.Logger
}

// EnsureDefaults fills the zero fields with their defaults, and returns o.
func (o *GRPCOptions) EnsureDefaults() *GRPCOptions {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// Validate reports every problem of o, joined and wrapping ErrBadOptions.
func (o *GRPCOptions) Validate() error {
	var problems []error
	if o.Listen == "" {
		problems = append(problems, errors.New("no Listen: give the address to serve at"))
	}
	tlsSet := o.ServerTLS != nil && o.DialTLS != nil
	if tlsSet == o.Insecure || (!tlsSet && (o.ServerTLS != nil || o.DialTLS != nil)) {
		problems = append(problems, errors.New("give both ServerTLS and DialTLS, or Insecure (loopback tests only)"))
	}
	return badopts.Wrap(ErrBadOptions, "GRPCOptions", problems)
}

// GRPC is the network Transport (package grpctransport): one port for
// replication, snapshots and clients, with mutual TLS.
type GRPC struct {
	o       GRPCOptions
	mu      sync.Mutex
	dialers map[string]*grpctransport.Dialer
	snaps   map[string]*grpctransport.SnapshotClient
}

// NewGRPC returns the network transport of a node.
func NewGRPC(opts *GRPCOptions) (*GRPC, error) {
	o := *opts
	o.EnsureDefaults()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	return &GRPC{o: o, dialers: map[string]*grpctransport.Dialer{}, snaps: map[string]*grpctransport.SnapshotClient{}}, nil
}

// Close releases the snapshot clients.
func (g *GRPC) Close() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	for a, c := range g.snaps {
		_ = c.Close()
		delete(g.snaps, a)
	}
	return nil
}

func (g *GRPC) dialerOptions() *grpctransport.DialerOptions {
	return &grpctransport.DialerOptions{TLS: g.o.DialTLS, Insecure: g.o.Insecure, Logger: g.o.Logger}
}

// Dialer implements Transport.
func (g *GRPC) Dialer(addr string) replication.Dialer {
	g.mu.Lock()
	defer g.mu.Unlock()
	if d := g.dialers[addr]; d != nil {
		return d
	}
	d, err := grpctransport.NewDialer(addr, g.dialerOptions())
	if err != nil {
		return failedDialer{err}
	}
	g.dialers[addr] = d
	return d
}

type failedDialer struct{ err error }

func (d failedDialer) Dial(context.Context, replication.Ack) (replication.FollowerConn, error) {
	return nil, d.err
}

// Snapshots implements Transport.
func (g *GRPC) Snapshots(addr string) snapshot.Source {
	g.mu.Lock()
	defer g.mu.Unlock()
	if c := g.snaps[addr]; c != nil {
		return c
	}
	c, err := grpctransport.NewSnapshotClient(addr, g.dialerOptions())
	if err != nil {
		return failedSource{err}
	}
	g.snaps[addr] = c
	return c
}

type failedSource struct{ err error }

func (s failedSource) Begin(context.Context, uint32) (snapshot.Manifest, error) {
	return snapshot.Manifest{}, s.err
}
func (s failedSource) Read(context.Context, string, string, int64, []byte) (int, error) {
	return 0, s.err
}
func (s failedSource) End(context.Context, string) error { return s.err }

// Follow implements Transport: the client service answers reads at a
// MinLSN from reads' stores and the rest NotLeader (clientapi.Replica),
// and snaps serves this member's stores to a winning peer.
func (g *GRPC) Follow(where func() (string, uint64), snaps snapshot.Source, reads ReplicaStores) (io.Closer, error) {
	co := g.o.Client
	logger := co.Logger
	if logger == nil {
		logger = g.o.Logger
	}
	clients, err := clientapi.Replica(where, reads.Store, &clientapi.ReplicaOptions{Shards: reads.Shards, Insecure: g.o.Insecure, ReadWait: co.ReadWait, Logger: logger})
	if err != nil {
		return nil, err
	}
	srv, err := grpctransport.ListenServices(g.o.Listen, &grpctransport.ServerOptions{TLS: g.o.ServerTLS, Insecure: g.o.Insecure,
		Logger: g.o.Logger, Services: []grpctransport.Service{clients},
		Snapshots: func(uint32) snapshot.Source { return snaps }})
	if err != nil {
		return nil, fmt.Errorf("node: serving at %s: %w", g.o.Listen, err)
	}
	return srv, nil
}

// Lead implements Transport.
func (g *GRPC) Lead(shards int) (LeaderEndpoint, error) {
	return &grpcEndpoint{g: g, shards: shards, ready: make(chan struct{})}, nil
}

type grpcEndpoint struct {
	g      *GRPC
	shards int
	ready  chan struct{} // closed once srv is set (or the endpoint closed)
	mu     sync.Mutex
	srv    *grpctransport.Server
	donors []*snapshot.Donor
	closed bool
}

// Listener returns shard's listener before the server exists: the leader
// opens first (a locked or unreadable directory fails as such, not as an
// address in use), then Serve binds the port.
func (e *grpcEndpoint) Listener(shard uint32) replication.Listener {
	return lateListener{e, shard}
}

type lateListener struct {
	e     *grpcEndpoint
	shard uint32
}

func (l lateListener) Accept(ctx context.Context) (replication.LeaderConn, replication.Ack, error) {
	select {
	case <-l.e.ready:
	case <-ctx.Done():
		return nil, replication.Ack{}, ctx.Err()
	}
	l.e.mu.Lock()
	srv := l.e.srv
	l.e.mu.Unlock()
	if srv == nil {
		return nil, replication.Ack{}, fmt.Errorf("node: endpoint closed: %w", replication.ErrClosed)
	}
	return srv.Listener(l.shard).Accept(ctx)
}

func (e *grpcEndpoint) Serve(l *leader.Leader, c ServeConfig) error {
	donors := make([]*snapshot.Donor, e.shards)
	closeDonors := func() {
		for _, d := range donors {
			if d != nil {
				_ = d.Close()
			}
		}
	}
	for s := range donors {
		d, err := l.Donor(uint32(s), nil)
		if err != nil {
			closeDonors()
			return err
		}
		donors[s] = d
	}
	co := e.g.o.Client
	co.Insecure, co.MinAck, co.Leading = e.g.o.Insecure, clientv1.Ack(c.Ack), c.Leading
	if co.Logger == nil {
		co.Logger = e.g.o.Logger
	}
	clients, err := clientapi.New(l, &co)
	if err != nil {
		closeDonors()
		return err
	}
	srv, err := grpctransport.Listen(e.g.o.Listen, &grpctransport.ServerOptions{Logger: e.g.o.Logger, TLS: e.g.o.ServerTLS, Insecure: e.g.o.Insecure,
		Snapshots: func(s uint32) snapshot.Source {
			if int(s) < len(donors) {
				return donors[s]
			}
			return nil
		},
		Services: []grpctransport.Service{clients.GRPC()}})
	if err != nil {
		closeDonors()
		return fmt.Errorf("node: serving at %s: %w", e.g.o.Listen, err)
	}
	for s := range uint32(e.shards) {
		srv.Listener(s)
	}
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		_ = srv.Close()
		closeDonors()
		return fmt.Errorf("node: endpoint closed: %w", replication.ErrClosed)
	}
	e.srv, e.donors = srv, donors
	e.mu.Unlock()
	close(e.ready)
	return nil
}

func (e *grpcEndpoint) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil
	}
	e.closed = true
	var err error
	if e.srv != nil {
		err = e.srv.Close()
	} else {
		close(e.ready)
	}
	for _, d := range e.donors {
		_ = d.Close()
	}
	return err
}
