package grpctransport

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/oncewal/oncewal/store"
	"github.com/oncewal/oncewal/testutil"

	"github.com/oncewal/oncewal/internal/pki"
	"github.com/oncewal/oncewal/internal/rawdb"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/oncewal/oncewal/follower"
	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/sim"
	"github.com/oncewal/oncewal/snapshot"
	"github.com/stretchr/testify/require"
)

// TestSnapshotOverMutualTLS rebuilds a store from a donor through the
// Snapshot method over mutual TLS, through a proxy that keeps breaking the
// connection: the fetch resumes each file where the break left it, every
// checksum holds, and the rebuilt store is the donor's cut. A client
// without a certificate the server trusts gets nothing, and neither does a
// trusted certificate naming a client (only a replica may download a
// store): replication.ErrIdentityMismatch, saying why.
func TestSnapshotOverMutualTLS(t *testing.T) {
	quiet := slog.New(slog.DiscardHandler)
	fs := vfs.NewMem()
	so := &follower.Options{Store: store.Options{FS: fs, Logger: quiet, PebbleOptions: func(o *pebble.Options) { o.MemTableSize = 256 << 10 }}}
	log, err := sim.Record(sim.GenerateWorkload(sim.WorkloadOptions{Seed: 4, Sessions: 8, Requests: 2000, BatchSize: 20, RetryRate: 0.1}), 1)
	require.NoError(t, err)
	batches, err := log.Encode(0, 0, 1)
	require.NoError(t, err)
	src, err := follower.Open("/donor", so)
	require.NoError(t, err)
	defer src.Close()
	for _, raw := range batches {
		_, err := src.Apply(raw)
		require.NoError(t, err)
	}
	// Sstables too, not only a WAL: the transfer carries every kind of file.
	require.NoError(t, rawdb.Of(src).Flush())
	donor, err := snapshot.NewDonor(rawdb.Of(src), &snapshot.DonorOptions{FS: fs, Dir: "/donor-snapshots", Describe: store.Describe, RateLimit: -1, IdleTimeout: time.Second})
	require.NoError(t, err)
	defer donor.Close()

	certs, err := pki.GenerateCerts([]string{"127.0.0.1"}, time.Hour)
	require.NoError(t, err)
	st, ct := tlsPair(t, certs)
	// Shard 2's donor is closed: its owner refuses every Begin.
	errOwnerClosed := errors.New("test: owner closed")
	closed, err := snapshot.NewDonor(rawdb.Of(src), &snapshot.DonorOptions{FS: fs, Dir: "/closed-snapshots", Describe: store.Describe,
		Hold: func() (func(), error) { return nil, errOwnerClosed }})
	require.NoError(t, err)
	srv, err := Listen("127.0.0.1:0", &ServerOptions{TLS: st, Logger: quiet, Snapshots: func(shard uint32) snapshot.Source {
		switch shard {
		case 0:
			return donor
		case 2:
			return closed
		}
		return nil
	}})
	require.NoError(t, err)
	defer srv.Close()
	proxy := testutil.NewFaultProxy(t, srv.Addr().String(), 7, testutil.ProxyFaults{Drop: 0.01, Chunk: 16 << 10})
	defer proxy.Close()
	client, err := NewSnapshotClient(proxy.Addr(), &DialerOptions{TLS: ct, Logger: quiet, ConnectTimeout: 2 * time.Second})
	require.NoError(t, err)
	defer client.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	want := snapshot.Want{Shard: 0, Identity: store.IdentityString(&so.Store), Describe: store.Describe}
	m, stats, err := snapshot.Rebuild(ctx, client, fs, "/rebuilt", want, &snapshot.Options{ChunkSize: 32 << 10, RetryBackoff: time.Millisecond, Retries: 50})
	require.NoError(t, err)
	lsn, _ := src.Position()
	require.Equal(t, lsn, m.Cut.AppliedLSN)
	t.Logf("%d bytes in %d files over mTLS through a breaking proxy: %d reads retried, %d restarts", stats.Bytes, stats.Files, stats.Retries, stats.Restarts)
	f, err := follower.Open("/rebuilt", so)
	require.NoError(t, err)
	require.NoError(t, log.Oracle.Verify(f.State()))
	require.NoError(t, f.Close())
	// Released by End, or — a begin whose answer the proxy dropped — by
	// the retry's BeginFor for the same holder (or, a begin still running
	// when its retry arrived, by the idle timeout).
	require.Eventually(t, func() bool { return donor.Serving() == 0 }, 5*time.Second, 10*time.Millisecond)

	// The holder crosses the wire: a second Begin for the same holder
	// releases the first (a lost answer, a restarted fetcher).
	direct, err := NewSnapshotClient(srv.Addr().String(), &DialerOptions{TLS: ct, Logger: quiet, ConnectTimeout: 2 * time.Second})
	require.NoError(t, err)
	defer direct.Close()
	superseded := donor.Stats().Superseded
	_, err = direct.BeginFor(ctx, 0, "f1/shard-0000")
	require.NoError(t, err)
	held, err := direct.BeginFor(ctx, 0, "f1/shard-0000")
	require.NoError(t, err)
	require.Equal(t, 1, donor.Serving())
	require.Equal(t, superseded+1, donor.Stats().Superseded)
	require.NoError(t, direct.End(ctx, held.ID))
	require.Zero(t, donor.Serving())

	// A closed client answers the package's ErrClosed (the contract's
	// replication.ErrClosed) without a call to the server.
	closedClient, err := NewSnapshotClient(srv.Addr().String(), &DialerOptions{TLS: ct, Logger: quiet, ConnectTimeout: 2 * time.Second})
	require.NoError(t, err)
	require.NoError(t, closedClient.Close())
	_, err = closedClient.BeginFor(ctx, 0, "f1/shard-0000")
	require.ErrorIs(t, err, ErrClosed)
	require.ErrorIs(t, err, replication.ErrClosed)
	require.NoError(t, closedClient.Close(), "Close is idempotent")

	// Another shard: the server donates none.
	_, _, err = snapshot.Fetch(ctx, client, fs, "/other", snapshot.Want{Shard: 1}, nil)
	require.ErrorIs(t, err, snapshot.ErrMismatch)

	// A closed donor crosses the wire as snapshot.ErrClosed, and the fetch
	// does not retry its Begin.
	_, fst, err := snapshot.Fetch(ctx, direct, fs, "/other", snapshot.Want{Shard: 2}, nil)
	require.ErrorIs(t, err, snapshot.ErrClosed)
	require.Zero(t, fst.Retries, "the fetch retried a closed donor's Begin")

	// A client the server does not trust.
	other, err := pki.GenerateCerts([]string{"127.0.0.1"}, time.Hour)
	require.NoError(t, err)
	_, badCT := tlsPair(t, other)
	stranger, err := NewSnapshotClient(srv.Addr().String(), &DialerOptions{TLS: badCT, Logger: quiet, ConnectTimeout: time.Second})
	require.NoError(t, err)
	defer stranger.Close()
	sctx, scancel := context.WithTimeout(ctx, 3*time.Second)
	defer scancel()
	_, err = stranger.Begin(sctx, 0)
	require.Error(t, err)
	require.Zero(t, donor.Serving())

	// A client's certificate of the same CA: refused, with the reason.
	app, err := NewSnapshotClient(srv.Addr().String(), &DialerOptions{TLS: identityTLS(t, certs, pki.RoleClient, "app1"), Logger: quiet, ConnectTimeout: time.Second})
	require.NoError(t, err)
	defer app.Close()
	_, err = app.BeginFor(ctx, 0, "app1")
	require.ErrorIs(t, err, replication.ErrIdentityMismatch)
	require.ErrorContains(t, err, "certificate names client app1: only a node or a follower may fetch a snapshot")
	_, err = app.Read(ctx, held.ID, "MANIFEST", 0, make([]byte, 16))
	require.ErrorIs(t, err, replication.ErrIdentityMismatch, "a read without a begin is refused too")
	require.Zero(t, donor.Serving())
	require.EqualValues(t, 2, srv.Stats().RefusedIdentity)
}

// TestServiceServerServesSnapshots: a ServiceServer given Snapshots (a
// follower node that lets a peer catch a shard up from it) serves them as a
// Server does — the rebuilt store is the donor's cut — and refuses a
// replication stream (Unimplemented: it leads nothing).
func TestServiceServerServesSnapshots(t *testing.T) {
	quiet := slog.New(slog.DiscardHandler)
	fs := vfs.NewMem()
	so := &follower.Options{Store: store.Options{FS: fs, Logger: quiet}}
	log, err := sim.Record(sim.GenerateWorkload(sim.WorkloadOptions{Seed: 5, Sessions: 4, Requests: 200, BatchSize: 20}), 1)
	require.NoError(t, err)
	batches, err := log.Encode(0, 0, 1)
	require.NoError(t, err)
	src, err := follower.Open("/donor", so)
	require.NoError(t, err)
	defer src.Close()
	for _, raw := range batches {
		_, err := src.Apply(raw)
		require.NoError(t, err)
	}
	donor, err := snapshot.NewDonor(rawdb.Of(src), &snapshot.DonorOptions{FS: fs, Dir: "/donor-snapshots", Describe: store.Describe, RateLimit: -1})
	require.NoError(t, err)
	defer donor.Close()
	srv, err := ListenServices("127.0.0.1:0", &ServerOptions{Insecure: true, Logger: quiet,
		Snapshots: func(uint32) snapshot.Source { return donor }})
	require.NoError(t, err)
	defer srv.Close()
	client, err := NewSnapshotClient(srv.Addr().String(), &DialerOptions{Insecure: true, Logger: quiet})
	require.NoError(t, err)
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	want := snapshot.Want{Shard: 0, Identity: store.IdentityString(&so.Store), Describe: store.Describe}
	m, _, err := snapshot.Rebuild(ctx, client, fs, "/rebuilt", want, nil)
	require.NoError(t, err)
	lsn, _ := src.Position()
	require.Equal(t, lsn, m.Cut.AppliedLSN)

	d, err := NewDialer(srv.Addr().String(), &DialerOptions{Insecure: true, Logger: quiet, ConnectTimeout: 2 * time.Second})
	require.NoError(t, err)
	_, err = d.Dial(ctx, replication.Ack{Shard: 0, FollowerID: "f1"})
	require.Error(t, err, "a replication stream to a server that leads nothing")
}
