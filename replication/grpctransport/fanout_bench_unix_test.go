//go:build unix

package grpctransport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/oncewal/oncewal/store"

	"github.com/oncewal/oncewal/leader"

	"github.com/oncewal/oncewal/follower"
	"github.com/oncewal/oncewal/internal/leaderhook"
	"github.com/oncewal/oncewal/internal/pki"
	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/wal"
)

// cpuTime is the process's user+system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// benchChildEnv carries the follower process's orders: the certificate
// directory, then per leader "address=id,id,…", separated by "|".
const benchChildEnv = "ONCEWAL_FANOUT_BENCH_CHILD"

// TestFanoutBenchFollowerProcess is not a test: it is the follower process
// of BenchmarkFanoutLeaderCPU (skipped unless that benchmark started it).
// It runs minimal followers — ack each batch that continues the position —
// until its stdin closes, so that the benchmark's process CPU is the
// leaders' alone.
func TestFanoutBenchFollowerProcess(t *testing.T) {
	orders := os.Getenv(benchChildEnv)
	if orders == "" {
		t.Skip("follower process of BenchmarkFanoutLeaderCPU")
	}
	parts := strings.Split(orders, "|")
	dir := parts[0]
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _, _ = io.Copy(io.Discard, os.Stdin); cancel() }()
	var wg sync.WaitGroup
	for _, p := range parts[1:] {
		addr, ids, _ := strings.Cut(p, "=")
		for _, id := range strings.Split(ids, ",") {
			// Each follower dials with the certificate naming its ID.
			cert, key := pki.FollowerFiles(id)
			tlsConf, err := LoadClientTLS(filepath.Join(dir, pki.FileCA), filepath.Join(dir, cert), filepath.Join(dir, key))
			if err != nil {
				t.Fatal(err)
			}
			d, err := NewDialer(addr, &DialerOptions{TLS: tlsConf, Logger: quietLogger()})
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			wg.Go(func() { ackFollower(ctx, d, id) })
		}
	}
	wg.Wait()
}

// ackFollower applies nothing: it acknowledges every batch that continues
// its position and refuses the others, as a receiver's position gate does.
func ackFollower(ctx context.Context, d replication.Dialer, id string) {
	var applied uint64
	for ctx.Err() == nil {
		c, err := d.Dial(ctx, replication.Ack{FollowerID: id, AppliedLSN: applied})
		if err != nil {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		for {
			b, err := c.Recv(ctx)
			if err != nil {
				break
			}
			h, err := wal.DecodeHeader(b)
			if err != nil {
				break
			}
			refused := h.FirstLSN > applied+1
			if !refused && h.LastLSN() > applied {
				applied = h.LastLSN()
			}
			if c.Send(ctx, replication.Ack{AppliedLSN: applied, Refused: refused}) != nil {
				break
			}
		}
		c.Close()
	}
}

// benchLeader is one leader of shard 0 with a Fanout on its own mTLS server.
type benchLeader struct {
	srv     *Server
	fo      *leader.Fanout
	r       *wal.Reader
	ids     []string
	append  func(evs []wal.Event) (wal.Header, error)
	close   func()
	cancel  context.CancelFunc
	done    chan error
	cpu     time.Duration
	events  uint64
	lastLSN uint64
}

func newBenchLeader(b *testing.B, kind string, followers int) *benchLeader {
	b.Helper()
	dir := b.TempDir()
	walDir := filepath.Join(dir, "wal")
	l := &benchLeader{}
	var durable func() uint64
	epoch := func() uint64 { return 1 }
	switch kind {
	case "ledgerlog":
		// The leader as it runs today: stamping, the WAL synced per batch,
		// and the local store applying every batch.
		f, err := follower.Open(filepath.Join(dir, "store"), &follower.Options{Store: store.Options{Logger: quietLogger()}})
		if err != nil {
			b.Fatal(err)
		}
		ll, err := leader.Promote(retire(b, f), leader.PromoteOptions{WALDir: walDir})
		if err != nil {
			b.Fatal(err)
		}
		l.append = func(evs []wal.Event) (wal.Header, error) { return ll.Append(evs...) }
		l.close = func() { ll.Close(); f.Close() }
		durable, epoch = ll.Writer().DurableLSN, ll.Epoch
	case "wal":
		// Only the WAL (synced per batch): the shipping cost stands out.
		w, err := wal.OpenWriter(walDir, nil)
		if err != nil {
			b.Fatal(err)
		}
		l.append = func(evs []wal.Event) (wal.Header, error) { return w.Append(1, evs) }
		l.close = func() { w.Close() }
		durable = w.DurableLSN
	}
	var err error
	if l.r, err = wal.OpenReader(walDir, 0); err != nil {
		b.Fatal(err)
	}
	st, err := serverTLS(certs(b))
	if err != nil {
		b.Fatal(err)
	}
	if l.srv, err = Listen("127.0.0.1:0", &ServerOptions{TLS: st, Logger: quietLogger()}); err != nil {
		b.Fatal(err)
	}
	for i := range followers {
		l.ids = append(l.ids, fmt.Sprintf("f%d", i+1)) // testCerts' followers
	}
	l.fo, err = leader.NewFanout(&leader.FanoutOptions{
		ShipperOptions: leader.ShipperOptions{WALDir: walDir, Listener: l.srv, DurableLSN: durable, Epoch: epoch},
		Followers:      l.ids,
	})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	l.cancel, l.done = cancel, make(chan error, 1)
	go func() { l.done <- l.fo.Run(ctx) }()
	return l
}

// round appends n batches, hands each to the Fanout as a leader's append
// hook would, and waits until every follower acknowledged them; it adds the
// process CPU this took to l.cpu.
func (l *benchLeader) round(b *testing.B, batches [][]wal.Event) {
	start := cpuTime()
	for _, evs := range batches {
		h, err := l.append(evs)
		if err != nil {
			b.Fatal(err)
		}
		_, raw, err := l.r.Next()
		if err != nil {
			b.Fatal(err)
		}
		l.fo.Appended(h, raw)
		l.events += uint64(h.Count)
		l.lastLSN = h.LastLSN()
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := leaderhook.WaitAcked(l.fo, ctx, l.lastLSN); err != nil {
		b.Fatalf("WaitAcked: %v; %+v", err, l.fo.Stats())
	}
	l.cpu += cpuTime() - start
}

func (l *benchLeader) stop() {
	l.cancel()
	<-l.done
	l.srv.Close()
	l.r.Close()
	l.close()
}

// BenchmarkFanoutLeaderCPU measures the leader's CPU per event with one and
// with three followers of its shard, over gRPC with mutual TLS on loopback.
// Two leaders run in this process — one with one follower, one with three —
// and take turns (rounds of 20 batches of 100 events, each round waited for
// with AckAll), so both see the same machine; the followers run in a child
// process, so the process CPU measured is the leaders' alone. Each appended
// batch reaches its Fanout through Appended (read back from the WAL here; a
// leader's append hook hands over the bytes it wrote). Reported: CPU per
// appended event for 1 and 3 followers, their ratio (target ≤ 1.3), and the
// CPU each additional follower costs per event. leader=ledgerlog is the
// leader as it runs today (stamping, synced WAL, local store);
// leader=wal is a bare synced WAL, where shipping is most of the work.
//
//	go test -run '^$' -bench FanoutLeaderCPU -benchtime 2000x ./replication/grpctransport/
func BenchmarkFanoutLeaderCPU(b *testing.B) {
	certDir := filepath.Join(b.TempDir(), "certs")
	if err := certs(b).WriteDir(certDir); err != nil {
		b.Fatal(err)
	}
	ids := make([]session.ID, 64)
	for i := range ids {
		ids[i] = session.NewID()
	}
	value := []byte(strings.Repeat("v", 100))
	for _, kind := range []string{"ledgerlog", "wal"} {
		b.Run("leader="+kind, func(b *testing.B) {
			one, three := newBenchLeader(b, kind, 1), newBenchLeader(b, kind, 3)
			defer one.stop()
			defer three.stop()
			orders := certDir
			for _, l := range []*benchLeader{one, three} {
				orders += "|" + l.srv.Addr().String() + "=" + strings.Join(l.ids, ",")
			}
			child := exec.Command(os.Args[0], "-test.run=^TestFanoutBenchFollowerProcess$")
			child.Env = append(os.Environ(), benchChildEnv+"="+orders)
			child.Stdout, child.Stderr = io.Discard, os.Stderr
			stdin, err := child.StdinPipe()
			if err != nil {
				b.Fatal(err)
			}
			if err := child.Start(); err != nil {
				b.Fatal(err)
			}
			defer func() {
				stdin.Close()
				if err := child.Wait(); err != nil && !errors.Is(err, context.Canceled) {
					b.Logf("follower process: %v", err)
				}
			}()

			seqs := map[session.ID]session.SeqNo{}
			batch := func() []wal.Event {
				evs := make([]wal.Event, 100)
				for i := range evs {
					id := ids[i%len(ids)]
					evs[i] = wal.Event{Op: wal.OpPut, Session: id, Key: []byte(fmt.Sprintf("key-%04d", i)), Value: value}
					if kind == "wal" { // the ledger log stamps SeqNo and time itself
						seqs[id]++
						evs[i].Seq, evs[i].Time = seqs[id], time.Now().UnixNano()
					}
				}
				return evs
			}
			const perRound = 20
			rounds := func(n int) [][]wal.Event {
				out := make([][]wal.Event, n)
				for i := range out {
					out[i] = batch()
				}
				return out
			}
			// Warm up: connections made, caches and pools filled.
			for _, l := range []*benchLeader{one, three} {
				l.round(b, rounds(perRound))
				l.cpu, l.events = 0, 0
			}
			b.ResetTimer()
			for done := 0; done < b.N; done += perRound {
				n := min(perRound, b.N-done)
				one.round(b, rounds(n))
				three.round(b, rounds(n))
			}
			b.StopTimer()
			per1 := float64(one.cpu.Nanoseconds()) / float64(one.events)
			per3 := float64(three.cpu.Nanoseconds()) / float64(three.events)
			b.ReportMetric(per1, "cpu-ns/event-1f")
			b.ReportMetric(per3, "cpu-ns/event-3f")
			b.ReportMetric(per3/per1, "ratio-3f/1f")
			b.ReportMetric((per3-per1)/2, "cpu-ns/event/extra-follower")
			for _, l := range []*benchLeader{one, three} {
				for _, f := range l.fo.Stats().Followers {
					if f.DiskReads != 0 {
						b.Logf("%d followers: %s read %d batches from the WAL", len(l.ids), f.ID, f.DiskReads)
					}
				}
			}
		})
	}
}

// retire hands f's store over for a promotion (follower.Follower.Retire).
func retire(t testing.TB, f *follower.Follower) *store.Store {
	t.Helper()
	st, err := f.Retire()
	if err != nil {
		t.Fatal(err)
	}
	return st
}
