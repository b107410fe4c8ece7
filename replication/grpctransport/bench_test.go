package grpctransport

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/oncewal/oncewal/internal/leaderhook"
	"github.com/oncewal/oncewal/replication/inprocess"

	"github.com/oncewal/oncewal/store"

	"github.com/oncewal/oncewal/leader"

	"github.com/oncewal/oncewal/follower"
	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/sim"
	"github.com/oncewal/oncewal/wal"
)

// BenchmarkReplicate ships the same WAL (100k events from 100 sessions in
// batches of up to 512 events) from a Shipper to a fresh follower store over
// each transport and reports events/s end to end: WAL read, transport,
// receiver apply and Pebble commit. "nosync" commits without fsync, which
// leaves the transport as the visible difference; "sync" is the production
// default (fsync per batch). Run:
//
//	go test -run '^$' -bench Replicate -benchtime 5x ./replication/grpctransport/
func BenchmarkReplicate(b *testing.B) {
	walDir := filepath.Join(b.TempDir(), "leader")
	w, err := wal.OpenWriter(walDir, &wal.WriterOptions{Sync: wal.SyncManual})
	if err != nil {
		b.Fatal(err)
	}
	wl := recorded(b, sim.WorkloadOptions{Seed: 1, Sessions: 100, Requests: 100_000, BatchSize: 512})
	var last uint64
	for _, evs := range wl.Shards[0] {
		h, err := w.Append(1, evs)
		if err != nil {
			b.Fatal(err)
		}
		last = h.LastLSN()
	}
	if err := w.Close(); err != nil {
		b.Fatal(err)
	}
	transports := []struct {
		name string
		make func(b *testing.B) (replication.Listener, replication.Dialer, func())
	}{
		{"inprocess", func(*testing.B) (replication.Listener, replication.Dialer, func()) {
			t := inprocess.New(inprocess.FaultsNone, 1)
			return t, t, func() { t.Close() }
		}},
		{"grpc-insecure", func(b *testing.B) (replication.Listener, replication.Dialer, func()) {
			srv, err := Listen("127.0.0.1:0", &ServerOptions{Insecure: true, Logger: quietLogger()})
			if err != nil {
				b.Fatal(err)
			}
			d, err := NewDialer(srv.Addr().String(), &DialerOptions{Insecure: true, Logger: quietLogger()})
			if err != nil {
				b.Fatal(err)
			}
			return srv, d, func() { d.Close(); srv.Close() }
		}},
		{"grpc-mtls", func(b *testing.B) (replication.Listener, replication.Dialer, func()) {
			srv, d := mtls(b, nil)
			return srv, d, func() { d.Close(); srv.Close() }
		}},
	}
	for _, sync := range []bool{false, true} {
		for _, tr := range transports {
			name := fmt.Sprintf("%s/nosync", tr.name)
			if sync {
				name = fmt.Sprintf("%s/sync", tr.name)
			}
			b.Run(name, func(b *testing.B) {
				var elapsed time.Duration
				for i := 0; i < b.N; i++ {
					b.StopTimer()
					l, d, closeFn := tr.make(b)
					f, err := follower.Open(b.TempDir(), &follower.Options{Store: store.Options{Logger: quietLogger(), NoSync: !sync}})
					if err != nil {
						b.Fatal(err)
					}
					ship, err := leader.NewShipper(&leader.ShipperOptions{WALDir: walDir, Listener: l, PollInterval: time.Millisecond})
					if err != nil {
						b.Fatal(err)
					}
					ctx, cancel := context.WithCancel(context.Background())
					shipDone := make(chan struct{})
					go func() { defer close(shipDone); _ = ship.Run(ctx) }()
					b.StartTimer()
					start := time.Now()
					serveDone := make(chan struct{})
					go func() { defer close(serveDone); _ = f.Serve(ctx, d) }()
					if err := leaderhook.WaitAcked(ship, ctx, last); err != nil {
						b.Fatal(err)
					}
					elapsed += time.Since(start)
					b.StopTimer()
					cancel()
					<-serveDone
					<-shipDone
					if lsn, _ := f.Position(); lsn != last {
						b.Fatalf("follower at %d, want %d", lsn, last)
					}
					f.Close()
					closeFn()
					b.StartTimer()
				}
				b.ReportMetric(float64(last)*float64(b.N)/elapsed.Seconds(), "events/s")
				b.ReportMetric(0, "ns/op")
			})
		}
	}
}

// BenchmarkTransport isolates the link: the WAL's raw batches (same workload
// as BenchmarkReplicate) go LeaderConn.Send → FollowerConn.Recv, the
// follower acks each one, and the sender keeps up to 32 unacknowledged
// (the Shipper's default MaxInFlight). No store, no receiver.
func BenchmarkTransport(b *testing.B) {
	walDir := filepath.Join(b.TempDir(), "leader")
	w, err := wal.OpenWriter(walDir, &wal.WriterOptions{Sync: wal.SyncManual})
	if err != nil {
		b.Fatal(err)
	}
	wl := recorded(b, sim.WorkloadOptions{Seed: 1, Sessions: 100, Requests: 100_000, BatchSize: 512})
	for _, evs := range wl.Shards[0] {
		if _, err := w.Append(1, evs); err != nil {
			b.Fatal(err)
		}
	}
	w.Close()
	r, err := wal.OpenReader(walDir, 0)
	if err != nil {
		b.Fatal(err)
	}
	var batches [][]byte
	var events, bytes uint64
	for {
		h, buf, err := r.Next()
		if err != nil {
			break
		}
		batches = append(batches, append([]byte(nil), buf...))
		events += uint64(h.Count)
		bytes += uint64(len(buf))
	}
	r.Close()

	for _, name := range []string{"inprocess", "grpc-insecure", "grpc-mtls"} {
		b.Run(name, func(b *testing.B) {
			var l replication.Listener
			var d replication.Dialer
			switch name {
			case "inprocess":
				t := inprocess.New(inprocess.FaultsNone, 1)
				defer t.Close()
				l, d = t, t
			case "grpc-insecure":
				srv, err := Listen("127.0.0.1:0", &ServerOptions{Insecure: true, Logger: quietLogger()})
				if err != nil {
					b.Fatal(err)
				}
				defer srv.Close()
				dd, err := NewDialer(srv.Addr().String(), &DialerOptions{Insecure: true, Logger: quietLogger()})
				if err != nil {
					b.Fatal(err)
				}
				defer dd.Close()
				l, d = srv, dd
			case "grpc-mtls":
				l, d = mtls(b, nil)
			}
			ctx := context.Background()
			type acc struct {
				c   replication.LeaderConn
				err error
			}
			ch := make(chan acc, 1)
			go func() { c, _, err := l.Accept(ctx); ch <- acc{c, err} }()
			fc, err := d.Dial(ctx, replication.Ack{})
			if err != nil {
				b.Fatal(err)
			}
			a := <-ch
			if a.err != nil {
				b.Fatal(a.err)
			}
			lc := a.c
			defer lc.Close()
			defer fc.Close()
			// Follower: ack every batch with its last LSN.
			go func() {
				for {
					buf, err := fc.Recv(ctx)
					if err != nil {
						return
					}
					h, err := wal.DecodeHeader(buf)
					if err != nil {
						panic(err)
					}
					if fc.Send(ctx, replication.Ack{AppliedLSN: h.LastLSN()}) != nil {
						return
					}
				}
			}()
			b.ResetTimer()
			start := time.Now()
			for i := 0; i < b.N; i++ {
				inflight := 0
				acked := 0
				for _, buf := range batches {
					for inflight >= 32 {
						if _, err := lc.Recv(ctx); err != nil {
							b.Fatal(err)
						}
						inflight--
						acked++
					}
					if err := lc.Send(ctx, buf); err != nil {
						b.Fatal(err)
					}
					inflight++
				}
				for ; acked < len(batches); acked++ {
					if _, err := lc.Recv(ctx); err != nil {
						b.Fatal(err)
					}
				}
			}
			el := time.Since(start).Seconds()
			b.ReportMetric(float64(events)*float64(b.N)/el, "events/s")
			b.ReportMetric(float64(bytes)*float64(b.N)/el/1e6, "MB/s")
			b.ReportMetric(0, "ns/op")
		})
	}
}
