package idempotency_test

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/oncewal/oncewal/idempotency"
	"github.com/oncewal/oncewal/testutil"
)

// benchLedger opens a standalone ledger (default log: one synced Pebble
// batch per decision) on disk.
func benchLedger(b *testing.B) *idempotency.Ledger { return benchLedgerOn(b, "disk") }

// benchLedgerOn opens a standalone ledger on "disk" or in "mem"ory.
func benchLedgerOn(b *testing.B, medium string) *idempotency.Ledger {
	o, dir := testutil.DBOptions(vfs.Default), b.TempDir()
	if medium == "mem" {
		o.FS, dir = vfs.NewMem(), "db"
	}
	db := testutil.OpenDBWith(b, dir, o)
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

// BenchmarkLedgerExtend: one heartbeat of a held claim on the standalone
// ledger (one synced Pebble commit), on disk and in memory.
func BenchmarkLedgerExtend(b *testing.B) {
	for _, medium := range []string{"disk", "mem"} {
		b.Run(medium, func(b *testing.B) {
			l := benchLedgerOn(b, medium)
			c, err := l.Claim("ops", "held", []byte("p"))
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := l.Extend(c, 0); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkLedgerWaitingClaim: a duplicate waits (ClaimWith Wait) on a held
// key; the owner completes; the duplicate replays. handoff-us is the mean
// time from the owner's Complete call to the waiter's answer (the Complete's
// commit included); compare with a Complete alone (complete-us, measured in
// the same run on other keys). Each op also pays a fresh Claim and the wait
// for the waiter to park.
func BenchmarkLedgerWaitingClaim(b *testing.B) {
	for _, medium := range []string{"disk", "mem"} {
		b.Run(medium, func(b *testing.B) {
			l := benchLedgerOn(b, medium)
			payload := []byte("add 5")
			var handoff, complete time.Duration
			i := 0
			for b.Loop() {
				i++
				key := fmt.Sprint("k", i)
				owner, err := l.Claim("ops", key, payload)
				if err != nil {
					b.Fatal(err)
				}
				got := make(chan *idempotency.Claim, 1)
				go func() {
					c, err := l.ClaimWith(context.Background(), "ops", key, payload, idempotency.ClaimOptions{Wait: true})
					if err != nil {
						b.Error(err)
					}
					got <- c
				}()
				for l.Waiting() == 0 {
					runtime.Gosched()
				}
				start := time.Now()
				if err := l.Complete(owner, []byte("ok")); err != nil {
					b.Fatal(err)
				}
				if c := <-got; c == nil || c.Status != idempotency.Replay {
					b.Fatal("waiter did not replay")
				}
				handoff += time.Since(start)
				// The same Complete without a waiter, for comparison.
				alone, err := l.Claim("ops", key+"-alone", payload)
				if err != nil {
					b.Fatal(err)
				}
				start = time.Now()
				if err := l.Complete(alone, []byte("ok")); err != nil {
					b.Fatal(err)
				}
				complete += time.Since(start)
			}
			b.ReportMetric(float64(handoff.Microseconds())/float64(b.N), "handoff-us")
			b.ReportMetric(float64(complete.Microseconds())/float64(b.N), "complete-us")
		})
	}
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
