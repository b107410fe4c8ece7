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
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"github.com/oncewal/oncewal/idempotency"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/testutil"
	"github.com/oncewal/oncewal/wal"
)

// TestDecide runs the scripted decision tables in testdata/decide twice:
// against the real tracker and window on an in-memory Pebble store
// (Receiver.decide, then Receiver.Apply), and against a map-backed view with
// no Pebble and no receiver (decideBatch over maps, then the plan carried
// out on the maps). Both must print the same: a batch in, each event's
// fate, the batch's verdict and the ack out. Commands:
//
//	new [shard=N] [window=N] [horizon=DURATION]
//	    a fresh receiver (default shard 0, window 100; the map view keeps
//	    every key: scripts stay within the window)
//	batch [shard=N] [epoch=N] [first=LSN]
//	<op> s=SESSION [seq=N] [key=NAME] [t=SECONDS]
//	    ...one event per line; op is open, put, delete, close or claim (a
//	    ledger record); key gives the event an idempotency key; t is the
//	    WAL time in seconds after a fixed origin (default: one more than the
//	    last event's). Defaults: the receiver's shard, epoch 1, first =
//	    applied+1.
//	fail-commit
//	    the next commit fails (the store becomes failed)
//	promise epoch=N
//	    promise epoch N to a fencing leader (Receiver.Promise); prints the
//	    promise held after it and the position it returned, or the refusal
//
// batch prints what decide answered (without writing), then what Apply did
// and the ack; the store run also checks that Apply agreed with the
// decision. The rigs' Applier is a SessionApplier without a ledger table:
// a ledger record that survives the decision fails the batch (ErrApply).
func TestDecide(t *testing.T) {
	for _, view := range []struct {
		name string
		new  func(t *testing.T, td *datadriven.TestData) decideRun
	}{
		{"store", func(t *testing.T, td *datadriven.TestData) decideRun { return newDecideRig(t, td) }},
		{"map", func(t *testing.T, td *datadriven.TestData) decideRun { return newMapRig(t, td) }},
	} {
		t.Run(view.name, func(t *testing.T) {
			datadriven.Walk(t, "testdata/decide", func(t *testing.T, path string) {
				var d decideRun
				datadriven.RunTest(t, path, func(t *testing.T, td *datadriven.TestData) string {
					switch td.Cmd {
					case "new":
						d = view.new(t, td)
						return ""
					case "batch":
						return runBatch(t, td, d)
					case "fail-commit":
						d.failNextCommit()
						return ""
					case "promise":
						var epoch uint64
						td.ScanArgs(t, "epoch", &epoch)
						ack, held, err := d.promise(epoch)
						if err != nil {
							return fmt.Sprintf("promise: refused (%s), holds %d\n", refusalName(err), held)
						}
						return fmt.Sprintf("promise: holds %d; position: epoch %d, applied %d\n", held, ack.Epoch, ack.AppliedLSN)
					}
					t.Fatalf("%s: unknown command %q", td.Pos, td.Cmd)
					return ""
				})
			})
		})
	}
}

// decideRun is one view TestDecide decides and applies batches against.
type decideRun interface {
	// position is the durable applied position (Receiver.Position: where
	// a batch starts by default) and the shard.
	position() (applied uint64, shard uint32)
	// decide decides a decoded batch without writing anything; the plan's
	// slices are valid until the next decide or apply.
	decide(t *testing.T, h wal.Header, events []wal.Event) plan
	// apply carries the encoded batch out (after decide printed p).
	apply(t *testing.T, raw []byte, p plan) (Result, error)
	// failed reports whether the store failed (sticky).
	failed() bool
	failNextCommit()
	// promise promises epoch (Receiver.Promise) and returns its answer and
	// the promise held after it.
	promise(epoch uint64) (replication.Ack, uint64, error)
	// failingNext reports whether the current batch's commit is to fail.
	failingNext() bool
	scriptClock() *int64
}

type decideRig struct {
	script
	db       *pebble.DB
	recv     *Receiver
	shard    uint32
	failNext bool
	syncs    *errorfs.Toggle
}

// failSyncs fails every file sync with errInjectedSync: wrapped in an
// errorfs.Toggle that is on, a failed commit.
var failSyncs = errorfs.InjectorFunc(func(op errorfs.Op) error {
	if op.Kind == errorfs.OpFileSync || op.Kind == errorfs.OpFileSyncData {
		return errInjectedSync
	}
	return nil
})

var errInjectedSync = fmt.Errorf("injected sync failure")

const decideOrigin = int64(1_767_225_600) * int64(time.Second) // 2026-01-01

// rigArgs reads new's arguments: shard, window capacity, retention horizon.
func rigArgs(t *testing.T, td *datadriven.TestData) (shard, window int, horizon time.Duration) {
	shard, window = 0, 100
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
	return shard, window, horizon
}

func newDecideRig(t *testing.T, td *datadriven.TestData) *decideRig {
	shard, window, horizon := rigArgs(t, td)
	syncs := &errorfs.Toggle{Injector: failSyncs}
	o := testutil.DBOptions(errorfs.Wrap(vfs.NewMem(), syncs))
	o.Logger = FatalLogger{}
	db := testutil.OpenDBWith(t, "", o)
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
	return &decideRig{script: script{decideOrigin}, db: db, recv: recv, shard: uint32(shard), syncs: syncs}
}

func (d *decideRig) position() (uint64, uint32) {
	applied, _ := d.recv.Position()
	return applied, d.shard
}

// decide loads from the real tracker and window and decides; Abort drops
// the tracker tx, which only cached what it read.
func (d *decideRig) decide(t *testing.T, h wal.Header, events []wal.Event) plan {
	b := d.db.NewBatch()
	defer b.Close()
	ttx := d.recv.tracker.Begin(b)
	defer ttx.Abort()
	d.recv.mu.Lock()
	defer d.recv.mu.Unlock()
	p, err := d.recv.decide(ttx, h, events)
	if err != nil {
		t.Fatalf("decide: %v", err)
	}
	return p
}

func (d *decideRig) apply(t *testing.T, raw []byte, _ plan) (Result, error) {
	if d.failNext {
		d.syncs.On()
		defer func() { d.syncs.Off(); d.failNext = false }()
	}
	return d.recv.Apply(raw)
}

func (d *decideRig) promise(epoch uint64) (replication.Ack, uint64, error) {
	ack, err := d.recv.Promise(epoch)
	return ack, d.recv.Promised(), err
}

func (d *decideRig) failed() bool      { return d.recv.Err() != nil }
func (d *decideRig) failNextCommit()   { d.failNext = true }
func (d *decideRig) failingNext() bool { return d.failNext }

// mapRig decides with decideBatch over a map-backed view — HWMs, WAL clock
// and window in maps, the position a value — and carries a plan out on the
// maps the way stage and publish carry it out on the store.
type mapRig struct {
	script
	shard    uint32
	horizon  time.Duration
	at       position // where the next decision starts
	promised uint64   // the promise held
	durable  position // what acks report
	clock    int64
	hwms     map[session.ID]session.HWM
	slots    map[session.ID]int32 // the batch's sessions, numbered
	window   map[idempotency.Key]bool
	fail     error
	failNext bool
	dec      decider
}

func newMapRig(t *testing.T, td *datadriven.TestData) *mapRig {
	shard, _, horizon := rigArgs(t, td)
	return &mapRig{script: script{decideOrigin}, shard: uint32(shard), hwms: map[session.ID]session.HWM{}, window: map[idempotency.Key]bool{},
		horizon: (&session.TrackerOptions{RetentionHorizon: horizon}).EnsureDefaults().RetentionHorizon}
}

func (m *mapRig) position() (uint64, uint32) { return m.durable.applied, m.shard }

func (m *mapRig) decide(_ *testing.T, h wal.Header, events []wal.Event) plan {
	in := loaded{clock: m.clock, horizon: m.horizon}
	in.size(len(events))
	m.slots = map[session.ID]int32{}
	for i := range events {
		ev := &events[i]
		slot, ok := m.slots[ev.Session]
		if !ok {
			slot = int32(len(m.slots))
			m.slots[ev.Session] = slot
		}
		in.hwms[i], in.slots[i] = m.hwms[ev.Session], slot
		in.hits[i] = ev.HasIdemKey && m.window[ev.IdemKey]
	}
	in.nslots = len(m.slots)
	return m.dec.decideBatch(decideState{shard: m.shard, at: m.at, promise: m.promised}, &in, h, events)
}

func (m *mapRig) apply(_ *testing.T, _ []byte, p plan) (Result, error) {
	res, err := m.carryOut(p)
	res.Ack = replication.Ack{Shard: m.shard, Epoch: m.durable.epoch, AppliedLSN: m.durable.applied, Refused: err != nil}
	return res, err
}

func (m *mapRig) carryOut(p plan) (Result, error) {
	if m.fail != nil {
		return Result{}, m.fail
	}
	switch p.verdict {
	case verdictRedelivery:
		return Result{Discarded: len(p.events)}, nil
	case verdictRefuse:
		return Result{}, p.refusal.err
	}
	for i := range p.keep {
		if ev := &p.keep[i]; ev.Op.IsLedger() {
			return Result{}, applyFailed(p.h, fmt.Errorf("ledger op %v at LSN %d and no ledger table", ev.Op, ev.LSN))
		}
	}
	// Committed (into the memtable): memory follows, also when the sync
	// then fails.
	for id, slot := range m.slots {
		if hw := m.dec.touched[slot]; m.dec.has[slot] {
			m.hwms[id] = hw
			m.clock = max(m.clock, hw.LastTS)
		}
	}
	for _, k := range p.record {
		m.window[k] = true
	}
	m.at = position{applied: p.h.LastLSN(), epoch: p.epoch, last: p.last}
	if m.failNext {
		m.failNext = false
		m.fail = fmt.Errorf("%w: WAL sync: %w", ErrFailed, errInjectedSync)
		return Result{}, m.fail
	}
	m.durable = m.at
	return p.result(), nil
}

// promise holds the higher promise and answers the decision position:
// the map view has no pipeline, so it is the durable one.
func (m *mapRig) promise(epoch uint64) (replication.Ack, uint64, error) {
	if err := CheckPromiseEpoch(epoch); err != nil {
		return replication.Ack{}, m.promised, err
	}
	if m.fail != nil {
		return replication.Ack{}, m.promised, m.fail
	}
	m.promised = max(m.promised, epoch)
	return replication.Ack{Shard: m.shard, Epoch: m.at.epoch, AppliedLSN: m.at.applied, LastBatch: m.at.last}, m.promised, nil
}

func (m *mapRig) failed() bool      { return m.fail != nil }
func (m *mapRig) failNextCommit()   { m.failNext = true }
func (m *mapRig) failingNext() bool { return m.failNext }

// names maps a script's session or key name to its bytes: the name itself,
// zero-padded to 16 bytes.
func name16(s string) (out [16]byte) {
	copy(out[:], s)
	return out
}

// scriptBatch encodes a batch command's events; names maps each session to
// its script name. The clock is the last event's time, carried between
// batches.
func scriptBatch(t *testing.T, td *datadriven.TestData, shard uint32, applied uint64, clock *int64) ([]byte, map[session.ID]string) {
	sh, epoch, first := int(shard), 1, int(applied+1)
	td.MaybeScanArgs(t, "shard", &sh)
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
			rec := idempotency.Record{Kind: idempotency.RecordClaim, Key: "r1", Time: *clock, Expires: *clock + int64(time.Minute)}
			ev = wal.LedgerEvent(&rec)
		default:
			t.Fatalf("%s: unknown op %q", td.Pos, f[0])
		}
		*clock += int64(time.Second)
		ev.Time = *clock
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
				*clock = decideOrigin + n*int64(time.Second)
				ev.Time = *clock
			default:
				t.Fatalf("%s: unknown argument %q", td.Pos, k)
			}
		}
		events = append(events, ev)
	}
	raw, err := wal.AppendBatch(nil, uint32(sh), uint64(epoch), uint64(first), events)
	if err != nil {
		t.Fatalf("%s: encode: %v", td.Pos, err)
	}
	return raw, names
}

// scriptClock is a script's WAL clock, carried from batch to batch.
type script struct{ clock int64 }

func (c *script) scriptClock() *int64 { return &c.clock }

func runBatch(t *testing.T, td *datadriven.TestData, d decideRun) string {
	applied, shard := d.position()
	raw, names := scriptBatch(t, td, shard, applied, d.scriptClock())

	var out strings.Builder
	// The decision alone: decide writes nothing.
	h, decoded, err := wal.DecodeBatch(raw, nil)
	if err != nil {
		t.Fatal(err)
	}
	p := d.decide(t, h, decoded)
	for i, f := range p.fates {
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

	failedBefore, failing := d.failed(), d.failingNext()
	res, err := d.apply(t, raw, p)
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
	case failing:
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
		{ErrFailed, "ErrFailed"}, {ErrStaging, "ErrStaging"}, {ErrBadPromise, "ErrBadPromise"},
		{replication.ErrEpochExhausted, "ErrEpochExhausted"}} {
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
	o := testutil.DBOptions(vfs.NewMem())
	o.Logger = FatalLogger{}
	db := testutil.OpenDBWith(t, "", o)
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

	d.syncs.On()
	p2 := d.recv.Start(enc(2, 2))
	p3 := d.recv.Start(enc(3, 3)) // decided from p2's position: staged while p2 syncs
	for i, p := range []*Pending{p2, p3} {
		res, err := p.Wait()
		if !errors.Is(err, ErrFailed) || !res.Ack.Refused || res.Committed || res.Ack.AppliedLSN != 1 {
			t.Fatalf("batch %d after the failed sync: %+v, %v", i+2, res, err)
		}
	}
	d.syncs.Off()
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

// TestLoadErrorIsStaging: an I/O error while loading what a decision needs
// (here an HWM row that does not decode) refuses the batch as a staging
// error (ErrStaging, the cause kept), not as a decision: nothing is
// written, the position stays, and the next batch without that session
// applies.
func TestLoadErrorIsStaging(t *testing.T) {
	d := newDecideRig(t, &datadriven.TestData{})
	bad := name16("bad")
	if err := d.db.Set(append([]byte(session.HWMPrefix), bad[:]...), []byte("x"), pebble.Sync); err != nil {
		t.Fatal(err)
	}
	enc := func(s session.ID) []byte {
		raw, err := wal.AppendBatch(nil, 0, 1, 1, []wal.Event{{Op: wal.OpPut, Session: s, Seq: 1, Time: decideOrigin,
			Key: []byte("k"), Value: []byte("v"), HasIdemKey: true, IdemKey: idempotency.Key(s)}})
		if err != nil {
			t.Fatal(err)
		}
		return raw
	}
	// Validate decides as Apply would, and a load failure is its answer.
	h, events, err := wal.DecodeBatch(enc(bad), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.recv.Validate(acceptAll{}, h, events); !errors.Is(err, ErrStaging) || !errors.Is(err, session.ErrCorrupt) {
		t.Fatalf("Validate over an undecodable HWM row: %v; want ErrStaging wrapping session.ErrCorrupt", err)
	}
	res, err := d.recv.Apply(enc(bad))
	if !errors.Is(err, ErrStaging) || !errors.Is(err, session.ErrCorrupt) || !res.Ack.Refused || res.Committed {
		t.Fatalf("Apply over an undecodable HWM row: %+v, %v; want a refused ErrStaging wrapping session.ErrCorrupt", res, err)
	}
	if applied, _ := d.recv.Position(); applied != 0 || d.recv.Err() != nil {
		t.Fatalf("position %d, store error %v after a load failure", applied, d.recv.Err())
	}
	if res, err := d.recv.Apply(enc(name16("good"))); err != nil || !res.Committed || res.Applied != 1 {
		t.Fatalf("next batch: %+v, %v", res, err)
	}
}

type acceptAll struct{}

func (acceptAll) Validate(*pebble.Batch, []wal.Event) error { return nil }
