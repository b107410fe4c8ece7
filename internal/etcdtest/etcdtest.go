// Package etcdtest starts a real, single-member etcd (go.etcd.io/etcd/server/v3
// embed, the version the client speaks to) inside a test process, so that
// tests of the coordination seam run against etcd itself rather than a mock.
//
// Contract: only _test.go files import this package, and it is the only
// non-test code of the module that imports go.etcd.io/etcd/server
// (testutil's TestEtcdServerOnlyInTests): the library and the CLI link the
// etcd client alone.
package etcdtest

import (
	"net/url"
	"testing"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// readyTimeout bounds etcd's start: it is ready in ~0.3 s on a 2-vCPU
// machine, so a minute means it is stuck, and the test fails instead of
// hanging.
const readyTimeout = time.Minute

// Start runs a single-member etcd with its data in t.TempDir(), listening
// on loopback ports the kernel picks, and stops it in t.Cleanup. It
// returns the client endpoint ("http://127.0.0.1:PORT").
func Start(t testing.TB) string {
	t.Helper()
	cfg := embed.NewConfig()
	cfg.Dir = t.TempDir()
	cfg.Name = "etcdtest"
	loop := url.URL{Scheme: "http", Host: "127.0.0.1:0"}
	cfg.ListenClientUrls = []url.URL{loop}
	cfg.AdvertiseClientUrls = []url.URL{loop}
	cfg.ListenPeerUrls = []url.URL{loop}
	cfg.AdvertisePeerUrls = []url.URL{loop}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	// etcd logs every request at info, and its listeners' ends as errors
	// when the test stops it; a test's output should hold the test's own
	// lines. A failure to start or serve still reaches the test (Err).
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		t.Fatalf("etcdtest: start etcd: %v", err)
	}
	t.Cleanup(e.Close)
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		t.Fatalf("etcdtest: etcd failed while starting: %v", err)
	case <-time.After(readyTimeout):
		e.Server.Stop()
		t.Fatalf("etcdtest: etcd not ready after %v", readyTimeout)
	}
	return "http://" + e.Clients[0].Addr().String()
}
