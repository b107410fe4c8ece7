package leader

import (
	"errors"
	"fmt"
	"io/fs"
	"testing"

	"github.com/oncewal/oncewal/replication"

	"github.com/oncewal/oncewal/wal"
)

// memHelloLog is a HelloLog over a memLog.
type memHelloLog struct {
	m   *memLog
	b   EpochBoundary
	err error // returned by BatchEndingAt when set
}

func (l memHelloLog) Retained() (first, last uint64) {
	l.m.mu.Lock()
	defer l.m.mu.Unlock()
	if len(l.m.heads) == 0 {
		return l.m.next, l.m.next - 1
	}
	return l.m.heads[0].FirstLSN, l.m.next - 1
}

func (l memHelloLog) BatchEndingAt(lsn uint64) (wal.BatchRef, bool, error) {
	if l.err != nil {
		return wal.BatchRef{}, false, l.err
	}
	r, _ := l.m.open()
	return FindBatchEndingAt(r, lsn)
}

func (l memHelloLog) Boundary() EpochBoundary { return l.b }

// refOf encodes a one-event batch ending at lsn and returns its identity;
// value tells histories written under the same epoch apart.
func refOf(t *testing.T, epoch, lsn uint64, value string) wal.BatchRef {
	t.Helper()
	b, err := wal.AppendBatch(nil, 2, epoch, lsn, []wal.Event{{Op: wal.OpPut, Seq: 1, Key: []byte("k"), Value: []byte(value)}})
	if err != nil {
		t.Fatal(err)
	}
	ref, err := wal.BatchRefOf(b)
	if err != nil {
		t.Fatal(err)
	}
	return ref
}

// TestCheckHello: the table of CheckHello's rules, on the scenario —
// a leader promoted at epoch 2 whose log starts at 4291, continuing a history
// whose batch ending at 4290 was written by leader X under epoch 1 — and on
// an untrimmed and a retention-trimmed log.
func TestCheckHello(t *testing.T) {
	promoted := newMemLog(2)
	promoted.next = 4291
	for i := 0; i < 5; i++ {
		promoted.append(t, 2, 2) // batches ending at 4292, 4294, …, 4300
	}
	refAt := func(m *memLog, lsn uint64) wal.BatchRef {
		r, _ := m.open()
		ref, ok, err := FindBatchEndingAt(r, lsn)
		if err != nil || !ok {
			t.Fatalf("no batch ends at %d: %v", lsn, err)
		}
		return ref
	}
	x4290 := refOf(t, 1, 4290, "leader X")
	y4290 := refOf(t, 1, 4290, "deposed leader Y") // same epoch, other history
	r4294 := refAt(promoted, 4294)
	boundary := EpochBoundary{Epoch: 2, StartLSN: 4291, Prev: x4290}
	atPromoted := memHelloLog{m: promoted, b: boundary}
	unknownBoundary := memHelloLog{m: promoted, b: EpochBoundary{Epoch: 2, StartLSN: 4291}}

	untrimmed := newMemLog(2)
	for i := 0; i < 3; i++ {
		untrimmed.append(t, 1, 2) // 1-2, 3-4, 5-6
	}
	atUntrimmed := memHelloLog{m: untrimmed, b: EpochBoundary{Epoch: 1, StartLSN: 1}}
	trimmed := newMemLog(2)
	trimmed.next = 100
	trimmed.append(t, 1, 2) // 100-101; LSNs below 100 deleted by retention
	atTrimmed := memHelloLog{m: trimmed, b: EpochBoundary{Epoch: 1, StartLSN: 1}}

	errDisk := errors.New("disk on fire")
	hello := func(epoch, applied uint64, last wal.BatchRef) replication.Ack {
		return replication.Ack{Shard: 2, FollowerID: "f", Epoch: epoch, AppliedLSN: applied, LastBatch: last}
	}
	for _, c := range []struct {
		name  string
		log   HelloLog
		hello replication.Ack
		want  error // nil: served
	}{
		{"aligned boundary, same history", atPromoted, hello(1, 4290, x4290), nil},
		{"aligned boundary, other history of the same epoch", atPromoted, hello(1, 4290, y4290), replication.ErrDiverged},
		{"aligned boundary, other epoch", atPromoted, hello(1, 4290, wal.BatchRef{Epoch: 2, CRC: x4290.CRC}), replication.ErrDiverged},
		{"aligned boundary, boundary unrecorded", unknownBoundary, hello(1, 4290, x4290), replication.ErrBehindRetention},
		{"aligned boundary, old store (epoch rule cannot see it)", atPromoted, hello(1, 4290, wal.BatchRef{}), nil},
		{"inside the log, same batch", atPromoted, hello(2, 4294, r4294), nil},
		{"inside the log, at its end", atPromoted, hello(2, 4300, refAt(promoted, 4300)), nil},
		{"inside the log, other CRC", atPromoted, hello(2, 4294, wal.BatchRef{Epoch: 2, CRC: r4294.CRC + 1}), replication.ErrDiverged},
		{"inside the log, other epoch", atPromoted, hello(2, 4294, wal.BatchRef{Epoch: 1, CRC: r4294.CRC}), replication.ErrDiverged},
		{"inside the log, not at a batch end", atPromoted, hello(2, 4293, r4294), replication.ErrDiverged},
		{"ahead of the log", atPromoted, hello(2, 4301, r4294), replication.ErrDiverged},
		{"ahead of the log, old store", atPromoted, hello(2, 4301, wal.BatchRef{}), replication.ErrDiverged},
		{"below the log", atPromoted, hello(1, 4289, x4290), replication.ErrBehindRetention},
		{"nothing applied, log starts later", atPromoted, hello(0, 0, wal.BatchRef{}), replication.ErrBehindRetention},
		{"old store, applied the deposed epoch's LSNs", atPromoted, hello(1, 4294, wal.BatchRef{}), replication.ErrDiverged},
		{"old store, current epoch", atPromoted, hello(2, 4294, wal.BatchRef{}), nil},
		{"old store, below the log", atPromoted, hello(1, 4000, wal.BatchRef{}), replication.ErrBehindRetention},
		{"nothing applied, log starts at 1", atUntrimmed, hello(0, 0, wal.BatchRef{}), nil},
		{"untrimmed, same batch", atUntrimmed, hello(1, 4, refAt(untrimmed, 4)), nil},
		{"untrimmed, ahead", atUntrimmed, hello(1, 7, refAt(untrimmed, 6)), replication.ErrDiverged},
		{"trimmed, just below (nothing recorded)", atTrimmed, hello(1, 99, refOf(t, 1, 99, "v")), replication.ErrBehindRetention},
		{"trimmed, old store just below", atTrimmed, hello(1, 99, wal.BatchRef{}), nil},
		{"trimmed, inside", atTrimmed, hello(1, 101, refAt(trimmed, 101)), nil},
	} {
		err := CheckHello(c.hello, c.log)
		if (c.want == nil) != (err == nil) || (c.want != nil && !errors.Is(err, c.want)) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
	err := CheckHello(hello(2, 4294, r4294), memHelloLog{m: promoted, b: boundary, err: errDisk})
	if !errors.Is(err, errDisk) || errors.Is(err, replication.ErrDiverged) || errors.Is(err, replication.ErrBehindRetention) {
		t.Errorf("read error: %v", err)
	}
}

func TestFindBatchEndingAt(t *testing.T) {
	m := newMemLog(0)
	m.append(t, 1, 3) // 1-3
	m.append(t, 1, 2) // 4-5
	for lsn, want := range map[uint64]bool{0: false, 1: false, 3: true, 4: false, 5: true, 6: false} {
		r, _ := m.open()
		ref, ok, err := FindBatchEndingAt(r, lsn)
		if err != nil || ok != want || ok == ref.IsZero() {
			t.Errorf("lsn %d: %v %v %v", lsn, ref, ok, err)
		}
	}
	r, _ := m.open()
	ref, _, _ := FindBatchEndingAt(r, 5)
	if want, _ := wal.BatchRefOf(m.batches[1]); ref != want {
		t.Errorf("ref %v, want %v", ref, want)
	}
}

// trimmingHelloLog is a memHelloLog whose retention deletes the start of
// the log while a hello is being checked: between Retained and the read.
type trimmingHelloLog struct {
	memHelloLog
	to uint64 // the log's first LSN once trimmed
}

func (l trimmingHelloLog) BatchEndingAt(lsn uint64) (wal.BatchRef, bool, error) {
	l.m.mu.Lock()
	for len(l.m.heads) > 0 && l.m.heads[0].FirstLSN < l.to {
		l.m.heads, l.m.batches = l.m.heads[1:], l.m.batches[1:]
	}
	l.m.mu.Unlock()
	return wal.BatchRef{}, false, fmt.Errorf("open segment: %w", fs.ErrNotExist)
}

// TestCheckHelloRacingRetention: a segment retention deletes while the
// hello is checked refuses the follower as behind retention (it must
// rebuild), not with an untyped read error; a read error with the LSN
// still retained stays a read error.
func TestCheckHelloRacingRetention(t *testing.T) {
	log := newMemLog(1)
	for i := 0; i < 5; i++ {
		log.append(t, 1, 2) // batches ending at 2, 4, …, 10
	}
	hello := replication.Ack{Epoch: 1, AppliedLSN: 4, LastBatch: refOf(t, 1, 4, "x")}
	err := CheckHello(hello, trimmingHelloLog{memHelloLog{m: log}, 7})
	if !errors.Is(err, replication.ErrBehindRetention) {
		t.Fatalf("segment deleted during the check: %v, want replication.ErrBehindRetention", err)
	}
	err = CheckHello(replication.Ack{Epoch: 1, AppliedLSN: 8, LastBatch: refOf(t, 1, 8, "x")}, memHelloLog{m: log, err: fs.ErrPermission})
	if !errors.Is(err, fs.ErrPermission) || errors.Is(err, replication.ErrBehindRetention) {
		t.Fatalf("read error on a retained LSN: %v", err)
	}
}
