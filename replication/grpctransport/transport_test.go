package grpctransport

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oncewal/oncewal/internal/pki"
	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/wal"
)

// testCerts are the package tests' CA, leader certificate and follower
// certificates for the IDs f1..f3 (clientTLS: f1's, the first follower of
// a sim.Run; identityTLS issues others).
var testCerts = sync.OnceValues(func() (*pki.Certs, error) {
	return pki.Generate(pki.Spec{Followers: []string{"f1", "f2", "f3"}, ValidFor: 24 * time.Hour})
})

func certs(t testing.TB) *pki.Certs {
	t.Helper()
	c, err := testCerts()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// serverTLS and clientTLS are the leader's and follower's mutual-TLS
// configurations for the generated certificates.
func serverTLS(c *pki.Certs) (*tls.Config, error) {
	pair, err := c.LeaderPair()
	if err != nil {
		return nil, err
	}
	return ServerTLSConfig(c.CA.Pool(), pair), nil
}

func clientTLS(c *pki.Certs) (*tls.Config, error) {
	pair, err := c.FollowerPair()
	if err != nil {
		return nil, err
	}
	return ClientTLSConfig(c.CA.Pool(), pair, ""), nil
}

// identityTLS is a client configuration whose certificate, of c's CA,
// names role/name: a follower's for its ID, a client's.
func identityTLS(t testing.TB, c *pki.Certs, role, name string) *tls.Config {
	t.Helper()
	l, err := c.CA.IssueIdentity(role, name, nil, c.CA.Cert.NotBefore, c.CA.Cert.NotAfter)
	if err != nil {
		t.Fatal(err)
	}
	pair, err := l.Pair()
	if err != nil {
		t.Fatal(err)
	}
	return ClientTLSConfig(c.CA.Pool(), pair, "")
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// mtls returns a TLS server on 127.0.0.1 and a Dialer for it.
func mtls(t testing.TB, log *slog.Logger) (*Server, *Dialer) {
	t.Helper()
	c := certs(t)
	st, err := serverTLS(c)
	if err != nil {
		t.Fatal(err)
	}
	ct, err := clientTLS(c)
	if err != nil {
		t.Fatal(err)
	}
	if log == nil {
		log = quietLogger()
	}
	srv, err := Listen("127.0.0.1:0", &ServerOptions{TLS: st, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	d, err := NewDialer(srv.Addr().String(), &DialerOptions{TLS: ct, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return srv, d
}

// followerDialer is a Dialer of srv whose certificate names follower id:
// the one a follower of that ID dials with.
func followerDialer(t testing.TB, srv *Server, id string, log *slog.Logger) *Dialer {
	t.Helper()
	if log == nil {
		log = quietLogger()
	}
	d, err := NewDialer(srv.Addr().String(), &DialerOptions{TLS: identityTLS(t, certs(t), pki.RoleFollower, id), Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func testBatch(t testing.TB, shard uint32, first uint64, n int) []byte {
	t.Helper()
	id := session.ID{1}
	evs := make([]wal.Event, n)
	for i := range evs {
		evs[i] = wal.Event{Op: wal.OpPut, Session: id, Seq: session.SeqNo(first + uint64(i)), Time: 1, Key: []byte("k"), Value: bytes.Repeat([]byte{'v'}, 100)}
	}
	b, err := wal.AppendBatch(nil, shard, 1, first, evs)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

type connPair struct {
	l replication.LeaderConn
	f replication.FollowerConn
}

func connect(t testing.TB, ctx context.Context, srv *Server, d *Dialer, hello replication.Ack) connPair {
	t.Helper()
	type res struct {
		c   replication.LeaderConn
		h   replication.Ack
		err error
	}
	ch := make(chan res, 1)
	go func() {
		c, h, err := srv.Accept(ctx)
		ch <- res{c, h, err}
	}()
	fc, err := d.Dial(ctx, hello)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	r := <-ch
	if r.err != nil {
		t.Fatalf("accept: %v", r.err)
	}
	if r.h != hello {
		t.Fatalf("hello = %+v, want %+v", r.h, hello)
	}
	return connPair{r.c, fc}
}

func TestRoundTripMTLS(t *testing.T) {
	checkGoroutines(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv, d := mtls(t, nil)
	hello := replication.Ack{Shard: 3, Epoch: 7, AppliedLSN: 41, FollowerID: pki.DefaultFollower, LastBatch: wal.BatchRef{Epoch: 7, CRC: 0xabcdef01}}
	// An ID that cannot be sent fails the Dial before anything is dialled.
	if _, err := d.Dial(ctx, replication.Ack{FollowerID: "not ok"}); !errors.Is(err, replication.ErrBadFollowerID) {
		t.Fatalf("Dial with a bad follower ID: %v", err)
	}
	p := connect(t, ctx, srv, d, hello)

	b := testBatch(t, 3, 42, 10)
	sent := bytes.Clone(b)
	if err := p.l.Send(ctx, b); err != nil {
		t.Fatal(err)
	}
	clear(b) // Send must not retain the slice
	got, err := p.f.Recv(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, sent) {
		t.Fatal("batch changed in transit")
	}
	for _, a := range []replication.Ack{{Shard: 3, Epoch: 7, AppliedLSN: 51}, {Shard: 3, Epoch: 7, AppliedLSN: 51, Refused: true}} {
		if err := p.f.Send(ctx, a); err != nil {
			t.Fatal(err)
		}
		ga, err := p.l.Recv(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if ga != a {
			t.Fatalf("ack = %+v, want %+v", ga, a)
		}
	}

	// Cancellation: blocked calls return ctx.Err() and the link stays usable.
	cctx, ccancel := context.WithCancel(ctx)
	ccancel()
	if _, err := p.f.Recv(cctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("follower Recv on cancelled ctx: %v", err)
	}
	if _, err := p.l.Recv(cctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("leader Recv on cancelled ctx: %v", err)
	}
	if err := p.l.Send(ctx, testBatch(t, 3, 52, 1)); err != nil {
		t.Fatal(err)
	}
	if _, err := p.f.Recv(ctx); err != nil {
		t.Fatal(err)
	}

	// Leader closes: follower sees ErrDisconnected, leader ErrClosed.
	p.l.Close()
	p.l.Close()
	if _, err := p.f.Recv(ctx); !errors.Is(err, replication.ErrDisconnected) {
		t.Fatalf("follower Recv after leader Close: %v", err)
	}
	if err := p.l.Send(ctx, sent); !errors.Is(err, replication.ErrClosed) {
		t.Fatalf("leader Send after Close: %v", err)
	}
	p.f.Close()
	if _, err := p.f.Recv(ctx); !errors.Is(err, replication.ErrDisconnected) && !errors.Is(err, replication.ErrClosed) {
		t.Fatalf("follower Recv after both closed: %v", err)
	}

	// Follower closes: leader sees ErrDisconnected, follower ErrClosed.
	p = connect(t, ctx, srv, d, hello)
	p.f.Close()
	if _, err := p.l.Recv(ctx); !errors.Is(err, replication.ErrDisconnected) {
		t.Fatalf("leader Recv after follower Close: %v", err)
	}
	if _, err := p.f.Recv(ctx); !errors.Is(err, replication.ErrClosed) {
		t.Fatalf("follower Recv after own Close: %v", err)
	}
	if err := p.f.Send(ctx, hello); !errors.Is(err, replication.ErrClosed) {
		t.Fatalf("follower Send after own Close: %v", err)
	}
	p.l.Close()

	// Server Close: Accept and live connections return ErrClosed, the
	// follower ErrDisconnected; the Dialer's Close ends its connections.
	p = connect(t, ctx, srv, d, hello)
	srv.Close()
	if _, _, err := srv.Accept(ctx); !errors.Is(err, replication.ErrClosed) {
		t.Fatalf("Accept after Close: %v", err)
	}
	if _, err := p.l.Recv(ctx); !errors.Is(err, replication.ErrClosed) {
		t.Fatalf("leader Recv after server Close: %v", err)
	}
	if _, err := p.f.Recv(ctx); !errors.Is(err, replication.ErrDisconnected) {
		t.Fatalf("follower Recv after server Close: %v", err)
	}
	if _, err := d.Dial(ctx, hello); !errors.Is(err, replication.ErrDisconnected) {
		t.Fatalf("Dial to a closed server: %v", err)
	}
	d.Close()
	if _, err := d.Dial(ctx, hello); !errors.Is(err, replication.ErrClosed) {
		t.Fatalf("Dial after Dialer Close: %v", err)
	}
}

func TestDialWaitsForAccept(t *testing.T) {
	checkGoroutines(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv, d := mtls(t, nil)
	// Nobody Accepts: Dial blocks until its ctx ends.
	dctx, dcancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() {
		_, err := d.Dial(dctx, replication.Ack{})
		errc <- err
	}()
	waitFor(t, ctx, "stream to reach the server", func() bool { return srv.Stats().Streams == 1 })
	select {
	case err := <-errc:
		t.Fatalf("Dial returned before Accept: %v", err)
	default:
	}
	dcancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("Dial after ctx cancel: %v", err)
	}
	// The abandoned stream ends on the server too and does not reach a
	// later Accept. (Before the server notices, an Accept may still take
	// it; that connection then fails at once and the Shipper accepts again.)
	waitFor(t, ctx, "server to drop the abandoned stream", func() bool { return srv.Stats().Disconnects == 1 })
	p := connect(t, ctx, srv, d, replication.Ack{AppliedLSN: 5})
	p.f.Close()
	p.l.Close()
}

func TestBackpressureSendHonoursCtx(t *testing.T) {
	checkGoroutines(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	srv, d := mtls(t, nil)
	p := connect(t, ctx, srv, d, replication.Ack{})
	// The follower never reads: Sends pile up in gRPC flow-control windows
	// and the send queue until Send blocks; ctx bounds it.
	big := testBatch(t, 0, 1, 5000) // ~600 KB
	sctx, scancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() {
		for {
			if err := p.l.Send(sctx, big); err != nil {
				errc <- err
				return
			}
		}
	}()
	waitFor(t, ctx, "Send to block", func() bool {
		// Blocked: the server stopped sending and nothing errored.
		s1 := srv.Stats().BatchesSent
		time.Sleep(50 * time.Millisecond)
		return srv.Stats().BatchesSent == s1 && len(errc) == 0
	})
	scancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("blocked Send: %v", err)
	}
	// Still usable: the follower drains and gets whole batches.
	for range 3 {
		b, err := p.f.Recv(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(b, big) {
			t.Fatal("batch changed")
		}
	}
	p.f.Close()
	p.l.Close()
}

func TestOptionsValidation(t *testing.T) {
	c := certs(t)
	st, _ := serverTLS(c)
	ct, _ := clientTLS(c)
	noMutual := st.Clone()
	noMutual.ClientAuth = tls.VerifyClientCertIfGiven
	noCA := st.Clone()
	noCA.ClientCAs = nil
	for name, o := range map[string]*ServerOptions{
		"nothing": {}, "both": {TLS: st, Insecure: true}, "not mutual": {TLS: noMutual}, "no client CA": {TLS: noCA},
	} {
		if _, err := Listen("127.0.0.1:0", o); !errors.Is(err, ErrBadOptions) {
			t.Errorf("server %s: %v, want ErrBadOptions", name, err)
		}
	}
	skip := ct.Clone()
	skip.InsecureSkipVerify = true
	noCert := ct.Clone()
	noCert.Certificates = nil
	for name, o := range map[string]*DialerOptions{
		"nothing": {}, "both": {TLS: ct, Insecure: true}, "skip verify": {TLS: skip}, "no client cert": {TLS: noCert},
	} {
		if _, err := NewDialer("127.0.0.1:1", o); !errors.Is(err, ErrBadOptions) {
			t.Errorf("dialer %s: %v, want ErrBadOptions", name, err)
		}
	}
	// The caller's config is not modified (it is cloned, then hardened).
	st.MinVersion = tls.VersionTLS12
	s, err := Listen("127.0.0.1:0", &ServerOptions{TLS: st})
	if err != nil {
		t.Fatal(err)
	}
	if st.MinVersion != tls.VersionTLS12 {
		t.Error("server TLS config modified")
	}
	s.Close()
}

func mustHello(t testing.TB, a replication.Ack) []byte {
	t.Helper()
	f, err := encodeHello(a)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func TestFrameCodec(t *testing.T) {
	a := replication.Ack{Shard: 9, Epoch: 1 << 40, AppliedLSN: 1<<63 + 5, Refused: true}
	if got, err := decodeAck(encodeAck(a)); err != nil || got != a {
		t.Fatalf("ack round trip: %+v %v", got, err)
	}
	// Acks never carry the hello-only fields.
	withID := a
	withID.FollowerID, withID.LastBatch = "replica-1", wal.BatchRef{Epoch: 3, CRC: 0xdeadbeef}
	if got, err := decodeAck(encodeAck(withID)); err != nil || got != a {
		t.Fatalf("ack with hello fields: %+v %v", got, err)
	}
	a.Refused = false
	for _, h := range []replication.Ack{a, {Shard: 1, FollowerID: "x"},
		{Shard: 2, Epoch: 3, AppliedLSN: 4, FollowerID: strings.Repeat("a.b_c-9", 10)[:replication.MaxFollowerIDLen],
			LastBatch: wal.BatchRef{Epoch: 3, CRC: 0xfeedface}}} {
		if got, err := decodeHello(mustHello(t, h)); err != nil || got != h {
			t.Fatalf("hello round trip: %+v %v, want %+v", got, err, h)
		}
	}
	if _, err := encodeHello(replication.Ack{FollowerID: "a b"}); !errors.Is(err, replication.ErrBadFollowerID) {
		t.Fatalf("encodeHello with a bad ID: %v", err)
	}
	b := testBatch(t, 0, 1, 3)
	good := append([]byte{frameBatch}, b...)
	if got, err := decodeBatchFrame(good); err != nil || !bytes.Equal(got, b) {
		t.Fatalf("batch frame: %v", err)
	}
	named := replication.Ack{Shard: 1, FollowerID: "abc"}
	helloWith := func(edit func(f []byte) []byte) []byte { return edit(mustHello(t, named)) }
	// A version-1 hello as the previous release sent it: 22 bytes.
	v1 := append(appendControl(nil, frameHello, 1, a), []byte{}...)
	badFlags := encodeAck(a)
	badFlags[1] = 0x80
	hello := func(f []byte) error { _, err := decodeHello(f); return err }
	ack := func(f []byte) error { _, err := decodeAck(f); return err }
	batch := func(f []byte) error { _, err := decodeBatchFrame(f); return err }
	bad := map[string]struct {
		f   []byte
		dec func([]byte) error
	}{
		"empty ack":            {nil, ack},
		"short ack":            {encodeAck(a)[:10], ack},
		"long ack":             {append(encodeAck(a), 0), ack},
		"hello as ack":         {mustHello(t, a), ack},
		"ack as hello":         {encodeAck(a), hello},
		"hello version 1":      {v1, hello},
		"hello version 0":      {helloWith(func(f []byte) []byte { f[1] = 0; return f }), hello},
		"hello version 3":      {helloWith(func(f []byte) []byte { f[1] = 3; return f }), hello},
		"hello short":          {mustHello(t, a)[:helloFixedSize-1], hello},
		"hello id cut":         {helloWith(func(f []byte) []byte { return f[:len(f)-1] }), hello},
		"hello trailing":       {helloWith(func(f []byte) []byte { return append(f, 'x') }), hello},
		"hello id length high": {helloWith(func(f []byte) []byte { f[helloFixedSize-1] = 200; return f }), hello},
		"hello id bad byte":    {helloWith(func(f []byte) []byte { f[len(f)-1] = '/'; return f }), hello},
		"hello id too long": {func() []byte {
			f := mustHello(t, replication.Ack{})
			f[helloFixedSize-1] = replication.MaxFollowerIDLen + 1
			return append(f, bytes.Repeat([]byte{'a'}, replication.MaxFollowerIDLen+1)...)
		}(), hello},
		"ack flags":       {badFlags, ack},
		"empty batch":     {nil, batch},
		"ack as batch":    {encodeAck(a), batch},
		"truncated batch": {good[:len(good)-1], batch},
		"trailing bytes":  {append(bytes.Clone(good), 0), batch},
		"header only":     {good[:1+wal.HeaderSize-1], batch},
		"corrupt header":  {func() []byte { g := bytes.Clone(good); g[5] ^= 1; return g }(), batch},
	}
	for name, c := range bad {
		if err := c.dec(c.f); !errors.Is(err, ErrBadFrame) {
			t.Errorf("%s: %v, want ErrBadFrame", name, err)
		}
	}
	if err := hello(v1); err == nil || !strings.Contains(err.Error(), "protocol version 1") {
		t.Errorf("a version-1 hello must be refused for its version: %v", err)
	}
	if maxHelloSize > maxControlFrame {
		t.Errorf("largest hello %d > leader's receive limit %d", maxHelloSize, maxControlFrame)
	}
}
