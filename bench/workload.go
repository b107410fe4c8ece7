package bench

import (
	"encoding/binary"
	"math/rand/v2"

	"github.com/oncewal/oncewal/idempotency"
	"github.com/oncewal/oncewal/internal/keyspace"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/wal"
)

// Shape of the end-to-end workload. Rows match the raw-ingest measurement in
// the project's shared notes: a state row is StatePrefix(2) + session ID(16) +
// a 6-byte user key = 24 B of key, and a version byte + 99 B of user value =
// 100 B of value.
const (
	BatchEvents  = 1000 // events per shipped batch and per synced Pebble batch
	RowKeyLen    = 24
	RowValueLen  = 100
	userKeyLen   = RowKeyLen - len(session.StatePrefix) - len(session.ID{})
	userValueLen = RowValueLen - 1
)

// Workload describes the event stream of an end-to-end benchmark.
type Workload struct {
	// Sessions is the number of distinct sessions. Events pick a session
	// uniformly at random, so with the default 100,000 nearly every event of
	// a 1000-event batch is in a different session: one HWM row per event,
	// the dedup layer's worst case. Default 100,000.
	Sessions int
	// Run is the number of consecutive events of one session before the next
	// random pick (clients that send bursts). Default 1.
	Run int
	// DupPercent of the events (spread evenly) are redeliveries: an event of
	// a random session with a SeqNo at or below its HWM, the same operation
	// and idempotency key as when first applied, re-logged at a new LSN. They
	// pass the position gate and are caught by the HWM layer.
	DupPercent int
	// RetryPercent of the events (spread evenly, after the duplicates) are
	// client retries: a fresh SeqNo of a random session carrying the
	// idempotency key of one of the last 50,000 fresh events. They pass the
	// position and HWM layers (the SeqNo is consumed) and are caught by the
	// window.
	RetryPercent int
}

func (w Workload) withDefaults() Workload {
	if w.Sessions <= 0 {
		w.Sessions = 100_000
	}
	if w.Run <= 0 {
		w.Run = 1
	}
	w.DupPercent = min(max(w.DupPercent, 0), 100)
	w.RetryPercent = min(max(w.RetryPercent, 0), 100-w.DupPercent)
	return w
}

// generator is the leader side of the workload: it remembers every event it
// has produced (as its idempotency key; everything else is recomputed from
// session and SeqNo), so it can re-log any of them as a duplicate.
type generator struct {
	w      Workload
	shard  uint32 // of the batches encode makes; 0 unless set
	rng    *rand.Rand
	ids    []session.ID
	idem   [][]idempotency.Key // idem[s][q-1]: key of session s, SeqNo q; len = HWM
	lsn    uint64              // next LSN
	clock  int64
	vals   []byte // random bytes; values are windows into it
	events []wal.Event
	keys   []byte // user keys of events, userKeyLen each
	op     []byte
	dupAcc int
	retAcc int
	recent []idempotency.Key // ring of the last len(recent) fresh events' keys
	issued int               // fresh keys issued (next ring slot: issued % len)
	cur    int               // session of the current run
	left   int               // events left in the current run

	// The HWM log's schedule, for the write set (rows): the batch of each
	// session's latest logged entry, and the sessions logged (changed or
	// carried forward) by each of the last DefaultLogBatches+1 batches.
	batchNo    int
	lastChange map[session.ID]int      // batch+1 of the session's latest logged entry
	carries    map[session.ID]int      // times carried forward unchanged
	logged     map[session.ID][2]int64 // HWM and lastTS of the logged sessions
	delta      []byte
	changedAt  [][]session.ID // sessions logged by each of the last batches
}

func newGenerator(w Workload) *generator {
	w = w.withDefaults()
	g := &generator{
		w:      w,
		rng:    rand.New(rand.NewPCG(7, 11)),
		idem:   make([][]idempotency.Key, w.Sessions),
		lsn:    1,
		clock:  1_700_000_000_000_000_000,
		recent: make([]idempotency.Key, 50_000),
	}
	g.ids = randomIDs(g.rng, w.Sessions)
	g.vals = randomBytes(g.rng, 64<<10)
	return g
}

// randomIDs returns n session IDs drawn from rng.
func randomIDs(rng *rand.Rand, n int) []session.ID {
	ids := make([]session.ID, n)
	for i := range ids {
		binary.LittleEndian.PutUint64(ids[i][:], rng.Uint64())
		binary.LittleEndian.PutUint64(ids[i][8:], rng.Uint64())
	}
	return ids
}

// randomBytes returns n bytes drawn from rng (values are windows into them).
func randomBytes(rng *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

// event fills e with event (s, q) of the workload; the user key goes to key.
// The operation is a function of (s, q) alone, so a duplicate re-created
// later is byte-identical.
func (g *generator) event(e *wal.Event, key []byte, s int, q session.SeqNo) {
	binary.BigEndian.PutUint16(key, uint16(s))
	binary.BigEndian.PutUint32(key[2:], uint32(q))
	off := int((uint64(s)*0x9e3779b97f4a7c15 + uint64(q)*0xbf58476d1ce4e5b9) % uint64(len(g.vals)-userValueLen))
	*e = wal.Event{
		Op: wal.OpPut, Session: g.ids[s], Seq: q, HasIdemKey: true, Time: g.clock,
		Key: key, Value: g.vals[off : off+userValueLen],
	}
}

// fill composes the next batch's events, DupPercent of them duplicates, and
// returns how many are fresh. Events alias g's buffers until the next call.
func (g *generator) fill(dupPercent int) (fresh int) {
	if len(g.keys) < BatchEvents*userKeyLen {
		g.keys = make([]byte, BatchEvents*userKeyLen)
	}
	g.events = g.events[:0]
	for i := range BatchEvents {
		g.clock += 1000
		g.events = append(g.events, wal.Event{})
		e, key := &g.events[i], g.keys[i*userKeyLen:(i+1)*userKeyLen]
		if g.dupAcc += dupPercent; g.dupAcc >= 100 {
			g.dupAcc -= 100
			s := g.rng.IntN(len(g.ids))
			if hwm := len(g.idem[s]); hwm > 0 {
				q := 1 + g.rng.IntN(hwm)
				g.event(e, key, s, session.SeqNo(q))
				e.IdemKey = g.idem[s][q-1]
				continue
			}
			// Never-seen session: nothing to duplicate; emit a fresh event.
		}
		if g.retAcc += g.w.RetryPercent; g.retAcc >= 100 && g.issued > 0 {
			g.retAcc -= 100
			s := g.rng.IntN(len(g.ids))
			q := session.SeqNo(len(g.idem[s]) + 1)
			g.event(e, key, s, q)
			e.IdemKey = g.recent[(g.issued-1-g.rng.IntN(min(g.issued, len(g.recent))))%len(g.recent)]
			g.idem[s] = append(g.idem[s], e.IdemKey)
			continue
		}
		if g.left == 0 {
			g.cur, g.left = g.rng.IntN(len(g.ids)), g.w.Run
		}
		g.left--
		s := g.cur
		g.event(e, key, s, session.SeqNo(len(g.idem[s])+1))
		g.op = e.AppendOpBytes(g.op[:0])
		e.IdemKey = idempotency.DeriveKey(e.Session, e.Seq, g.op)
		g.idem[s] = append(g.idem[s], e.IdemKey)
		g.issue(e.IdemKey)
		fresh++
	}
	return fresh
}

// issue remembers the key of a fresh event for later retries.
func (g *generator) issue(k idempotency.Key) {
	g.recent[g.issued%len(g.recent)] = k
	g.issued++
}

// preloadBatch is the batch size of the preload: large, so that setting up
// 100,000 sessions costs a few commits rather than a hundred synced ones.
const preloadBatch = 25_000

// preloadEvents fills the batch with one fresh event for each of the next
// preloadBatch sessions in order, starting at session from, and returns the
// next start. Used to give every session an HWM before timing.
func (g *generator) preloadEvents(from int) int {
	if len(g.keys) < preloadBatch*userKeyLen {
		g.keys = make([]byte, preloadBatch*userKeyLen)
	}
	g.events = g.events[:0]
	for i := 0; i < preloadBatch && from < len(g.ids); i, from = i+1, from+1 {
		g.clock += 1000
		g.events = append(g.events, wal.Event{})
		e := &g.events[i]
		g.event(e, g.keys[i*userKeyLen:(i+1)*userKeyLen], from, session.SeqNo(len(g.idem[from])+1))
		g.op = e.AppendOpBytes(g.op[:0])
		e.IdemKey = idempotency.DeriveKey(e.Session, e.Seq, g.op)
		g.idem[from] = append(g.idem[from], e.IdemKey)
		g.issue(e.IdemKey)
	}
	return from
}

// encode appends the current events as one shipped batch (g's shard, epoch
// 1) at the next LSNs.
func (g *generator) encode(dst []byte) []byte {
	out, err := wal.AppendBatch(dst[:0], g.shard, 1, g.lsn, g.events)
	if err != nil {
		panic(err) // the generator's events are valid by construction
	}
	g.lsn += uint64(len(g.events))
	return out
}

// rows appends, as length-prefixed records (key length u8, value length u32
// LE, key, value), the state rows that applying the current events writes,
// laid out as session.State lays them out. With writeSet it adds what the
// receiver writes besides, at the tracker's default options: the batch's
// HWM log delta (~21 B per session changed, or carried forward: last logged
// session.DefaultLogBatches batches ago), the HWM rows the tracker
// checkpoints (such sessions already carried twice), the window
// journal value (one 16-byte key per event), the position and the last
// batch's identity. (The deletion of the obsolete delta, one tombstone per
// batch, is left out.)
func (g *generator) rows(dst []byte, writeSet bool) []byte {
	dst = dst[:0]
	row := func(kl, vl int) {
		dst = append(dst, byte(kl))
		dst = binary.LittleEndian.AppendUint32(dst, uint32(vl))
	}
	for i := range g.events {
		e := &g.events[i]
		row(RowKeyLen, RowValueLen)
		dst = append(dst, session.StatePrefix...)
		dst = append(dst, e.Session[:]...)
		dst = append(dst, e.Key...)
		dst = append(dst, 1) // session.State's format version byte
		dst = append(dst, e.Value...)
	}
	if !writeSet {
		return dst
	}
	const hwmValLen, logBatches = 18, session.DefaultLogBatches
	if g.lastChange == nil {
		g.lastChange = make(map[session.ID]int)
		g.carries = make(map[session.ID]int)
		g.logged = make(map[session.ID][2]int64)
		g.changedAt = make([][]session.ID, logBatches+1)
	}
	b := g.batchNo
	g.batchNo++
	logged := g.changedAt[b%(logBatches+1)][:0]
	for i := range g.events {
		e := &g.events[i]
		g.logged[e.Session] = [2]int64{int64(e.Seq), e.Time}
		if id := e.Session; g.lastChange[id] != b+1 {
			g.lastChange[id] = b + 1 // +1: 0 means never
			g.carries[id] = 0
			logged = append(logged, id)
		}
	}
	// Sessions last logged logBatches batches ago: carried forward into
	// this delta (session.maxCarries = 2 times), then rewritten as rows.
	var ckpt []session.ID
	if b >= logBatches {
		for _, id := range g.changedAt[(b-logBatches)%(logBatches+1)] {
			if g.lastChange[id] != b-logBatches+1 {
				continue // logged again since
			}
			if g.carries[id] < 2 {
				g.carries[id]++
				g.lastChange[id] = b + 1
				logged = append(logged, id)
				continue
			}
			delete(g.lastChange, id)
			delete(g.logged, id)
			ckpt = append(ckpt, id)
		}
	}
	g.changedAt[b%(logBatches+1)] = logged
	// The delta, version 2: base, then ID | uvarint(HWM<<1) |
	// varint(base − lastTS) per session.
	g.delta = binary.LittleEndian.AppendUint64(append(g.delta[:0], 2), uint64(g.clock))
	for _, id := range logged {
		l := g.logged[id]
		g.delta = append(g.delta, id[:]...)
		g.delta = binary.AppendUvarint(g.delta, uint64(l[0])<<1)
		g.delta = binary.AppendVarint(g.delta, g.clock-l[1])
	}
	row(len(session.HWMLogPrefix)+8, len(g.delta))
	dst = append(dst, session.HWMLogPrefix...)
	dst = binary.BigEndian.AppendUint64(dst, uint64(b+1))
	dst = append(dst, g.delta...)
	for _, id := range ckpt {
		row(len(session.HWMPrefix)+len(id), hwmValLen)
		dst = append(dst, session.HWMPrefix...)
		dst = append(dst, id[:]...)
		dst = append(dst, make([]byte, hwmValLen)...)
	}
	row(len(keyspace.Journal)+8, 1+16*len(g.events))
	dst = append(dst, keyspace.Journal...)
	dst = binary.BigEndian.AppendUint64(dst, g.lsn)
	dst = append(dst, 1)
	for i := range g.events {
		dst = append(dst, g.events[i].IdemKey[:]...)
	}
	row(len(keyspace.MetaPosition), 9)
	dst = append(dst, keyspace.MetaPosition...)
	dst = append(dst, 1)
	dst = binary.LittleEndian.AppendUint64(dst, g.lsn)
	// The identity of the batch ending at the position (epoch 1; the CRC's
	// value does not change the cost).
	row(len(keyspace.MetaLastBatch), 21)
	dst = append(dst, keyspace.MetaLastBatch...)
	dst = append(dst, 1)
	dst = binary.LittleEndian.AppendUint64(dst, g.lsn)
	dst = binary.LittleEndian.AppendUint64(dst, 1)
	dst = binary.LittleEndian.AppendUint32(dst, 0)
	return dst
}
