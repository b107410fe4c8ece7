package store

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/oncewal/oncewal/replication"

	"github.com/cockroachdb/datadriven"
	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/oncewal/oncewal/idempotency"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/wal"
)

// TestDecide runs the scripted decision tables in testdata/decide: a batch
// in, each event's fate, the batch's verdict and the ack out. Commands:
//
//	new [shard=N] [window=N] [horizon=DURATION]
//	    a fresh receiver on an in-memory store (default shard 0, window 100)
//	batch [shard=N] [epoch=N] [first=LSN]
//	<op> s=SESSION [seq=N] [key=NAME] [t=SECONDS]
//	    ...one event per line; op is open, put, delete, close or claim (a
//	    ledger record); key gives the event an idempotency key; t is the
//	    WAL time in seconds after a fixed origin (default: one more than the
//	    last event's). Defaults: the receiver's shard, epoch 1, first =
//	    applied+1.
//	fail-commit
//	    the next commit fails (the store becomes failed)
//
// batch prints what decide answered (without writing), then what Apply did
// and the ack; the test also checks that Apply agreed with the decision.
func TestDecide(t *testing.T) {
	datadriven.Walk(t, "testdata/decide", func(t *testing.T, path string) {
		var d *decideRig
		datadriven.RunTest(t, path, func(t *testing.T, td *datadriven.TestData) string {
			switch td.Cmd {
			case "new":
				d = newDecideRig(t, td)
				return ""
			case "batch":
				return d.batch(t, td)
			case "fail-commit":
				d.failNext = true
				return ""
			}
			t.Fatalf("%s: unknown command %q", td.Pos, td.Cmd)
			return ""
		})
	})
}

type decideRig struct {
	db       *pebble.DB
	recv     *Receiver
	shard    uint32
	clock    int64
	failNext bool
	fs       *failingFS
}

// failingFS fails every WAL sync once armed: a failed commit.
type failingFS struct {
	vfs.FS
	armed bool
}

type failingFile struct {
	vfs.File
	fs *failingFS
}

func (f *failingFS) Create(name string, c vfs.DiskWriteCategory) (vfs.File, error) {
	file, err := f.FS.Create(name, c)
	if err != nil {
		return nil, err
	}
	return failingFile{file, f}, nil
}

func (f *failingFS) ReuseForWrite(old, new string, c vfs.DiskWriteCategory) (vfs.File, error) {
	file, err := f.FS.ReuseForWrite(old, new, c)
	if err != nil {
		return nil, err
	}
	return failingFile{file, f}, nil
}

func (f failingFile) Sync() error {
	if f.fs.armed {
		return errInjectedSync
	}
	return f.File.Sync()
}

func (f failingFile) SyncData() error {
	if f.fs.armed {
		return errInjectedSync
	}
	return f.File.SyncData()
}

var errInjectedSync = fmt.Errorf("injected sync failure")

const decideOrigin = int64(1_767_225_600) * int64(time.Second) // 2026-01-01

func newDecideRig(t *testing.T, td *datadriven.TestData) *decideRig {
	shard, window := 0, 100
	horizon := time.Duration(0)
	td.MaybeScanArgs(t, "shard", &shard)
	td.MaybeScanArgs(t, "window", &window)
	if td.HasArg("horizon") {
		var h string
		td.ScanArgs(t, "horizon", &h)
		var err error
		if horizon, err = time.ParseDuration(h); err != nil {
			t.Fatal(err)
		}
	}
	fs := &failingFS{FS: vfs.NewMem()}
	db, err := pebble.Open("", &pebble.Options{FS: fs, FormatMajorVersion: pebble.FormatNewest, Logger: FatalLogger{}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	tracker, err := session.OpenTracker(db, &session.TrackerOptions{RetentionHorizon: horizon})
	if err != nil {
		t.Fatal(err)
	}
	recv, err := NewReceiver(db, tracker, idempotency.NewStore(window), SessionApplier{State: session.NewState(db)},
		&ReceiverOptions{Shard: uint32(shard)})
	if err != nil {
		t.Fatal(err)
	}
	return &decideRig{db: db, recv: recv, shard: uint32(shard), clock: decideOrigin, fs: fs}
}

// names maps a script's session or key name to its bytes: the name itself,
// zero-padded to 16 bytes.
func name16(s string) (out [16]byte) {
	copy(out[:], s)
	return out
}

func (d *decideRig) batch(t *testing.T, td *datadriven.TestData) string {
	applied, _ := d.recv.Position()
	shard, epoch, first := int(d.shard), 1, int(applied+1)
	td.MaybeScanArgs(t, "shard", &shard)
	td.MaybeScanArgs(t, "epoch", &epoch)
	td.MaybeScanArgs(t, "first", &first)
	var events []wal.Event
	names := map[session.ID]string{}
	for _, line := range strings.Split(strings.TrimSpace(td.Input), "\n") {
		if line = strings.TrimSpace(line); line == "" {
			continue
		}
		f := strings.Fields(line)
		var ev wal.Event
		switch f[0] {
		case "open":
			ev.Op = wal.OpOpen
		case "put":
			ev.Op, ev.Key, ev.Value = wal.OpPut, []byte("k"), []byte("v")
		case "delete":
			ev.Op, ev.Key = wal.OpDelete, []byte("k")
		case "close":
			ev.Op = wal.OpClose
		case "claim":
			rec := idempotency.Record{Kind: idempotency.RecordClaim, Key: "r1", Time: d.clock, Expires: d.clock + int64(time.Minute)}
			ev = wal.LedgerEvent(&rec)
		default:
			t.Fatalf("%s: unknown op %q", td.Pos, f[0])
		}
		d.clock += int64(time.Second)
		ev.Time = d.clock
		for _, kv := range f[1:] {
			k, v, ok := strings.Cut(kv, "=")
			if !ok {
				t.Fatalf("%s: bad argument %q", td.Pos, kv)
			}
			switch k {
			case "s":
				ev.Session = name16(v)
				names[ev.Session] = v
			case "seq":
				n, err := strconv.ParseUint(v, 10, 64)
				if err != nil {
					t.Fatal(err)
				}
				ev.Seq = session.SeqNo(n)
			case "key":
				ev.HasIdemKey, ev.IdemKey = true, idempotency.Key(name16(v))
			case "t":
				n, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					t.Fatal(err)
				}
				d.clock = decideOrigin + n*int64(time.Second)
				ev.Time = d.clock
			default:
				t.Fatalf("%s: unknown argument %q", td.Pos, k)
			}
		}
		events = append(events, ev)
	}
	raw, err := wal.AppendBatch(nil, uint32(shard), uint64(epoch), uint64(first), events)
	if err != nil {
		return fmt.Sprintf("encode: %v\n", err)
	}

	var out strings.Builder
	// The decision alone: decide writes nothing, and Abort drops its overlay.
	h, decoded, err := wal.DecodeBatch(raw, nil)
	if err != nil {
		t.Fatal(err)
	}
	b := d.db.NewBatch()
	ttx := d.recv.tracker.Begin(b)
	d.recv.mu.Lock()
	p := d.recv.decide(ttx, h, decoded)
	fates := append([]fate(nil), p.fates...)
	d.recv.mu.Unlock()
	ttx.Abort()
	_ = b.Close()
	for i, f := range fates {
		ev := &decoded[i]
		fmt.Fprintf(&out, "%d %s", ev.LSN, ev.Op)
		if ev.Session != (session.ID{}) {
			fmt.Fprintf(&out, " s=%s seq=%d", names[ev.Session], ev.Seq)
		}
		fmt.Fprintf(&out, ": %s\n", f)
	}
	switch p.verdict {
	case verdictStage:
		fmt.Fprintf(&out, "decide: stage %d, record %d keys, advanced %v, epoch %d\n", len(p.keep), len(p.record), p.advanced, p.epoch)
	case verdictRedelivery:
		fmt.Fprintf(&out, "decide: redelivery\n")
	case verdictRefuse:
		fmt.Fprintf(&out, "decide: refuse (%s)\n", refusalName(p.refusal.err))
	}
	kept := len(p.keep)
	verdictOfDecide := p.verdict

	failedBefore := d.recv.Err() != nil
	if d.failNext {
		d.fs.armed = true
		defer func() { d.fs.armed, d.failNext = false, false }()
	}
	res, err := d.recv.Apply(raw)
	switch {
	case err != nil:
		fmt.Fprintf(&out, "apply: refused (%s)\n", refusalName(err))
	case res.Committed:
		fmt.Fprintf(&out, "apply: committed, applied %d, discarded %d, skipped %d\n", res.Applied, res.Discarded, res.Skipped)
	default:
		fmt.Fprintf(&out, "apply: not committed, discarded %d\n", res.Discarded)
	}
	fmt.Fprintf(&out, "ack: epoch %d, applied %d, refused %v\n", res.Ack.Epoch, res.Ack.AppliedLSN, res.Ack.Refused)

	// Apply must carry out exactly what decide said, unless the store failed
	// (before, or in this commit).
	switch {
	case failedBefore:
		if !errors.Is(err, ErrFailed) || !res.Ack.Refused || res.Committed {
			t.Errorf("%s: failed store, Apply: %+v, %v", td.Pos, res, err)
		}
		return out.String()
	case d.failNext:
		// The WAL sync's error comes back from Batch.SyncWait, cause kept.
		if !errors.Is(err, ErrFailed) || !errors.Is(err, errInjectedSync) || !res.Ack.Refused || res.Committed {
			t.Errorf("%s: failed commit, Apply: %+v, %v", td.Pos, res, err)
		}
		return out.String()
	}
	switch verdictOfDecide {
	case verdictStage:
		if err == nil && (!res.Committed || res.Applied != kept) {
			t.Errorf("%s: decide staged %d events, Apply: %+v", td.Pos, kept, res)
		}
		// Staging can still fail: the Applier's error is stage's, not
		// decide's.
		if err != nil && !(errors.Is(err, ErrApply) && res.Ack.Refused && !res.Committed) {
			t.Errorf("%s: decide staged, Apply refused: %v", td.Pos, err)
		}
	case verdictRedelivery:
		if err != nil || res.Committed || res.Ack.Refused {
			t.Errorf("%s: decide said redelivery, Apply: %+v, %v", td.Pos, res, err)
		}
	case verdictRefuse:
		if err == nil || !res.Ack.Refused {
			t.Errorf("%s: decide refused, Apply: %+v", td.Pos, res)
		}
	}
	return out.String()
}

// refusalName names err by the sentinels errors.Is finds in it.
func refusalName(err error) string {
	var names []string
	for _, s := range []struct {
		err  error
		name string
	}{{replication.ErrWrongShard, "ErrWrongShard"}, {replication.ErrStaleEpoch, "ErrStaleEpoch"}, {replication.ErrDiverged, "ErrDiverged"},
		{replication.ErrOutOfOrder, "ErrOutOfOrder"}, {replication.ErrSeqGap, "ErrSeqGap"}, {ErrApply, "ErrApply"},
		{ErrFailed, "ErrFailed"}, {ErrStaging, "ErrStaging"}} {
		if errors.Is(err, s.err) {
			names = append(names, s.name)
		}
	}
	if len(names) == 0 {
		return err.Error()
	}
	return strings.Join(names, " + ")
}

type failingApplier struct{ err error }

func (a failingApplier) Apply(*pebble.Batch, []wal.Event) error { return a.err }

// TestApplyKeepsInnerError: a refusal wraps both its sentinel and the cause,
// so errors.Is finds either.
func TestApplyKeepsInnerError(t *testing.T) {
	db, err := pebble.Open("", &pebble.Options{FS: vfs.NewMem(), FormatMajorVersion: pebble.FormatNewest, Logger: FatalLogger{}})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	tracker, err := session.OpenTracker(db, nil)
	if err != nil {
		t.Fatal(err)
	}
	cause := errors.New("disk on fire")
	recv, err := NewReceiver(db, tracker, idempotency.NewStore(10), failingApplier{cause}, nil)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := wal.AppendBatch(nil, 0, 1, 1, []wal.Event{{Op: wal.OpPut, Session: name16("a"), Seq: 1, Time: decideOrigin, Key: []byte("k")}})
	if err != nil {
		t.Fatal(err)
	}
	res, err := recv.Apply(raw)
	if !errors.Is(err, ErrApply) || !errors.Is(err, cause) || !res.Ack.Refused || res.Committed {
		t.Fatalf("Apply: %+v, %v; want ErrApply wrapping the cause", res, err)
	}
	if applied, _ := recv.Position(); applied != 0 {
		t.Fatalf("position %d after a refused batch", applied)
	}
}

// TestPipelineSyncFailure: batches started while an earlier batch's WAL sync
// fails are all refused, also those already in the memtable, and the durable
// position (Position, the acks) never includes any of them. Position moves
// only in Wait, never at Start.
func TestPipelineSyncFailure(t *testing.T) {
	d := newDecideRig(t, &datadriven.TestData{})
	enc := func(first uint64, seq session.SeqNo) []byte {
		raw, err := wal.AppendBatch(nil, 0, 1, first, []wal.Event{{Op: wal.OpPut, Session: name16("a"), Seq: seq,
			Time: decideOrigin + int64(seq), Key: []byte("k"), Value: []byte("v")}})
		if err != nil {
			t.Fatal(err)
		}
		return raw
	}
	p1 := d.recv.Start(enc(1, 1))
	if applied, _ := d.recv.Position(); applied != 0 {
		t.Fatalf("Position %d before Wait", applied)
	}
	res, err := p1.Wait()
	if err != nil || res.Ack.AppliedLSN != 1 {
		t.Fatalf("first batch: %+v, %v", res, err)
	}

	d.fs.armed = true
	p2 := d.recv.Start(enc(2, 2))
	p3 := d.recv.Start(enc(3, 3)) // decided from p2's position: staged while p2 syncs
	for i, p := range []*Pending{p2, p3} {
		res, err := p.Wait()
		if !errors.Is(err, ErrFailed) || !res.Ack.Refused || res.Committed || res.Ack.AppliedLSN != 1 {
			t.Fatalf("batch %d after the failed sync: %+v, %v", i+2, res, err)
		}
	}
	d.fs.armed = false
	if applied, _ := d.recv.Position(); applied != 1 {
		t.Fatalf("Position %d after the failed sync, want 1", applied)
	}
	if _, err := d.recv.Apply(enc(4, 4)); !errors.Is(err, ErrFailed) {
		t.Fatalf("Apply after the failure: %v", err)
	}
	if st := d.recv.Stats(); st.Events != st.Accounted() {
		t.Fatalf("counters do not account for every event: %+v", st)
	}
}
