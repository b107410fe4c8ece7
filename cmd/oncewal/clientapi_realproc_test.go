package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/proto"

	"github.com/oncewal/oncewal/client"
	"github.com/oncewal/oncewal/internal/pki"
	clientv1 "github.com/oncewal/oncewal/proto/oncewal/client/v1"
	"github.com/oncewal/oncewal/replication/grpctransport"
	"github.com/oncewal/oncewal/testutil"
)

// TestRealProcessesClientService runs the built binary: a leader serving
// the client service on its --listen port, and a follower serving it on
// --client-listen. A client certificate of gencerts' CA opens a session and
// submits a request at the leader (OK, then Replay), and the follower
// answers the same request "not leader" with its --leader address and the
// epoch it has seen; a key a Txn wrote at the leader is read at the
// follower (--client-shards 1) at the Txn's LSN, and without a minimum
// LSN the read is "not leader". A follower whose --client-listen would present its
// client-only certificate exits 1 at start, saying which certificate to
// give.
func TestRealProcessesClientService(t *testing.T) {
	rp := newRealProcs(t, "f1")
	cert := rp.cert
	clientPort := freePort(t)
	leaderAddr := fmt.Sprintf("localhost:%d", rp.port)
	ld := &proc{name: "leader", log: filepath.Join(rp.dir, "leader.log"), args: []string{"leader",
		"--dir", filepath.Join(rp.dir, "leader"), "--followers", "f1", "--listen", fmt.Sprintf("127.0.0.1:%d", rp.port),
		"--tls-ca", cert(pki.FileCA), "--tls-cert", cert(pki.FileLeader), "--tls-key", cert(pki.FileLeaderKey)}}
	followerArgs := append([]string{"follower", "--dir", filepath.Join(rp.dir, "f1"), "--id", "f1", "--leader", leaderAddr,
		"--client-listen", fmt.Sprintf("127.0.0.1:%d", clientPort)}, rp.followerTLS("f1")...)
	f1 := &proc{name: "f1", log: filepath.Join(rp.dir, "f1.log"), args: append(followerArgs,
		"--client-tls-cert", cert(pki.FileLeader), "--client-tls-key", cert(pki.FileLeaderKey), "--client-shards", "1")}
	reapProcs(t, []*proc{ld, f1})

	// The follower's own certificate is a client's: refused at start.
	_, e, err := rp.run(followerArgs...)
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != exitFailure || !strings.Contains(e, "--client-tls-cert") {
		t.Fatalf("--client-listen with the follower's client certificate: %v\n%s", err, e)
	}

	ld.start(t, rp.bin)
	f1.start(t, rp.bin)
	waitUntil(t, "the leader to serve", func() bool { return strings.Contains(readFile(t, ld.log), "oncewal leader: serving") })
	waitUntil(t, "the follower's client port", func() bool {
		return strings.Contains(readFile(t, f1.log), "oncewal follower: client service (not leader)")
	})

	alice := clientConn(t, rp, fmt.Sprintf("localhost:%d", rp.port))
	var opened clientv1.OpenSessionReply
	must(t, unary(alice, clientv1.Client_OpenSession_FullMethodName, &clientv1.OpenSessionRequest{}, &opened))
	if opened.Code != clientv1.Code_OK || opened.Epoch != 1 {
		t.Fatalf("OpenSession at the leader: %v", &opened)
	}
	req := &clientv1.SubmitRequest{Session: opened.Session, RequestId: "r1", Ack: clientv1.Ack_ACK_ONE,
		Payload: client.Ops(client.Add([]byte("n"), 1))}
	for _, want := range []clientv1.Code{clientv1.Code_OK, clientv1.Code_REPLAY} {
		var rep clientv1.SubmitReply
		must(t, unary(alice, clientv1.Client_Submit_FullMethodName, req, &rep))
		if rep.Code != want || rep.Lsn == 0 {
			t.Fatalf("Submit at the leader: %v, want %v", &rep, want)
		}
	}

	// The follower acknowledged the request (AckOne), so its store has
	// seen epoch 1.
	atFollower := clientConn(t, rp, fmt.Sprintf("localhost:%d", clientPort))
	var rep clientv1.SubmitReply
	must(t, unary(atFollower, clientv1.Client_Submit_FullMethodName, req, &rep))
	if rep.Code != clientv1.Code_NOT_LEADER || rep.Leader != leaderAddr || rep.Epoch != 1 {
		t.Fatalf("Submit at the follower: %v, want not leader, %s, epoch 1", &rep, leaderAddr)
	}

	// Read-your-writes at the follower: a key written at the leader, read
	// at the follower at the Txn's LSN.
	var tx clientv1.TxnReply
	must(t, unary(alice, clientv1.Client_Txn_FullMethodName, &clientv1.TxnRequest{Session: opened.Session, RequestId: "t1",
		Success: []*clientv1.TxnOp{{Kind: clientv1.TxnOp_PUT, Key: []byte("k"), Value: []byte("v")}}}, &tx))
	if tx.Code != clientv1.Code_OK {
		t.Fatalf("Txn at the leader: %v", &tx)
	}
	var got clientv1.GetReply
	waitUntil(t, "the follower to read the write", func() bool {
		must(t, unary(atFollower, clientv1.Client_Get_FullMethodName, &clientv1.GetRequest{Key: []byte("k"), MinLsn: []*clientv1.ShardLSN{{Shard: tx.Shard, Lsn: tx.Lsn}}}, &got))
		return got.Code == clientv1.Code_OK
	})
	if !got.Found || string(got.Kv.GetValue()) != "v" || got.Lsn < tx.Lsn {
		t.Fatalf("Get at the follower at LSN %d: %v", tx.Lsn, &got)
	}
	must(t, unary(atFollower, clientv1.Client_Get_FullMethodName, &clientv1.GetRequest{Key: []byte("k")}, &got))
	if got.Code != clientv1.Code_NOT_LEADER || got.Leader != leaderAddr {
		t.Fatalf("Get at the follower without a minimum LSN: %v, want not leader, %s", &got, leaderAddr)
	}
	must(t, ld.stop(t))
	must(t, f1.stop(t))
	// The leader's last stats line counts what it answered.
	if log := readFile(t, ld.log); !strings.Contains(log, "oncewal leader: client service") ||
		!strings.Contains(log, "submit_ok=1 submit_replay=1 open_session_ok=1") {
		t.Fatalf("the leader's client service stats:\n%s", log)
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	defer lis.Close()
	return lis.Addr().(*net.TCPAddr).Port
}

// clientConn dials addr with a client certificate oncewal://client/alice
// issued by gencerts' CA in rp.
func clientConn(t *testing.T, rp *realProcs, addr string) *grpc.ClientConn {
	t.Helper()
	ca := rp.ca(t)
	pair := testutil.ClientCert(t, &pki.Certs{CA: ca}, "oncewal://client/alice")
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(grpctransport.ClientTLSConfig(ca.Pool(), pair, ""))))
	must(t, err)
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// ca is the CA gencerts wrote in rp, key included, to issue certificates
// gencerts does not.
func (rp *realProcs) ca(t *testing.T) *pki.CA { return gencertsCA(t, filepath.Join(rp.dir, "certs")) }

// gencertsCA is the CA oncewal gencerts wrote into dir, key included.
func gencertsCA(t *testing.T, dir string) *pki.CA {
	t.Helper()
	p := func(n string) string { return filepath.Join(dir, n) }
	block, _ := pem.Decode([]byte(readFile(t, p(pki.FileCA))))
	caCert, err := x509.ParseCertificate(block.Bytes)
	must(t, err)
	block, _ = pem.Decode([]byte(readFile(t, p(pki.FileCAKey))))
	key, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	must(t, err)
	ca := &pki.CA{Cert: caCert, CertPEM: []byte(readFile(t, p(pki.FileCA)))}
	var ok bool
	if ca.Key, ok = key.(*ecdsa.PrivateKey); !ok {
		t.Fatalf("CA key is %T", key)
	}
	return ca
}

// unary makes one call of the client service.
func unary(cc *grpc.ClientConn, method string, req, rep proto.Message) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return cc.Invoke(ctx, method, req, rep)
}

// TestFollowerClientListenUsage: --client-listen's flags are checked with
// the others (exit 2, nothing started).
func TestFollowerClientListenUsage(t *testing.T) {
	base := []string{"follower", "--dir", "x", "--leader", "l:1", "--id", "a"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--insecure", "--client-listen", "nope"}, "--client-listen"},
		{[]string{"--insecure", "--client-tls-cert", "c.pem"}, "need --client-listen"},
		{[]string{"--insecure", "--client-listen", "127.0.0.1:0", "--client-tls-key", "k.pem"}, "--insecure serves --client-listen in plaintext"},
		{[]string{"--insecure", "--client-shards", "2"}, "need --client-listen"},
		{[]string{"--insecure", "--client-listen", "127.0.0.1:0", "--shards", "2", "--client-shards", "2"}, "--client-shards is for a single store"},
		{[]string{"--insecure", "--client-listen", "127.0.0.1:0", "--shard", "3", "--client-shards", "2"}, "has no shard 3"},
	} {
		args := append(append([]string(nil), base...), tc.args...)
		_, errOut, code := runCmd(t, args...)
		if code != exitUsage || !strings.Contains(errOut, tc.want) {
			t.Errorf("%q: exit %d, want %d with %q:\n%s", args, code, exitUsage, tc.want, errOut)
		}
	}
}
