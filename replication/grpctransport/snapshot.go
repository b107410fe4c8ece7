package grpctransport

// The Snapshot method: a follower that must be rebuilt (package snapshot)
// fetches a donor's snapshot over the same service, connection security and
// port as the batch stream. It is a unary method called once per step —
// begin (take a snapshot of a shard, answer its manifest), read (one chunk
// of one file at an offset), end (release it) — so a dropped connection
// costs one chunk: the fetch retries the read at the same offset on a new
// connection (snapshot.Fetch), and a donor that lost the snapshot answers
// NotFound, which the fetch takes as snapshot.ErrUnknownSnapshot and starts
// over. Requests are small JSON frames; a read's answer is one flag byte
// (1: end of file) and the chunk's bytes. Checksums are the manifest's
// (BLAKE3 per file and over the manifest), checked by the fetch.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/snapshot"
)

const (
	snapshotMethodName = "Snapshot"
	snapshotMethod     = "/" + serviceName + "/" + snapshotMethodName
	// maxSnapshotRequest bounds a request frame (JSON: an op, a shard, an
	// ID, a file name, an offset, a length).
	maxSnapshotRequest = 1 << 10
	// maxSnapshotAnswer bounds an answer: a chunk and its flag, or a
	// manifest.
	maxSnapshotAnswer = 8 << 20
)

type snapshotRequest struct {
	Op     string `json:"op"` // begin, read, end
	Shard  uint32 `json:"shard,omitempty"`
	Holder string `json:"holder,omitempty"` // begin: snapshot.HeldSource's holder
	ID     string `json:"id,omitempty"`
	Name   string `json:"name,omitempty"`
	Off    int64  `json:"off,omitempty"`
	N      int    `json:"n,omitempty"`
}

// snapshotService answers Snapshot calls from the donors the server was
// given (ServerOptions.Snapshots), through a snapshot.Router.
type snapshotService struct {
	donors   *snapshot.Router
	insecure bool
	log      *slog.Logger
	refused  *atomic.Uint64 // ServerStats.RefusedIdentity
}

func (s *snapshotService) handle(ctx context.Context, dec func(any) error) (any, error) {
	var in frame
	if err := dec(&in); err != nil {
		return nil, err
	}
	// A store is every session's data: only a replica may download one.
	if err := mayFetchSnapshot(ctx, s.insecure); err != nil {
		s.refused.Add(1)
		remote := "?"
		if p, ok := peer.FromContext(ctx); ok {
			remote = p.Addr.String()
		}
		s.log.Warn("oncewal leader: refused a snapshot to a caller that is no replica", "remote", remote, "err", err)
		return nil, status.Error(codes.PermissionDenied, err.Error())
	}
	if len(in.b) > maxSnapshotRequest {
		return nil, status.Errorf(codes.ResourceExhausted, "grpctransport: snapshot request of %d bytes, limit %d", len(in.b), maxSnapshotRequest)
	}
	var req snapshotRequest
	if err := json.Unmarshal(in.b, &req); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "grpctransport: snapshot request: %v", err)
	}
	switch req.Op {
	case "begin":
		m, err := s.donors.BeginFor(ctx, req.Shard, req.Holder)
		if err != nil {
			return nil, snapshotStatus(err)
		}
		b, err := json.Marshal(m)
		if err != nil {
			return nil, status.Errorf(codes.Internal, "grpctransport: %v", err)
		}
		return &frame{b}, nil
	case "read":
		if req.N <= 0 || req.N > snapshot.MaxChunkSize {
			return nil, status.Errorf(codes.InvalidArgument, "grpctransport: snapshot read of %d bytes", req.N)
		}
		out := make([]byte, 1+req.N)
		n, err := s.donors.Read(ctx, req.ID, req.Name, req.Off, out[1:])
		switch {
		case errors.Is(err, io.EOF):
			out[0] = 1
		case err != nil:
			return nil, snapshotStatus(err)
		}
		return &frame{out[:1+n]}, nil
	case "end":
		if err := s.donors.End(ctx, req.ID); err != nil {
			return nil, snapshotStatus(err)
		}
		return &frame{[]byte{}}, nil
	}
	return nil, status.Errorf(codes.InvalidArgument, "grpctransport: snapshot op %q", req.Op)
}

// snapshotStatus carries the snapshot package's typed refusals as status
// codes (snapshotError undoes it on the client).
func snapshotStatus(err error) error {
	code := codes.Unavailable
	switch {
	case errors.Is(err, snapshot.ErrUnknownSnapshot):
		code = codes.NotFound
	case errors.Is(err, snapshot.ErrMismatch):
		code = codes.FailedPrecondition
	case errors.Is(err, snapshot.ErrClosed):
		// Not Unavailable, which a fetch retries: this server's donor
		// will not serve again.
		code = codes.Aborted
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		code = codes.Canceled
	}
	return status.Error(code, err.Error())
}

func snapshotError(err error) error {
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	switch st.Code() {
	case codes.NotFound:
		return fmt.Errorf("%w (donor: %s)", snapshot.ErrUnknownSnapshot, st.Message())
	case codes.FailedPrecondition:
		return fmt.Errorf("%w (donor: %s)", snapshot.ErrMismatch, st.Message())
	case codes.Aborted:
		return fmt.Errorf("%w (donor: %s)", snapshot.ErrClosed, st.Message())
	case codes.PermissionDenied:
		msg := strings.TrimPrefix(st.Message(), replication.ErrIdentityMismatch.Error()+": ")
		return fmt.Errorf("%w (donor: %s)", replication.ErrIdentityMismatch, msg)
	}
	return fmt.Errorf("grpctransport: snapshot: %w", err)
}

// SnapshotClient fetches snapshots from a donor's Server: a snapshot.Source
// over gRPC with the Dialer's security (mutual TLS). A dropped connection
// fails the call in flight; the next call reconnects.
type SnapshotClient struct {
	cc     *grpc.ClientConn
	closed atomic.Bool
}

var _ snapshot.HeldSource = (*SnapshotClient)(nil)

// NewSnapshotClient returns a SnapshotClient of the server at addr.
func NewSnapshotClient(addr string, opts *DialerOptions) (*SnapshotClient, error) {
	var o DialerOptions
	if opts != nil {
		o = *opts
	}
	if addr == "" {
		return nil, fmt.Errorf("%w: empty donor address", ErrBadOptions)
	}
	if err := o.EnsureDefaults().Validate(); err != nil {
		return nil, err
	}
	creds, err := o.creds()
	if err != nil {
		return nil, err
	}
	return newSnapshotClient(addr, &o, creds)
}

func newSnapshotClient(addr string, o *DialerOptions, creds credentials.TransportCredentials) (*SnapshotClient, error) {
	cc, err := grpc.NewClient("passthrough:///"+addr,
		grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(
			grpc.ForceCodecV2(rawCodec{}),
			grpc.MaxCallRecvMsgSize(maxSnapshotAnswer),
			grpc.MaxCallSendMsgSize(maxSnapshotRequest),
		),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: o.KeepaliveTime, Timeout: o.KeepaliveTimeout, PermitWithoutStream: true}),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.DefaultConfig, MinConnectTimeout: o.ConnectTimeout}),
		grpc.WithInitialWindowSize(streamWindow),
		grpc.WithInitialConnWindowSize(streamWindow),
	)
	if err != nil {
		return nil, fmt.Errorf("%w: grpctransport: %v", ErrBadOptions, err)
	}
	return &SnapshotClient{cc: cc}, nil
}

func (c *SnapshotClient) call(ctx context.Context, req snapshotRequest) ([]byte, error) {
	if c.closed.Load() {
		return nil, fmt.Errorf("grpctransport: snapshot client: %w", ErrClosed)
	}
	b, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	var out frame
	if err := c.cc.Invoke(ctx, snapshotMethod, &frame{b}, &out); err != nil {
		return nil, snapshotError(err)
	}
	return out.b, nil
}

// Begin implements snapshot.Source.
func (c *SnapshotClient) Begin(ctx context.Context, shard uint32) (snapshot.Manifest, error) {
	return c.BeginFor(ctx, shard, "")
}

// BeginFor implements snapshot.HeldSource: the donor releases the snapshots
// it still serves to holder first.
func (c *SnapshotClient) BeginFor(ctx context.Context, shard uint32, holder string) (snapshot.Manifest, error) {
	b, err := c.call(ctx, snapshotRequest{Op: "begin", Shard: shard, Holder: holder})
	if err != nil {
		return snapshot.Manifest{}, err
	}
	var m snapshot.Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return snapshot.Manifest{}, fmt.Errorf("%w: manifest: %v", snapshot.ErrCorrupt, err)
	}
	return m, nil
}

// Read implements snapshot.Source.
func (c *SnapshotClient) Read(ctx context.Context, id, name string, off int64, p []byte) (int, error) {
	b, err := c.call(ctx, snapshotRequest{Op: "read", ID: id, Name: name, Off: off, N: len(p)})
	if err != nil {
		return 0, err
	}
	if len(b) == 0 || len(b)-1 > len(p) {
		return 0, fmt.Errorf("grpctransport: snapshot: malformed chunk of %d bytes for %d asked", len(b), len(p))
	}
	n := copy(p, b[1:])
	if b[0] == 1 {
		return n, io.EOF
	}
	return n, nil
}

// End implements snapshot.Source.
func (c *SnapshotClient) End(ctx context.Context, id string) error {
	_, err := c.call(ctx, snapshotRequest{Op: "end", ID: id})
	return err
}

// Close closes the client's connection; later calls return ErrClosed.
// Idempotent.
func (c *SnapshotClient) Close() error {
	if c.closed.Swap(true) {
		return nil
	}
	return c.cc.Close()
}
