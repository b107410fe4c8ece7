package bench

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"fmt"
	"math/big"
	mrand "math/rand/v2"
	"net"
	"net/url"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/oncewal/oncewal/client"
	"github.com/oncewal/oncewal/clientapi"
	"github.com/oncewal/oncewal/follower"
	"github.com/oncewal/oncewal/idempotency"
	"github.com/oncewal/oncewal/leader"
	clientv1 "github.com/oncewal/oncewal/proto/oncewal/client/v1"
	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/replication/grpctransport"
	"github.com/oncewal/oncewal/replication/inprocess"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/store"
	"github.com/oncewal/oncewal/wal"
)

// Client benchmarks (issue 26): the front door's cost. A leader on disk
// (one shard, WAL synced per batch, its own store applied) runs a stream
// of client requests — 16-byte request IDs, 64-byte payloads (the default
// payload: one put under the request ID), 30 % of them retries of one of
// the last 50,000 IDs (answered from the ledger, not run again) — from
// ClientCallers concurrent callers in one session, as one process of one
// principal would send them.
//
// ClientNetwork sends each request with client.Client.Submit to the
// client service (clientapi) on a real gRPC server with mutual TLS on
// loopback; ClientInProcess does in this process what the service does
// for each request — Shard.Claim at the door, the default handler's
// events, Shard.Commit with the outcome, the ack wait — without the
// network: the reference the network path is judged against. With
// followers (real, on disk, synced, over the in-process transport), both
// answer under AckMajority. Figures: requests/s and the process CPU per
// request (reported as cpu-ns/event: one request is one event).

// Shape of the client workload.
const (
	ClientCallers      = 16
	clientRequestID    = 16
	clientPayload      = 64
	clientRetryPercent = 30
	clientRetryWindow  = 50_000
)

// clientWorkload hands the callers their requests: ID, payload, and
// whether it is a retry. Safe for concurrent use.
type clientWorkload struct {
	mu     sync.Mutex
	rng    *mrand.Rand
	next   uint64
	acc    int
	value  []byte
	issued atomic.Int64
}

func newClientWorkload() *clientWorkload {
	w := &clientWorkload{rng: mrand.New(mrand.NewPCG(7, 9))}
	// The value that makes one put under a 16-byte ID a 64-byte payload.
	for len(client.Ops(client.Put(make([]byte, clientRequestID), w.value))) < clientPayload {
		w.value = append(w.value, 'v')
	}
	return w
}

// request returns the next request: retryPercent of them (once there is
// anything to retry) resend one of the last clientRetryWindow IDs with its
// payload.
func (w *clientWorkload) request() (id string, payload []byte) {
	w.mu.Lock()
	n := w.next
	if w.acc += clientRetryPercent; w.acc >= 100 && w.next > 0 {
		w.acc -= 100
		n = w.next - uint64(1+w.rng.IntN(int(min(w.next, clientRetryWindow))))
	} else {
		w.next++
	}
	w.mu.Unlock()
	var raw [clientRequestID / 2]byte
	for i := range raw {
		raw[i] = byte((n * 0x9e3779b97f4a7c15) >> (8 * i))
	}
	id = hex.EncodeToString(raw[:]) // 16 bytes
	w.issued.Add(1)
	return id, client.Ops(client.Put([]byte(id), w.value))
}

// clientRig is a leader with n real followers.
type clientRig struct {
	dir  string
	fs   *syncCountingFS // the leader's: its WAL's, store's and directories' syncs
	l    *leader.Leader
	sh   *leader.Shard
	tr   *inprocess.Transport
	fols []*follower.Follower
	stop func()
}

func openClientRig(n int) (*clientRig, error) {
	Release()
	dir, err := os.MkdirTemp("", "oncewal-bench-client-")
	if err != nil {
		return nil, err
	}
	r := &clientRig{dir: dir, tr: inprocess.New(inprocess.FaultsNone, 1), fs: &syncCountingFS{FS: vfs.Default}}
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("f%d", i+1)
	}
	o := &leader.Options{Shards: 1, FS: r.fs, Logger: quietSlog(), Store: store.Options{Logger: quietSlog()}, Followers: ids}
	if n > 0 {
		o.Listener = func(uint32) replication.Listener { return r.tr }
	}
	if r.l, err = leader.Open(dir, o); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	r.sh, _ = r.l.Shard(0)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	r.stop = func() { cancel(); _ = r.tr.Close(); wg.Wait() }
	if n == 0 {
		return r, nil
	}
	wg.Go(func() { _ = r.l.Run(ctx) })
	for i, id := range ids {
		f, err := follower.Open(fmt.Sprintf("%s/follower-%d", dir, i+1),
			&follower.Options{Store: store.Options{ID: id, Logger: quietSlog()}})
		if err != nil {
			r.close()
			return nil, err
		}
		r.fols = append(r.fols, f)
		wg.Go(func() { _ = f.Serve(ctx, r.tr) })
	}
	return r, nil
}

func (r *clientRig) close() {
	r.stop()
	for _, f := range r.fols {
		_ = f.Close()
	}
	_ = r.l.Close()
	_ = os.RemoveAll(r.dir)
}

// serve serves the client service of the rig's leader, with opts, over
// mutual TLS on loopback, and returns the server and both sides' TLS
// configurations (the server's, for more servers of the same CA).
func (r *clientRig) serve(opts *clientapi.Options) (srv *grpctransport.Server, server, cl *tls.Config, err error) {
	if server, cl, err = benchTLS(); err != nil {
		return nil, nil, nil, err
	}
	svc, err := clientapi.New(r.l, opts)
	if err != nil {
		return nil, nil, nil, err
	}
	srv, err = grpctransport.Listen("127.0.0.1:0", &grpctransport.ServerOptions{TLS: server, Logger: quietSlog(),
		Services: []grpctransport.Service{svc.GRPC()}})
	return srv, server, cl, err
}

// ack is the policy the rig's requests are answered under; 0: the
// leader's WAL alone (the wire's AckLeader), no wait.
func (r *clientRig) ack() leader.AckPolicy {
	if len(r.fols) == 0 {
		return 0
	}
	return leader.AckMajority
}

// callers runs ClientCallers goroutines that each call do for requests of
// w until b.N requests were issued; the first error stops the run. Beside
// requests/s and the CPU, it reports the leader's file syncs per request:
// group commit shares them among the requests that arrive together, so
// they tell how much of a gap between two designs is their arrivals'.
func callers(b *testing.B, r *clientRig, w *clientWorkload, do func(id string, payload []byte) error) {
	runCallers(b, r, func(int64) error { return do(w.request()) })
}

// runCallers is callers with do given the request's number (b.N-1 down
// to 0) instead of a workload's request.
func runCallers(b *testing.B, r *clientRig, do func(n int64) error) {
	var left atomic.Int64
	left.Store(int64(b.N))
	var failed atomic.Value
	var wg sync.WaitGroup
	cpu0, syncs0 := cpuNanos(), r.fs.syncs.Load()
	b.ResetTimer()
	for range ClientCallers {
		wg.Go(func() {
			for n := left.Add(-1); n >= 0; n = left.Add(-1) {
				if err := do(n); err != nil {
					failed.CompareAndSwap(nil, err)
					left.Store(0)
					return
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	if err, _ := failed.Load().(error); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "requests/s")
	b.ReportMetric(float64(cpuNanos()-cpu0)/float64(b.N), "cpu-ns/event")
	b.ReportMetric(float64(r.fs.syncs.Load()-syncs0)/float64(b.N), "fsyncs/request")
}

// ClientInProcess is the reference: the client service's work per
// request, in process, over a leader with followers (0: AckLeader, else
// AckMajority).
func ClientInProcess(followers int) func(*testing.B) {
	return func(b *testing.B) {
		r, err := openClientRig(followers)
		if err != nil {
			b.Fatal(err)
		}
		defer r.close()
		var sid session.ID
		if _, err := rand.Read(sid[:]); err != nil {
			b.Fatal(err)
		}
		if _, err := r.sh.Append(wal.Event{Op: wal.OpOpen, Session: sid}); err != nil {
			b.Fatal(err)
		}
		ctx := context.Background()
		ack := r.ack()
		callers(b, r, newClientWorkload(), func(id string, payload []byte) error {
			c, err := r.sh.Claim(ctx, sid, "bench", id, payload, idempotency.ClaimOptions{Wait: true})
			if err != nil {
				return err
			}
			lsn, _ := r.sh.Position()
			if c.Status == idempotency.Fresh {
				events, outcome, err := clientapi.DefaultHandler(ctx, clientapi.Request{Principal: "bench", Session: sid, RequestID: id, Payload: payload})
				if err != nil {
					return err
				}
				h, err := r.sh.Commit(c, outcome, events...)
				if err != nil {
					return err
				}
				lsn = h.LastLSN()
			} else if c.Status != idempotency.Replay {
				return fmt.Errorf("request %s: claim status %v", id, c.Status)
			}
			if ack == 0 {
				return nil
			}
			return r.sh.WaitAcked(ctx, lsn, ack)
		})
	}
}

// ClientNetwork is the same workload sent by client.Client over gRPC with
// mutual TLS on loopback to the client service of a leader with followers
// (0: AckLeader, else AckMajority).
func ClientNetwork(followers int) func(*testing.B) {
	return func(b *testing.B) {
		r, err := openClientRig(followers)
		if err != nil {
			b.Fatal(err)
		}
		defer r.close()
		srv, _, clientTLS, err := r.serve(&clientapi.Options{Logger: quietSlog()})
		if err != nil {
			b.Fatal(err)
		}
		defer srv.Close()
		ack := client.AckLeader
		if followers > 0 {
			ack = client.AckMajority
		}
		c, err := client.New(&client.Options{Addrs: []string{srv.Addr().String()}, TLS: clientTLS, Ack: ack, Logger: quietSlog()})
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		ctx := context.Background()
		// The session is opened (and the connection made) before the clock runs.
		if _, err := c.Submit(ctx, "warm-up", client.Ops(client.Put([]byte("warm"), nil))); err != nil {
			b.Fatal(err)
		}
		callers(b, r, newClientWorkload(), func(id string, payload []byte) error {
			_, err := c.Submit(ctx, id, payload)
			return err
		})
	}
}

// ClientReadKeys is how many keys the read benchmarks read, at random.
const ClientReadKeys = 1000

// ClientReads measures Get over the network as ClientNetwork measures
// Submit: client.Client over gRPC with mutual TLS on loopback, from
// ClientCallers concurrent callers, against a leader with one follower
// whose writes are answered under AckMajority (the service's MinAck, as
// a node running under that policy sets it). ClientReadKeys keys (a
// 64-byte value each) are written before the clock runs, each Get reads
// one at random. On the leader (fromFollower false) the Gets are
// linearizable: each reads a snapshot and waits for its LSN to be
// acknowledged under MinAck. From the follower, the Gets carry the last
// write's LSN as MinLSN and go to its client service
// (clientapi.Replica over the follower's store; client.FromReplica), which
// reads its own store once it has applied it. Figures: requests/s, the
// process CPU per request (leader, follower and client share the
// process).
func ClientReads(fromFollower bool) func(*testing.B) {
	return func(b *testing.B) {
		r, err := openClientRig(1)
		if err != nil {
			b.Fatal(err)
		}
		defer r.close()
		srv, serverTLS, clientTLS, err := r.serve(&clientapi.Options{MinAck: clientv1.Ack_ACK_MAJORITY, Logger: quietSlog()})
		if err != nil {
			b.Fatal(err)
		}
		defer srv.Close()
		leaderAddr := srv.Addr().String()
		rep, err := clientapi.Replica(func() (string, uint64) { return leaderAddr, r.sh.Epoch() },
			func(uint32) (*store.Store, error) { return r.fols[0].Store(), nil },
			&clientapi.ReplicaOptions{Shards: 1, Logger: quietSlog()})
		if err != nil {
			b.Fatal(err)
		}
		rsrv, err := grpctransport.ListenServices("127.0.0.1:0", &grpctransport.ServerOptions{TLS: serverTLS, Logger: quietSlog(),
			Services: []grpctransport.Service{rep}})
		if err != nil {
			b.Fatal(err)
		}
		defer rsrv.Close()
		c, err := client.New(&client.Options{Addrs: []string{leaderAddr}, TLS: clientTLS, Ack: client.AckMajority, Logger: quietSlog()})
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		ctx := context.Background()
		keys := make([][]byte, ClientReadKeys)
		value := make([]byte, 64)
		var (
			mu      sync.Mutex
			last    client.TxnResult
			loadErr error
			wg      sync.WaitGroup
		)
		for g := range ClientCallers {
			wg.Go(func() {
				for i := g; i < len(keys); i += ClientCallers {
					key := fmt.Appendf(nil, "key-%05d", i)
					res, err := c.Txn(ctx, fmt.Sprintf("load-%05d", i), client.Txn{Then: []client.TxnOp{client.OpPut(key, value)}})
					mu.Lock()
					keys[i] = key
					if err != nil && loadErr == nil {
						loadErr = err
					}
					if res.LSN > last.LSN {
						last = res
					}
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		if loadErr != nil {
			b.Fatal(loadErr)
		}
		opts := []client.ReadOption{client.MinLSN(last.Shard, last.LSN), client.FromReplica(rsrv.Addr().String())}
		if !fromFollower {
			opts = nil
		}
		// The connections are made before the clock runs.
		if _, _, err := c.Get(ctx, keys[0], opts...); err != nil {
			b.Fatal(err)
		}
		runCallers(b, r, func(n int64) error {
			key := keys[uint64(n)*0x9e3779b97f4a7c15%ClientReadKeys]
			if _, found, err := c.Get(ctx, key, opts...); err != nil || !found {
				return fmt.Errorf("get %s: found %v, %w", key, found, err)
			}
			return nil
		})
	}
}

// benchTLS makes a CA, a server certificate for 127.0.0.1 and a client
// certificate naming oncewal://client/bench, and returns both sides'
// mutual-TLS configurations.
func benchTLS() (server, cl *tls.Config, err error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "oncewal bench CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, nil, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	leaf := func(serial int64, usage x509.ExtKeyUsage, edit func(*x509.Certificate)) (tls.Certificate, error) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return tls.Certificate{}, err
		}
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "oncewal bench"},
			NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}}
		edit(tmpl)
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			return tls.Certificate{}, err
		}
		return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
	}
	srvCert, err := leaf(2, x509.ExtKeyUsageServerAuth, func(c *x509.Certificate) { c.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)} })
	if err != nil {
		return nil, nil, err
	}
	u, err := url.Parse("oncewal://client/bench")
	if err != nil {
		return nil, nil, err
	}
	clCert, err := leaf(3, x509.ExtKeyUsageClientAuth, func(c *x509.Certificate) { c.URIs = []*url.URL{u} })
	if err != nil {
		return nil, nil, err
	}
	return grpctransport.ServerTLSConfig(pool, srvCert), grpctransport.ClientTLSConfig(pool, clCert, ""), nil
}
