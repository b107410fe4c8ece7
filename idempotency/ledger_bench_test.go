package idempotency_test

import (
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/cockroachdb/pebble/v2"

	"github.com/oncewal/oncewal/idempotency"
)

// benchLedger opens a standalone ledger (default log: one synced Pebble
// batch per decision) on disk.
func benchLedger(b *testing.B) *idempotency.Ledger {
	db, err := pebble.Open(b.TempDir(), &pebble.Options{FormatMajorVersion: pebble.FormatNewest, Logger: quietPebble{}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = db.Close() })
	t, err := idempotency.OpenLedgerTable(db, nil)
	if err != nil {
		b.Fatal(err)
	}
	l, err := idempotency.OpenLedger(t, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = l.Close() })
	return l
}

var benchSeq atomic.Int64

// BenchmarkLedgerClaimComplete: one request's ledger work (a fresh Claim
// and its Complete, two synced commits) — the standalone ledger's cost per
// request. Parallel runs 8 goroutines per CPU on distinct keys.
func BenchmarkLedgerClaimComplete(b *testing.B) {
	payload := []byte(`{"op":"add","key":"balance","delta":5}`)
	outcome := []byte(`{"balance":105}`)
	one := func(l *idempotency.Ledger) {
		key := fmt.Sprintf("req-%d", benchSeq.Add(1))
		c, err := l.Claim("ops", key, payload)
		if err != nil || c.Status != idempotency.Fresh {
			b.Fatal(err, c)
		}
		if err := l.Complete(c, outcome); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("serial", func(b *testing.B) {
		l := benchLedger(b)
		for b.Loop() {
			one(l)
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
	})
	b.Run("parallel", func(b *testing.B) {
		l := benchLedger(b)
		b.SetParallelism(8)
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				one(l)
			}
		})
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
	})
}

// BenchmarkLedgerReplay: a retry of a completed request (read path, no log).
func BenchmarkLedgerReplay(b *testing.B) {
	l := benchLedger(b)
	payload := []byte("add 5")
	c, err := l.Claim("ops", "k", payload)
	if err != nil {
		b.Fatal(err)
	}
	if err := l.Complete(c, []byte("balance=105")); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		r, err := l.Claim("ops", "k", payload)
		if err != nil || r.Status != idempotency.Replay {
			b.Fatal(err)
		}
	}
}

// BenchmarkFingerprint: BLAKE3-256 of a request payload.
func BenchmarkFingerprint(b *testing.B) {
	for _, n := range []int{64, 1024, 16 << 10} {
		p := make([]byte, n)
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			b.SetBytes(int64(n))
			b.ReportAllocs()
			for b.Loop() {
				_ = idempotency.FingerprintOf(p)
			}
		})
	}
}

type quietPebble struct{}

func (quietPebble) Infof(string, ...any)  {}
func (quietPebble) Errorf(string, ...any) {}
func (quietPebble) Fatalf(format string, args ...any) {
	panic(fmt.Sprintf(format, args...))
}
