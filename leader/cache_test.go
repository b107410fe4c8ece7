package leader

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/oncewal/oncewal/replication/inprocess"

	"github.com/oncewal/oncewal/testutil"
	"github.com/oncewal/oncewal/wal"
)

func TestBatchCache(t *testing.T) {
	m := newMemLog(0)
	var hs []wal.Header
	var raws [][]byte
	for i := 0; i < 6; i++ {
		h, raw := m.appendBatch(t, 1, 2) // LSNs 1-2, 3-4, …, 11-12
		hs, raws = append(hs, h), append(raws, raw)
	}
	size := int64(len(raws[0])) // every batch has the same size
	c := newBatchCache(3 * size)
	if _, _, ok, atEnd := c.get(1); ok || atEnd {
		t.Fatal("an unfed cache holds nothing and knows no end")
	}
	if _, ok := c.bytesAfter(0); ok {
		t.Fatal("an unfed cache knows no lag")
	}
	for i := range hs {
		c.add(hs[i], raws[i])
		raws[i][wal.HeaderSize] ^= 0xff // the caller reuses its buffer: the cache copied it
		raws[i][wal.HeaderSize] ^= 0xff
		if st := c.stats(); int64(st.Bytes) > 3*size || st.Batches > 3 {
			t.Fatalf("over its bound: %+v", st)
		}
	}
	st := c.stats()
	if st != (CacheStats{Batches: 3, Bytes: uint64(3 * size), FirstLSN: 7, LastLSN: 12, Appended: 6}) {
		t.Fatalf("stats %+v", st)
	}
	for lsn, want := range map[uint64]int{6: -1, 7: 3, 8: 3, 9: 4, 12: 5} {
		h, raw, ok, atEnd := c.get(lsn)
		if atEnd || ok != (want >= 0) || (ok && (h != hs[want] || string(raw) != string(raws[want]))) {
			t.Errorf("get(%d) = %+v %v %v", lsn, h, ok, atEnd)
		}
	}
	if _, _, ok, atEnd := c.get(13); ok || !atEnd {
		t.Fatal("13 is the end: not appended yet")
	}
	if _, _, ok, atEnd := c.get(14); ok || atEnd {
		t.Fatal("14 is beyond the end")
	}
	for lsn, want := range map[uint64]int64{12: 0, 10: size, 9: 2 * size, 8: 2 * size, 6: 3 * size} {
		if b, ok := c.bytesAfter(lsn); !ok || int64(b) != want {
			t.Errorf("bytesAfter(%d) = %d %v, want %d", lsn, b, ok, want)
		}
	}
	if _, ok := c.bytesAfter(5); ok {
		t.Fatal("below the cache the lag is not known exactly")
	}
	// A batch that does not continue the cache restarts it.
	m.append(t, 1, 1) // 13: missed
	h2, raw2 := m.appendBatch(t, 1, 1)
	c.add(h2, raw2) // 14
	if st := c.stats(); st.Batches != 1 || st.FirstLSN != 14 || st.Restarts != 1 {
		t.Fatalf("after a gap: %+v", st)
	}
	if _, _, ok, _ := c.get(13); ok {
		t.Fatal("13 never reached the cache")
	}
	// A batch larger than the whole cache is not held; the end moves on.
	big := newMemLog(0)
	bh, braw := big.appendBatch(t, 1, 100)
	small := newBatchCache(int64(len(braw)) - 1)
	small.add(bh, braw)
	if st := small.stats(); st.Batches != 0 || st.LastLSN != 100 {
		t.Fatalf("oversized batch: %+v", st)
	}
	if _, _, ok, atEnd := small.get(101); ok || !atEnd {
		t.Fatal("the end follows an oversized batch")
	}
}

// cacheRig is a fanoutRig whose log is fed to the Fanout through Appended,
// as a leader does, and that no Notify or poll wakes: only Appended does.
func newCacheRig(t *testing.T, ids []string, cacheBytes int64, more ...func(*FanoutOptions)) *fanoutRig {
	return newFanoutRig(t, ids, nil, 1, func(o *FanoutOptions) {
		o.Notify = nil
		o.PollInterval = time.Hour
		o.RetransmitTimeout = time.Hour
		o.CacheBytes = cacheBytes
		for _, m := range more {
			m(o)
		}
	})
}

func (r *fanoutRig) appendFed(n int) wal.Header {
	h, raw := r.log.appendBatch(r.t, 1, n)
	r.fo.Appended(h, raw)
	return h
}

// TestFanoutReadsTheWALOnce: followers at the tail take every batch from
// the cache Appended feeds; none of them opens the WAL.
func TestFanoutReadsTheWALOnce(t *testing.T) {
	base := runtime.NumGoroutine()
	r := newCacheRig(t, []string{"a", "b", "c"}, 0)
	r.appendFed(1)
	for _, id := range []string{"a", "b", "c"} {
		r.start(id)
	}
	for i := 0; i < 300; i++ {
		r.appendFed(1 + i%3)
	}
	r.waitAcked(r.log.lastLSN(), AckAll)
	r.stop()
	for _, id := range []string{"a", "b", "c"} {
		r.fs[id].checkExactlyOnce(t, r.log)
		if st := r.stats(id); st.DiskReads != 0 || st.BatchesSent != 301 {
			t.Fatalf("%s: %+v", id, st)
		}
	}
	if n := r.log.opens.Load(); n != 0 {
		t.Fatalf("the WAL was opened %d times", n)
	}
	if st := r.fo.Stats().Cache; st.Hits < 3*301 || st.Appended != 301 || st.LastLSN != r.log.lastLSN() {
		t.Fatalf("cache %+v", st)
	}
	testutil.WaitGoroutines(t, base)
}

// TestFanoutBehindTheCacheReadsTheWAL: a follower that connects after the
// cache moved past its position reads the WAL with its own reader up to the
// cache, then rejoins it; the cache stays within its bound.
func TestFanoutBehindTheCacheReadsTheWAL(t *testing.T) {
	m := newMemLog(2)
	_, raw := m.appendBatch(t, 1, 1)
	size := int64(len(raw))
	r := newCacheRig(t, []string{"a", "late"}, 10*size)
	r.appendFed(1)
	r.start("a")
	for i := 0; i < 99; i++ {
		// Paced as a follower at the tail keeps up: a burst larger than
		// the cache would push even it onto the WAL.
		r.waitAcked(r.appendFed(1).FirstLSN-1, AckOne)
		if st := r.fo.Stats().Cache; int64(st.Bytes) > 10*size {
			t.Fatalf("cache over its bound: %+v", st)
		}
	}
	r.waitAcked(100, AckOne)
	cache := r.fo.Stats().Cache
	if cache.FirstLSN != 91 || cache.Batches != 10 {
		t.Fatalf("cache %+v", cache)
	}
	r.start("late")
	r.waitAcked(100, AckAll)
	for i := 0; i < 50; i++ {
		r.waitAcked(r.appendFed(1).FirstLSN-1, AckAll)
	}
	r.waitAcked(150, AckAll)
	r.stop()
	r.fs["a"].checkExactlyOnce(t, r.log)
	r.fs["late"].checkExactlyOnce(t, r.log)
	if a, late := r.stats("a"), r.stats("late"); a.DiskReads != 0 || late.DiskReads != 90 || late.BatchesSent != 150 {
		t.Fatalf("a %+v\nlate %+v", a, late)
	}
	if n := r.log.opens.Load(); n != 1 {
		t.Fatalf("the WAL was opened %d times, want once (by the late follower)", n)
	}
}

// TestFanoutMissedAppended: a batch that never reached Appended restarts
// the cache; a follower that needs it reads it from the WAL.
func TestFanoutMissedAppended(t *testing.T) {
	r := newCacheRig(t, []string{"a"}, 0)
	defer r.stop()
	r.appendFed(1)
	r.start("a")
	r.waitAcked(1, AckAll)
	r.log.append(t, 1, 1) // LSN 2: Appended missed
	r.appendFed(1)        // LSN 3 restarts the cache and wakes the stream
	r.waitAcked(3, AckAll)
	if st := r.stats("a"); st.DiskReads != 1 {
		t.Fatalf("a %+v", st)
	}
	if st := r.fo.Stats().Cache; st.Restarts != 1 || st.FirstLSN != 3 {
		t.Fatalf("cache %+v", st)
	}
	// Bad input is ignored and logged.
	h, raw := newMemLog(7).appendBatch(t, 1, 1)
	r.fo.Appended(h, raw)
	h, raw = r.log.appendBatch(t, 1, 1)
	r.fo.Appended(h, raw[:len(raw)-1])
	if st := r.fo.Stats().Cache; st.Appended != 2 || !r.logs.find("Appended ignored") {
		t.Fatalf("cache %+v", st)
	}
	r.fo.Appended(h, raw)
	r.waitAcked(4, AckAll)
}

// TestShipperCache: the Shipper shares the Fanout's stream, cache included.
func TestShipperCache(t *testing.T) {
	m := newMemLog(0)
	tr := inprocess.New(inprocess.FaultsNone, 1)
	defer tr.Close()
	o := testShipperOptions(tr, m)
	o.Notify, o.PollInterval = nil, time.Hour
	s, err := NewShipper(&o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	h, raw := m.appendBatch(t, 1, 1)
	s.Appended(h, raw)
	f := &fakeFollower{}
	go f.serve(ctx, tr)
	for i := 0; i < 20; i++ {
		h, raw := m.appendBatch(t, 1, 2)
		s.Appended(h, raw)
	}
	if err := s.WaitAcked(ctx, m.lastLSN()); err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	f.checkExactlyOnce(t, m)
	if m.opens.Load() != 0 {
		t.Fatalf("the Shipper opened the WAL %d times", m.opens.Load())
	}
}

// TestFanoutReaderBehindRetention: a follower whose next LSN the WAL no
// longer holds (the reader says replication.ErrBehindRetention) has its connection ended
// and counted as a refusal, instead of being retried forever; the others
// stream on.
func TestFanoutReaderBehindRetention(t *testing.T) {
	r := newFanoutRig(t, []string{"old", "new"}, nil, 1, func(o *FanoutOptions) { o.CacheBytes = -1 })
	for i := 0; i < 10; i++ {
		r.log.append(t, 1, 1)
	}
	r.log.compacted.Store(6)
	r.fs["new"].applied = 5 // a follower that is past the deleted part
	r.start("old")
	r.start("new")
	r.waitAcked(10, AckOne)
	for r.stats("old").Refused.BehindRetention < 2 {
		time.Sleep(time.Millisecond)
	}
	r.stop()
	if old := r.stats("old"); old.AckedLSN != 0 || old.BatchesSent != 0 || old.Connected {
		t.Fatalf("old %+v", old)
	}
	if r.fs["old"].position() != 0 || r.fs["new"].position() != 10 {
		t.Fatalf("old at %d, new at %d", r.fs["old"].position(), r.fs["new"].position())
	}
	if !r.logs.find("follower=old", "behind retention") {
		t.Fatalf("no log line: %s", r.logs)
	}
}
