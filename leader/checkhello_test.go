package leader

import (
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"

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

// TestCheckHello runs the scripted hello checks in testdata/checkhello:
// CheckHello against a scripted log, a follower's hello in, served or the
// refusal out. Commands:
//
//	log first=LSN [last=LSN] [epoch=N start=LSN [prev=REF]] [read=fail|trim:LSN]
//	<end LSN> <REF>
//	    ...one batch of the log per line, by the LSN it ends at and its
//	    identity. The log holds first..last (last: the last batch's end,
//	    else first-1); epoch, start and prev are its epoch boundary (epoch
//	    and start default to 1, prev to unknown). read=fail fails every
//	    read of a batch (the disk); read=trim:LSN has retention delete the
//	    log below LSN while the hello is checked, the read then failing.
//	hello epoch=N applied=LSN [last=REF]
//	    a follower's hello; REF is NAME@EPOCH, a batch identity of that
//	    epoch with a CRC made from NAME (default: unknown, an old store).
//
// hello prints "served", or the refusal's sentinel and text.
func TestCheckHello(t *testing.T) {
	datadriven.Walk(t, "testdata/checkhello", func(t *testing.T, path string) {
		var log *scriptHelloLog
		datadriven.RunTest(t, path, func(t *testing.T, td *datadriven.TestData) string {
			switch td.Cmd {
			case "log":
				log = newScriptHelloLog(t, td)
				return ""
			case "hello":
				var h replication.Ack
				td.ScanArgs(t, "epoch", &h.Epoch)
				td.ScanArgs(t, "applied", &h.AppliedLSN)
				if td.HasArg("last") {
					var ref string
					td.ScanArgs(t, "last", &ref)
					h.LastBatch = scriptRef(t, ref)
				}
				log.reset()
				err := CheckHello(h, log)
				switch {
				case err == nil:
					return "served\n"
				case errors.Is(err, replication.ErrDiverged):
					return fmt.Sprintf("refused (ErrDiverged): %v\n", err)
				case errors.Is(err, replication.ErrBehindRetention):
					return fmt.Sprintf("refused (ErrBehindRetention): %v\n", err)
				}
				return fmt.Sprintf("error: %v\n", err)
			}
			t.Fatalf("%s: unknown command %q", td.Pos, td.Cmd)
			return ""
		})
	})
}

// scriptHelloLog is a HelloLog as a script states it.
type scriptHelloLog struct {
	first0, first, last uint64
	ends                map[uint64]wal.BatchRef
	b                   EpochBoundary
	fail                bool   // every BatchEndingAt fails
	trimTo              uint64 // BatchEndingAt: retention deletes below trimTo, then the read fails
}

func newScriptHelloLog(t *testing.T, td *datadriven.TestData) *scriptHelloLog {
	l := &scriptHelloLog{ends: map[uint64]wal.BatchRef{}, b: EpochBoundary{Epoch: 1, StartLSN: 1}}
	td.ScanArgs(t, "first", &l.first0)
	td.MaybeScanArgs(t, "epoch", &l.b.Epoch)
	td.MaybeScanArgs(t, "start", &l.b.StartLSN)
	if td.HasArg("prev") {
		var ref string
		td.ScanArgs(t, "prev", &ref)
		l.b.Prev = scriptRef(t, ref)
	}
	l.last = l.first0 - 1
	for _, line := range strings.Split(strings.TrimSpace(td.Input), "\n") {
		if line = strings.TrimSpace(line); line == "" {
			continue
		}
		var end uint64
		var ref string
		if _, err := fmt.Sscan(line, &end, &ref); err != nil {
			t.Fatalf("%s: batch line %q: %v", td.Pos, line, err)
		}
		l.ends[end] = scriptRef(t, ref)
		l.last = max(l.last, end)
	}
	td.MaybeScanArgs(t, "last", &l.last)
	if td.HasArg("read") {
		var read string
		td.ScanArgs(t, "read", &read)
		switch to, trim := strings.CutPrefix(read, "trim:"); {
		case read == "fail":
			l.fail = true
		case trim:
			n, err := strconv.ParseUint(to, 10, 64)
			if err != nil {
				t.Fatalf("%s: read=%s: %v", td.Pos, read, err)
			}
			l.trimTo = n
		default:
			t.Fatalf("%s: unknown read=%s", td.Pos, read)
		}
	}
	l.reset()
	return l
}

// scriptRef is the identity NAME@EPOCH: the epoch and a CRC made from NAME.
func scriptRef(t *testing.T, s string) wal.BatchRef {
	name, epoch, ok := strings.Cut(s, "@")
	e, err := strconv.ParseUint(epoch, 10, 64)
	if !ok || err != nil {
		t.Fatalf("batch identity %q: want NAME@EPOCH", s)
	}
	return wal.BatchRef{Epoch: e, CRC: crc32.ChecksumIEEE([]byte(name))}
}

// reset undoes a trim of the previous hello.
func (l *scriptHelloLog) reset() { l.first = l.first0 }

func (l *scriptHelloLog) Retained() (first, last uint64) { return l.first, l.last }

func (l *scriptHelloLog) BatchEndingAt(lsn uint64) (wal.BatchRef, bool, error) {
	switch {
	case l.fail:
		return wal.BatchRef{}, false, errors.New("read: disk on fire")
	case l.trimTo > 0:
		l.first = max(l.first, l.trimTo)
		return wal.BatchRef{}, false, fmt.Errorf("open segment: %w", fs.ErrNotExist)
	}
	ref, ok := l.ends[lsn]
	return ref, ok, nil
}

func (l *scriptHelloLog) Boundary() EpochBoundary { return l.b }

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
