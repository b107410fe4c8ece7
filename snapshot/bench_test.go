package snapshot_test

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/oncewal/oncewal/internal/pki"
	"github.com/oncewal/oncewal/internal/rawdb"
	"github.com/oncewal/oncewal/store"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/oncewal/oncewal/follower"
	"github.com/oncewal/oncewal/replication/grpctransport"
	"github.com/oncewal/oncewal/sim"
	"github.com/oncewal/oncewal/snapshot"
)

// BenchmarkRebuild measures a rebuild on the OS filesystem beside the
// physical reference, a plain copy of the same snapshot's files on the same
// disk (read, write, fsync per file, fsync of the directory):
//
//	copy        the reference
//	inprocess   Donor → Fetch → Install, no throttle
//	grpc-mtls   the same through the Snapshot method over loopback mTLS
//
// MB/s is the snapshot's bytes per second; events/s is the events the
// donor store applied (its LSN) over the same time: what replaying the log
// would have to reach. ONCEWAL_SNAP_REQUESTS sets the workload (default
// 20000 requests).
//
//	go test ./snapshot -run '^$' -bench Rebuild -benchtime 5x
func BenchmarkRebuild(b *testing.B) {
	requests := 20000
	if s := os.Getenv("ONCEWAL_SNAP_REQUESTS"); s != "" {
		requests, _ = strconv.Atoi(s)
	}
	dir := b.TempDir()
	log, err := sim.Record(sim.GenerateWorkload(sim.WorkloadOptions{Seed: 1, Sessions: 200, Requests: requests, BatchSize: 64, RetryRate: 0.05}), 1)
	if err != nil {
		b.Fatal(err)
	}
	batches, err := log.Encode(0, 0, 1)
	if err != nil {
		b.Fatal(err)
	}
	so := &follower.Options{Store: store.Options{Logger: quiet}}
	src, err := follower.Open(filepath.Join(dir, "donor"), so)
	if err != nil {
		b.Fatal(err)
	}
	defer src.Close()
	for _, raw := range batches {
		if _, err := src.Apply(raw); err != nil {
			b.Fatal(err)
		}
	}
	if err := rawdb.Of(src).Flush(); err != nil {
		b.Fatal(err)
	}
	events, _ := src.Position()
	donor, err := snapshot.NewDonor(rawdb.Of(src), &snapshot.DonorOptions{FS: vfs.Default, Dir: filepath.Join(dir, "donor-snapshots"), Describe: store.Describe, RateLimit: -1})
	if err != nil {
		b.Fatal(err)
	}
	defer donor.Close()
	ref := filepath.Join(dir, "reference")
	m, err := snapshot.Create(rawdb.Of(src), vfs.Default, ref, store.Describe)
	if err != nil {
		b.Fatal(err)
	}
	want := snapshot.Want{Shard: 0, Identity: store.IdentityString(&so.Store), Describe: store.Describe}
	opts := &snapshot.Options{RateLimit: -1}
	report := func(b *testing.B, start time.Time) {
		b.SetBytes(m.Bytes())
		b.ReportMetric(float64(events)*float64(b.N)/time.Since(start).Seconds(), "events/s")
	}

	b.Run("copy", func(b *testing.B) {
		start := time.Now()
		for i := range b.N {
			copyDir(b, ref, filepath.Join(dir, "copy-"+strconv.Itoa(i)), m)
		}
		report(b, start)
	})
	b.Run("inprocess", func(b *testing.B) {
		start := time.Now()
		for i := range b.N {
			if _, _, err := snapshot.Rebuild(context.Background(), donor, vfs.Default, filepath.Join(dir, "inprocess-"+strconv.Itoa(i)), want, opts); err != nil {
				b.Fatal(err)
			}
		}
		report(b, start)
	})
	b.Run("grpc-mtls", func(b *testing.B) {
		certs, err := pki.GenerateCerts([]string{"127.0.0.1"}, time.Hour)
		if err != nil {
			b.Fatal(err)
		}
		leaderPair, err := certs.LeaderPair()
		if err != nil {
			b.Fatal(err)
		}
		followerPair, err := certs.FollowerPair()
		if err != nil {
			b.Fatal(err)
		}
		st := grpctransport.ServerTLSConfig(certs.CA.Pool(), leaderPair)
		ct := grpctransport.ClientTLSConfig(certs.CA.Pool(), followerPair, "")
		srv, err := grpctransport.Listen("127.0.0.1:0", &grpctransport.ServerOptions{TLS: st, Logger: quiet,
			Snapshots: func(uint32) snapshot.Source { return donor }})
		if err != nil {
			b.Fatal(err)
		}
		defer srv.Close()
		client, err := grpctransport.NewSnapshotClient(srv.Addr().String(), &grpctransport.DialerOptions{TLS: ct, Logger: quiet})
		if err != nil {
			b.Fatal(err)
		}
		defer client.Close()
		start := time.Now()
		for i := range b.N {
			if _, _, err := snapshot.Rebuild(context.Background(), client, vfs.Default, filepath.Join(dir, "grpc-"+strconv.Itoa(i)), want, opts); err != nil {
				b.Fatal(err)
			}
		}
		report(b, start)
	})
}

// copyDir is the physical reference: each file read and written whole,
// fsynced, then the directory.
func copyDir(b *testing.B, from, to string, m snapshot.Manifest) {
	if err := os.MkdirAll(to, 0o755); err != nil {
		b.Fatal(err)
	}
	for _, f := range m.Files {
		in, err := os.Open(filepath.Join(from, f.Name))
		if err != nil {
			b.Fatal(err)
		}
		out, err := os.Create(filepath.Join(to, f.Name))
		if err != nil {
			b.Fatal(err)
		}
		if _, err := io.Copy(out, in); err != nil {
			b.Fatal(err)
		}
		in.Close()
		if err := out.Sync(); err != nil {
			b.Fatal(err)
		}
		out.Close()
	}
	d, err := os.Open(to)
	if err != nil {
		b.Fatal(err)
	}
	if err := d.Sync(); err != nil {
		b.Fatal(err)
	}
	d.Close()
}
