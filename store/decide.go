package store

import (
	"fmt"
	"slices"
	"time"

	"github.com/oncewal/oncewal/idempotency"
	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/wal"
)

// verdict is decide's answer for a whole batch.
type verdict uint8

const (
	// verdictStage: stage and commit the plan (some events may be
	// discarded; the position advances either way).
	verdictStage verdict = iota
	// verdictRedelivery: the batch lies wholly at or below the applied
	// position (or is empty); nothing is written and the ack repeats the
	// position.
	verdictRedelivery
	// verdictRefuse: nothing is written; the ack is refused.
	verdictRefuse
)

// fate is what decide did with one event.
type fate uint8

const (
	fateApply    fate = iota // handed to the Applier
	fatePosition             // at or below the applied position
	fateHWM                  // SeqNo at or below its session's HWM
	fateClosed               // session closed
	fateTooOld               // session expired and SeqNo > 1
	fateInBatch              // idempotency key seen earlier in the batch
	fateWindow               // idempotency key in the window (SeqNo consumed)
	fateGap                  // SeqNo above HWM+1: the batch is refused
)

var fateNames = [...]string{"apply", "position", "hwm", "closed", "too-old", "in-batch", "window", "gap"}

func (f fate) String() string { return fateNames[f] }

// refusalKind names the Stats counter a refusal adds to.
type refusalKind uint8

const (
	refusedWrongShard refusalKind = iota
	refusedStaleEpoch
	refusedOutOfOrder
	refusedSeqGap
	refusedStore // I/O failure while loading or staging (incl. the commit)
	refusedApply // the Applier failed
)

// refusal is a refused batch: the error Apply returns and its counter.
type refusal struct {
	kind refusalKind
	err  error
}

func (f *refusal) counter(s *statsCounters) *counter {
	switch f.kind {
	case refusedWrongShard:
		return &s.wrongShard
	case refusedStaleEpoch:
		return &s.staleEpochs
	case refusedOutOfOrder:
		return &s.outOfOrder
	case refusedSeqGap:
		return &s.seqGaps
	}
	return &s.applyErrors
}

// plan is decide's result for one batch: a refusal, a redelivery, or what to
// stage — the surviving events, the idempotency keys to record, whether any
// HWM advanced, the epoch and batch identity to persist, and the counts.
// Its slices are the receiver's scratch, valid until the next Apply.
type plan struct {
	verdict  verdict
	refusal  *refusal
	h        wal.Header
	events   []wal.Event
	fates    []fate // fates[i]: what happened to events[i] (verdictStage, or up to a gap)
	keep     []wal.Event
	record   []idempotency.Key
	advanced bool // some session's HWM advanced (its SeqNo was consumed)
	epoch    uint64
	last     wal.BatchRef
	counts   batchCounts
	syncing  bool      // stage committed b with Sync and did not wait for it
	lazy     bool      // stage committed b without a sync: it changed only the position (syncPolicy)
	started  time.Time // when stage handed b to Pebble
}

func refuse(kind refusalKind, err error) plan {
	return plan{verdict: verdictRefuse, refusal: &refusal{kind: kind, err: err}}
}

// maxKeptMap is the most entries a per-batch scratch map may have held for
// the receiver to clear and keep it rather than allocate a new one.
const maxKeptMap = 1 << 13

// Deciding a batch is two phases, the way etcd raft's Step is a function of
// its state and message while Ready does the I/O:
//
//   - load (Receiver.load) reads what the decision needs — the HWMs of the
//     batch's sessions and whether its idempotency keys are in the window —
//     with the prefetching the hot path needs, and nothing else. An I/O
//     error there is a staging error (ErrStaging), not a decision;
//   - decideBatch is a function of plain values: the receiver's position
//     (decideState), what load read (loaded), the header and the events.
//     It returns the plan and reads nothing else, so testdata/decide runs it
//     over maps as well as over the real tracker and window.

// decideState is what a decision reads of the receiver.
type decideState struct {
	shard   uint32
	at      position // applied LSN and epoch the batch must follow
	promise uint64   // the highest epoch promised to a fencing leader
}

// loaded is what load read for one batch. Only the entries a decision can
// read are filled: hwms[i] and slots[i] for an event past the applied
// position with a SeqNo, hits[i] for a keyed operation (not a ledger
// record) past the position that its HWM does not surely stop (see load).
type loaded struct {
	clock   int64         // the tracker's WAL clock before the batch
	horizon time.Duration // the tracker's retention horizon
	hwms    []session.HWM // events[i]'s session before the batch
	// slots[i] numbers events[i]'s session, below nslots: the events of one
	// session share it. -1: load found the event a sure duplicate, which
	// no earlier event of the batch changes (its session is not numbered
	// for it).
	slots  []int32
	nslots int
	hits   []bool // events[i]'s idempotency key is in the window

	// Scratch of load: the sessions it peeks, in event order, and their
	// HWMs (TrackerTx.PeekAll).
	peekIDs []session.ID
	peeked  []session.HWM
}

// size makes the per-event slices cover n events, hits all false, and
// numbers no session yet.
func (in *loaded) size(n int) {
	if cap(in.hwms) < n {
		in.hwms = make([]session.HWM, n)
		in.slots = make([]int32, n)
		in.hits = make([]bool, n)
	}
	in.hwms, in.slots, in.hits, in.nslots = in.hwms[:n], in.slots[:n], in.hits[:n], 0
	clear(in.hits)
}

// decider holds decideBatch's scratch, reused across batches: the plan's
// slices are its, valid until the next decision.
type decider struct {
	fates   []fate
	keep    []wal.Event
	record  []idempotency.Key
	inBatch map[idempotency.Key]struct{}
	// touched[slot]: the state of a session the batch advanced so far
	// (has[slot]), by loaded.slots — the tracker's pending overlay, as
	// values.
	touched []session.HWM
	has     []bool
}

// resetKeys empties the batch's key set for the next batch. A Go map keeps the
// capacity it grew to, and clearing it costs that capacity: after one huge
// batch (a catch-up, a preload) every later batch would pay it (~90 µs per
// batch after a 25,000-event one), so a map that grew past maxKeptMap
// starts over instead.
func resetKeys(m map[idempotency.Key]struct{}, n int) map[idempotency.Key]struct{} {
	if m == nil || len(m) > maxKeptMap {
		return make(map[idempotency.Key]struct{}, min(n, maxKeptMap))
	}
	clear(m)
	return m
}

// gate is step 1 and 2 of decideBatch, which look at the header alone: a
// refusal or redelivery, or done false when the batch is to be decided
// event by event.
func gate(st decideState, h wal.Header, events []wal.Event) (p plan, done bool) {
	at := st.at
	switch {
	case h.Shard != st.shard:
		return refuse(refusedWrongShard, fmt.Errorf("%w: batch shard %d, receiver shard %d", replication.ErrWrongShard, h.Shard, st.shard)), true
	case h.Epoch < at.epoch || h.Epoch < st.promise:
		return refuse(refusedStaleEpoch, staleBatch(h.Epoch, at.epoch, st.promise)), true
	case h.Epoch > at.epoch && h.FirstLSN <= at.applied:
		return refuse(refusedStaleEpoch, fmt.Errorf("%w: epoch %d batch starts at LSN %d, but LSNs up to %d were applied under epoch %d",
			replication.ErrDiverged, h.Epoch, h.FirstLSN, at.applied, at.epoch)), true
	case len(events) == 0 || h.LastLSN() <= at.applied:
		return plan{verdict: verdictRedelivery, h: h, events: events}, true
	case h.FirstLSN > at.applied+1:
		return refuse(refusedOutOfOrder, fmt.Errorf("%w: batch starts at LSN %d, applied %d", replication.ErrOutOfOrder, h.FirstLSN, at.applied)), true
	}
	return plan{}, false
}

// decideBatch takes every decision about a batch, from plain values, in
// this order:
//  1. shard (ErrWrongShard) and epoch fencing (ErrStaleEpoch: below the
//     committed epoch or the promised one; a newer epoch overlapping
//     applied LSNs: ErrDiverged);
//  2. position: a batch wholly at or below the applied LSN (or empty) is a
//     redelivery; one starting past applied+1 is refused (ErrOutOfOrder);
//  3. per event, in log order: an LSN at or below the applied position is
//     discarded; then the SeqNo against its session's HWM as the batch left
//     it so far (session.Decide: duplicate, closed, too old: skipped; a gap
//     refuses the whole batch, ErrSeqGap); an applied SeqNo advances the HWM
//     (and closes the session for OpClose) whether or not the window then
//     suppresses the operation, so the next SeqNo is not a gap;
//  4. then, for an event step 3 let through, the idempotency key (data
//     events only): a key seen earlier in the batch, then one in the
//     window, suppresses the operation; every distinct key is recorded.
//
// Decoding and checksums come before (wal.DecodeBatch); stage carries the
// plan out, the HWM advances included.
func (d *decider) decideBatch(st decideState, in *loaded, h wal.Header, events []wal.Event) plan {
	if p, done := gate(st, h, events); done {
		return p
	}
	p := plan{verdict: verdictStage, h: h, events: events, epoch: max(st.at.epoch, h.Epoch), last: h.Ref(),
		fates: d.fates[:0], keep: d.keep[:0], record: d.record[:0]}
	defer func() { d.fates, d.keep, d.record = p.fates[:0], p.keep[:0], p.record[:0] }()
	d.inBatch = resetKeys(d.inBatch, len(events))
	if cap(d.has) < in.nslots {
		d.touched, d.has = make([]session.HWM, in.nslots), make([]bool, in.nslots)
	}
	d.touched, d.has = d.touched[:in.nslots], d.has[:in.nslots]
	clear(d.has)
	clock := in.clock // the WAL clock moves with every advance
	cutoff := session.Cutoff(clock, in.horizon)
	for i := range events {
		ev := &events[i]
		f := fateApply
		switch {
		case ev.LSN <= st.at.applied: // overlap with an already applied prefix
			f = fatePosition
		case ev.Seq != 0:
			hw, slot := in.hwms[i], in.slots[i]
			if slot >= 0 && d.has[slot] {
				hw = d.touched[slot]
			}
			switch session.Decide(hw, ev.Seq, ev.Time, cutoff) {
			case session.Duplicate:
				f = fateHWM
			case session.Closed:
				f = fateClosed
			case session.TooOld:
				f = fateTooOld
			case session.Gap:
				return gapRefusal(append(p.fates, fateGap), ev, hw, cutoff)
			default:
				hw = hw.Advance(ev.Seq, ev.Time, cutoff)
				if ev.Op == wal.OpClose {
					hw = hw.Close(ev.Time)
				}
				if slot >= 0 {
					d.touched[slot], d.has[slot] = hw, true
				}
				if ev.Time > clock {
					clock = ev.Time
					cutoff = session.Cutoff(clock, in.horizon)
				}
				p.advanced = true
			}
		}
		// Ledger records never enter the window: the position gate admits
		// each once and re-applying one is harmless, and the window's slots
		// are promised to operations ("the last Capacity distinct
		// operations"). Leaders before wal.OpExtend gave them keys; ignored.
		if f == fateApply && ev.HasIdemKey && !ev.Op.IsLedger() {
			if _, dup := d.inBatch[ev.IdemKey]; dup {
				f = fateInBatch
			} else {
				d.inBatch[ev.IdemKey] = struct{}{}
				p.record = append(p.record, ev.IdemKey)
				if in.hits[i] {
					f = fateWindow
				}
			}
		}
		p.fates = append(p.fates, f)
		p.count(f, ev)
	}
	return p
}

// count adds an event of fate f to the plan's counts (or its survivors).
func (p *plan) count(f fate, ev *wal.Event) {
	switch f {
	case fateApply:
		p.keep = append(p.keep, *ev)
	case fatePosition:
		p.counts.position++
	case fateHWM:
		p.counts.hwm++
	case fateClosed:
		p.counts.closed++
	case fateTooOld:
		p.counts.tooOld++
	case fateInBatch:
		p.counts.inBatch++
	case fateWindow:
		p.counts.window++
	}
}

// gapRefusal refuses a batch at a SeqNo gap, keeping the fates up to it;
// the error names the HWM the decision saw (this batch's advances
// included; 0 for an unknown or expired session).
func gapRefusal(fates []fate, ev *wal.Event, hw session.HWM, cutoff int64) plan {
	var hwm session.SeqNo
	if hw.Live(cutoff) {
		hwm = hw.Seq
	}
	p := refuse(refusedSeqGap, fmt.Errorf("%w: session %s SeqNo %d at LSN %d, HWM %d",
		replication.ErrSeqGap, ev.Session, ev.Seq, ev.LSN, hwm))
	p.fates = fates
	return p
}

// result is what Apply reports for a plan that was carried out.
func (p *plan) result() Result {
	c := &p.counts
	return Result{Committed: true, Applied: len(p.keep),
		Discarded: c.position + c.hwm + c.window + c.inBatch,
		Skipped:   c.closed + c.tooOld}
}

// decide loads what a batch needs and decides it (decideBatch). An error
// is an I/O failure while loading (wrapping ErrStaging): no decision.
func (r *Receiver) decide(ttx *session.TrackerTx, h wal.Header, events []wal.Event) (plan, error) {
	st := decideState{shard: r.opts.Shard, at: position{applied: r.applied, epoch: r.epoch, last: r.last}, promise: r.promise.Load()}
	if err := r.load(ttx, st, h, events); err != nil {
		return plan{}, err
	}
	return r.decider.decideBatch(st, &r.in, h, events), nil
}

// load fills r.in for a batch: the HWM of each event's session the
// decision reads (past the applied position, with a SeqNo), and the window
// hit of each keyed operation its HWM does not surely stop, so that the
// window is not searched for the redeliveries the HWM catches. Surely: the
// SeqNo is at or below a HWM that stays live through the batch (the WAL
// clock can reach at most the batch's latest event time); the batch's own
// advances only raise HWMs, so such an event is a duplicate whatever comes
// before it. An error is an I/O failure, wrapping ErrStaging.
//
// Both kinds of reads overlap their cache misses instead of stalling the
// loads one at a time: the HWMs of all the batch's sessions are peeked
// together (TrackerTx.PeekAll, which pipelines its lookups; with 100K
// random sessions a prefetch pass before per-event Peeks had taken a
// duplicate's HWM check from ~290 to ~110 cpu-ns, go test ./bench -bench
// 'TrackerCheckDuplicate/warm', and PeekAll goes further); then the
// window's lines of the keys to look up, all together (Store.PrefetchKeys:
// a retry's key is resident, and its slot, entry and neighbours are read by
// the lookup and by publish's recency update). One Store.Prefetch per event
// waited for two cache misses per key in turn (~160 ns per retry, a sixth
// of the retry path's CPU).
func (r *Receiver) load(ttx *session.TrackerTx, st decideState, h wal.Header, events []wal.Event) error {
	in := &r.in
	in.clock, in.horizon = ttx.Clock(), r.horizon
	if _, done := gate(st, h, events); done {
		return nil
	}
	in.size(len(events))
	applied, latest := st.at.applied, in.clock
	ids := in.peekIDs[:0]
	for i := range events {
		ev := &events[i]
		if ev.Seq != 0 && ev.LSN > applied {
			ids = append(ids, ev.Session)
		}
		latest = max(latest, ev.Time)
	}
	in.peekIDs = ids
	in.peeked = slices.Grow(in.peeked[:0], len(ids))[:len(ids)]
	if err := ttx.PeekAll(ids, in.peeked); err != nil {
		return fmt.Errorf("%w: reading HWM: %w", ErrStaging, err)
	}
	peeked := in.peeked
	end := session.Cutoff(latest, in.horizon) // the cutoff can rise to this within the batch
	cand, warm := r.cand[:0], r.warm[:0]
	defer func() { r.cand, r.warm = cand[:0], warm[:0] }()
	for i := range events {
		ev := &events[i]
		if ev.LSN <= applied {
			continue
		}
		if ev.Seq != 0 {
			hw := peeked[0] // the ids above: this event's session
			peeked = peeked[1:]
			in.hwms[i], in.slots[i] = hw, -1
			if ev.Seq <= hw.Seq && hw.Live(end) {
				continue // surely a duplicate
			}
			// It may advance: number its session (the tx's index, which
			// the Advance in stage finds it in).
			var slot int32
			var err error
			if in.hwms[i], slot, err = ttx.Load(ev.Session); err != nil {
				return fmt.Errorf("%w: reading HWM: %w", ErrStaging, err)
			}
			in.slots[i], in.nslots = slot, max(in.nslots, int(slot)+1)
		}
		if ev.HasIdemKey && !ev.Op.IsLedger() {
			cand = append(cand, int32(i))
			warm = append(warm, ev.IdemKey)
		}
	}
	r.window.PrefetchKeys(warm)
	for j, i := range cand {
		in.hits[i] = r.window.Contains(warm[j])
	}
	return nil
}
