package wal

import (
	"fmt"
	"testing"

	"github.com/oncewal/oncewal/idempotency"
	"github.com/oncewal/oncewal/session"
)

// benchEvents is a typical leader batch: puts with a 24-byte key and a
// 100-byte value, seqnos in the thousands, an idempotency key, nanosecond
// timestamps.
func benchEvents(n int) []Event {
	evs := make([]Event, n)
	val := make([]byte, 100)
	for i := range evs {
		evs[i] = Event{
			Op: OpPut, Session: session.ID{byte(i), byte(i >> 8), 7}, Seq: session.SeqNo(10_000 + i),
			HasIdemKey: true, IdemKey: idempotency.Key{byte(i), 1}, Time: 1_767_225_600_000_000_000 + int64(i),
			Key: []byte(fmt.Sprintf("user/%019d", i)), Value: val,
		}
	}
	return evs
}

func BenchmarkEncodeBatch(b *testing.B) {
	evs := benchEvents(1000)
	buf, err := AppendBatch(nil, 1, 1, 1, evs)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(buf)))
	b.ReportAllocs()
	for b.Loop() {
		buf, _ = AppendBatch(buf[:0], 1, 1, 1, evs)
	}
	b.ReportMetric(float64(len(evs))*float64(b.N)/b.Elapsed().Seconds(), "events/s")
}

func BenchmarkDecodeBatch(b *testing.B) {
	buf, err := AppendBatch(nil, 1, 1, 1, benchEvents(1000))
	if err != nil {
		b.Fatal(err)
	}
	evs := make([]Event, 0, 1000)
	b.SetBytes(int64(len(buf)))
	b.ReportAllocs()
	for b.Loop() {
		if _, evs, err = DecodeBatch(buf, evs); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(1000*float64(b.N)/b.Elapsed().Seconds(), "events/s")
}

// BenchmarkWriterAppend appends 100-event batches (~16 KiB) to a log on
// disk in 64 MiB segments, with and without a sync per batch.
func BenchmarkWriterAppend(b *testing.B) {
	for _, sync := range []SyncPolicy{SyncManual, SyncEveryBatch} {
		name := map[SyncPolicy]string{SyncManual: "manual", SyncEveryBatch: "every_batch"}[sync]
		b.Run(name, func(b *testing.B) {
			w, err := OpenWriter(b.TempDir(), &WriterOptions{Sync: sync})
			if err != nil {
				b.Fatal(err)
			}
			defer w.Close()
			evs := benchEvents(100)
			b.SetBytes(int64(encodedBatchSize(b, evs)))
			b.ResetTimer()
			for b.Loop() {
				if _, err := w.Append(1, evs); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func encodedBatchSize(b *testing.B, evs []Event) int {
	buf, err := AppendBatch(nil, 0, 1, 1, evs)
	if err != nil {
		b.Fatal(err)
	}
	return len(buf)
}
