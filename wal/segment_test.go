package wal

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/require"

	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/testutil"
)

func TestSegmentNames(t *testing.T) {
	require.Equal(t, "0000000003-00000000000000004096.wal", SegmentName(3, 4096))
	cases := []struct {
		shard uint32
		lsn   uint64
	}{{0, 1}, {3, 4096}, {math.MaxUint32, math.MaxUint64}, {1, 10}, {1, 9}, {2, 1}}
	var names []string
	for _, c := range cases {
		n := SegmentName(c.shard, c.lsn)
		names = append(names, n)
		sh, lsn, err := ParseSegmentName(n)
		require.NoError(t, err)
		require.Equal(t, c.shard, sh)
		require.Equal(t, c.lsn, lsn)
	}
	// Lexical order is (shard, LSN) order.
	sorted := slices.Clone(names)
	sort.Strings(sorted)
	require.Equal(t, []string{SegmentName(0, 1), SegmentName(1, 9), SegmentName(1, 10), SegmentName(2, 1),
		SegmentName(3, 4096), SegmentName(math.MaxUint32, math.MaxUint64)}, sorted)

	for _, bad := range []string{
		"", "x.wal", "0000000003-00000000000000004096", "0000000003-00000000000000004096.WAL",
		"0000000003_00000000000000004096.wal", "000000003-000000000000000004096.wal", // dash moved
		"3-4096.wal", "0000000003-0000000000000004096.wal", "00000000003-00000000000000004096.wal",
		"000000000x-00000000000000004096.wal", "0000000003-0000000000000000409a.wal",
		"+000000003-00000000000000004096.wal", "0000000003-+0000000000000004096.wal",
		"4294967296-00000000000000004096.wal", // shard overflows uint32
		"0000000003-18446744073709551616.wal", // LSN overflows uint64
		"0000000003-99999999999999999999.wal",
		"0000000003-00000000000000000000.wal", // LSN 0 is never used
		"0000000003-00000000000000004096.wal.tmp", " 000000003-00000000000000004096.wal",
	} {
		_, _, err := ParseSegmentName(bad)
		require.ErrorIs(t, err, ErrBadSegmentName, "%q", bad)
	}
}

func testEvents(n int, seed int) []Event {
	evs := make([]Event, n)
	for i := range evs {
		sid := session.ID{byte(seed), byte(i)}
		switch i % 4 {
		case 0:
			evs[i] = Event{Op: OpPut, Session: sid, Seq: session.SeqNo(i + 1), Time: int64(seed*1000 + i),
				Key: []byte(fmt.Sprintf("key-%d-%d", seed, i)), Value: bytes.Repeat([]byte{byte(seed)}, 10+i%7)}
		case 1:
			evs[i] = Event{Op: OpAdd, Session: sid, Seq: session.SeqNo(i + 1), HasIdemKey: true, Key: []byte("ctr"), Delta: int64(i)}
		case 2:
			evs[i] = Event{Op: OpDelete, Session: sid, Seq: session.SeqNo(i + 1), Key: []byte("gone")}
		default:
			evs[i] = Event{Op: OpOpen, Session: sid, Seq: 1}
		}
	}
	return evs
}

// readAll reads every batch from lsn until io.EOF, decoding each.
func readAll(t *testing.T, dir string, shard uint32, lsn uint64) ([]Header, []Event) {
	t.Helper()
	r, err := OpenReader(dir, shard)
	require.NoError(t, err)
	defer r.Close()
	require.NoError(t, r.Seek(lsn))
	var hs []Header
	var all []Event
	for {
		h, raw, err := r.Next()
		if errors.Is(err, io.EOF) {
			return hs, all
		}
		require.NoError(t, err)
		h2, evs, err := DecodeBatch(raw, nil)
		require.NoError(t, err)
		require.Equal(t, h, h2)
		hs = append(hs, h)
		for _, e := range evs {
			e.Key, e.Value = bytes.Clone(e.Key), bytes.Clone(e.Value)
			all = append(all, e)
		}
	}
}

func TestWriterReaderRoundTrip(t *testing.T) {
	dir := t.TempDir()
	w, err := OpenWriter(dir, &WriterOptions{Shard: 5})
	require.NoError(t, err)
	require.Equal(t, uint64(1), w.NextLSN())
	require.Equal(t, uint64(0), w.DurableLSN())
	var want []Event
	for b := 0; b < 10; b++ {
		evs := testEvents(1+b, b)
		h, err := w.Append(uint64(1+b/5), evs)
		require.NoError(t, err)
		require.Equal(t, uint64(len(want)+1), h.FirstLSN)
		require.Equal(t, uint32(5), h.Shard)
		for i := range evs {
			require.Equal(t, h.FirstLSN+uint64(i), evs[i].LSN, "Append sets LSNs")
		}
		want = append(want, evs...)
		require.Equal(t, uint64(len(want)+1), w.NextLSN())
		require.Equal(t, uint64(len(want)), w.DurableLSN())
	}
	// Invalid batches change nothing.
	_, err = w.Append(2, nil)
	require.ErrorIs(t, err, ErrInvalidEvent)
	_, err = w.Append(2, []Event{{Op: 42}})
	require.ErrorIs(t, err, ErrInvalidEvent)
	require.Equal(t, uint64(len(want)+1), w.NextLSN())

	hs, got := readAll(t, dir, 5, 0)
	require.Len(t, hs, 10)
	require.Equal(t, want, got)
	require.Equal(t, uint64(2), hs[9].Epoch)
	// Another shard in the same directory sees nothing.
	hs, _ = readAll(t, dir, 6, 0)
	require.Empty(t, hs)

	require.NoError(t, w.Close())
	require.ErrorIs(t, w.Close(), ErrClosed)
	_, err = w.Append(1, testEvents(1, 0))
	require.ErrorIs(t, err, ErrClosed)

	// Reopen continues the log.
	w, err = OpenWriter(dir, &WriterOptions{Shard: 5})
	require.NoError(t, err)
	require.Equal(t, uint64(len(want)+1), w.NextLSN())
	require.Equal(t, uint64(len(want)), w.DurableLSN())
	evs := testEvents(3, 99)
	_, err = w.Append(3, evs)
	require.NoError(t, err)
	want = append(want, evs...)
	require.NoError(t, w.Close())
	_, got = readAll(t, dir, 5, 0)
	require.Equal(t, want, got)
}

func TestSegmentRollingAndSeek(t *testing.T) {
	dir := t.TempDir()
	w, err := OpenWriter(dir, &WriterOptions{Shard: 2, SegmentSize: 1024, Sync: SyncManual})
	require.NoError(t, err)
	var want []Event
	var hs []Header
	for b := 0; b < 40; b++ {
		evs := testEvents(1+b%6, b)
		h, err := w.Append(1, evs)
		require.NoError(t, err)
		hs = append(hs, h)
		want = append(want, evs...)
	}
	// One oversized batch gets a segment of its own.
	big := []Event{{Op: OpPut, Key: []byte("big"), Value: make([]byte, 5000)}}
	h, err := w.Append(1, big)
	require.NoError(t, err)
	hs = append(hs, h)
	want = append(want, big...)
	require.NoError(t, w.Sync())
	require.Equal(t, w.NextLSN()-1, w.DurableLSN())
	require.NoError(t, w.Close())

	segs, err := listSegments(vfs.Default, dir, 2)
	require.NoError(t, err)
	require.Greater(t, len(segs), 5)
	require.Equal(t, uint64(1), segs[0].first)
	for i, s := range segs {
		st, err := os.Stat(filepath.Join(dir, s.name))
		require.NoError(t, err)
		if i < len(segs)-1 {
			// Rolled segments hold whole batches and respect the limit
			// unless a single batch exceeds it.
			require.True(t, st.Size() <= 1024 || s.first == h.FirstLSN, "segment %s size %d", s.name, st.Size())
		}
	}
	require.Equal(t, SegmentName(2, h.FirstLSN), segs[len(segs)-1].name, "big batch starts a segment")

	_, got := readAll(t, dir, 2, 0)
	require.Equal(t, want, got)

	// Seek to every LSN: the first batch returned contains it.
	r, err := OpenReader(dir, 2)
	require.NoError(t, err)
	defer r.Close()
	for lsn := uint64(1); lsn <= hs[len(hs)-1].LastLSN(); lsn++ {
		require.NoError(t, r.Seek(lsn))
		h, raw, err := r.Next()
		require.NoError(t, err)
		require.True(t, h.FirstLSN <= lsn && lsn <= h.LastLSN(), "lsn %d in [%d,%d]", lsn, h.FirstLSN, h.LastLSN())
		_, evs, err := DecodeBatch(raw, nil)
		require.NoError(t, err)
		require.Equal(t, want[lsn-1].Key, evs[lsn-h.FirstLSN].Key)
	}
	// Past the end: EOF.
	require.NoError(t, r.Seek(w.NextLSN()))
	_, _, err = r.Next()
	require.ErrorIs(t, err, io.EOF)

	// Old segments removed (log trimmed): Seek before the oldest is
	// ErrCompacted, never a silent skip; Seek(0) starts at the oldest.
	for _, s := range segs[:2] {
		require.NoError(t, os.Remove(filepath.Join(dir, s.name)))
	}
	for _, lsn := range []uint64{1, segs[2].first - 1} {
		require.ErrorIs(t, r.Seek(lsn), ErrCompacted)
	}
	require.NoError(t, r.Seek(0))
	h, _, err = r.Next()
	require.NoError(t, err)
	require.Equal(t, segs[2].first, h.FirstLSN)
	require.NoError(t, r.Seek(segs[2].first))
	h, _, err = r.Next()
	require.NoError(t, err)
	require.Equal(t, segs[2].first, h.FirstLSN)

	// The trimmed log still reopens and continues.
	w, err = OpenWriter(dir, &WriterOptions{Shard: 2, SegmentSize: 1024})
	require.NoError(t, err)
	require.Equal(t, hs[len(hs)-1].LastLSN()+1, w.NextLSN())
	require.NoError(t, w.Close())
}

func TestReaderTailsLiveWriter(t *testing.T) {
	dir := t.TempDir()
	w, err := OpenWriter(dir, &WriterOptions{SegmentSize: 2048, Sync: SyncManual})
	require.NoError(t, err)
	r, err := OpenReader(dir, 0)
	require.NoError(t, err)
	defer r.Close()
	_, _, err = r.Next()
	require.ErrorIs(t, err, io.EOF)

	const batches = 300
	done := make(chan error, 1)
	go func() {
		for b := 0; b < batches; b++ {
			if _, err := w.Append(1, testEvents(1+b%5, b)); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	next := uint64(1)
	finished := false
	for n := 0; n < batches; {
		h, raw, err := r.Next()
		if errors.Is(err, io.EOF) {
			if finished {
				t.Fatalf("EOF after writer finished at LSN %d, want %d batches, have %d", next, batches, n)
			}
			select {
			case err := <-done:
				require.NoError(t, err)
				finished = true
			default:
			}
			continue
		}
		require.NoError(t, err)
		require.Equal(t, next, h.FirstLSN)
		_, _, err = DecodeBatch(raw, nil)
		require.NoError(t, err)
		next = h.LastLSN() + 1
		n++
	}
	if !finished {
		require.NoError(t, <-done)
	}
	require.Equal(t, w.NextLSN(), next)
	_, _, err = r.Next()
	require.ErrorIs(t, err, io.EOF)
	require.NoError(t, w.Close())
}

func TestReaderIncompleteTailIsEOF(t *testing.T) {
	dir := t.TempDir()
	w, err := OpenWriter(dir, &WriterOptions{ZeroAhead: -1})
	require.NoError(t, err)
	_, err = w.Append(1, testEvents(3, 1))
	require.NoError(t, err)
	require.NoError(t, w.Close())
	// Simulate a half-written second batch, then its completion.
	second, err := AppendBatch(nil, 0, 1, 4, testEvents(2, 2))
	require.NoError(t, err)
	path := filepath.Join(dir, SegmentName(0, 1))
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	require.NoError(t, err)
	defer f.Close()
	r, err := OpenReader(dir, 0)
	require.NoError(t, err)
	defer r.Close()
	_, _, err = r.Next()
	require.NoError(t, err)
	for cut := 0; cut < len(second); cut += 7 {
		_, _, err = r.Next()
		require.ErrorIs(t, err, io.EOF)
		_, err = f.Write(second[cut:min(cut+7, len(second))])
		require.NoError(t, err)
	}
	h, _, err := r.Next()
	require.NoError(t, err)
	require.Equal(t, uint64(4), h.FirstLSN)
	_, _, err = r.Next()
	require.ErrorIs(t, err, io.EOF)
}

// A batch being written over zeros written ahead is visible in part: a
// Reader bounded by the Writer's NextLSN never reads it before it is whole;
// an unbounded one reads the zeros after the log as its end and a partial
// batch as what it is.
func TestReaderBoundOverZeros(t *testing.T) {
	dir := t.TempDir()
	w, err := OpenWriter(dir, nil)
	require.NoError(t, err)
	first, err := w.Append(1, testEvents(3, 1))
	require.NoError(t, err)
	bound := w.NextLSN()
	require.NoError(t, w.Close())
	path := filepath.Join(dir, SegmentName(0, 1))
	st, err := os.Stat(path)
	require.NoError(t, err)
	require.Greater(t, st.Size(), int64(first.Size()), "zeros written ahead")

	second, err := AppendBatch(nil, 0, 1, 4, testEvents(2, 2))
	require.NoError(t, err)
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	require.NoError(t, err)
	defer f.Close()
	open := func(bounded bool) *Reader {
		r, err := OpenReader(dir, 0)
		require.NoError(t, err)
		t.Cleanup(func() { _ = r.Close() })
		if bounded {
			r.Bound(func() uint64 { return bound })
		}
		_, _, err = r.Next()
		require.NoError(t, err)
		_, _, err = r.Next()
		require.ErrorIs(t, err, io.EOF, "zeros after the log")
		return r
	}
	bounded, unbounded := open(true), open(false)
	partial := 0
	for cut := 0; cut < len(second); cut += 7 {
		_, err = f.WriteAt(second[cut:min(cut+7, len(second))], int64(first.Size()+cut))
		require.NoError(t, err)
		if cut+7 >= len(second) {
			break
		}
		_, _, err = bounded.Next()
		require.ErrorIs(t, err, io.EOF, "bounded, %d bytes written", cut+7)
		if _, _, err = unbounded.Next(); !errors.Is(err, io.EOF) {
			require.True(t, errors.Is(err, ErrCorrupt) || errors.Is(err, ErrChecksum), "%d bytes written: %v", cut+7, err)
			partial++
		}
	}
	require.Positive(t, partial, "the unbounded reader saw the batch in part")
	bound = 6
	h, _, err := bounded.Next()
	require.NoError(t, err)
	require.Equal(t, uint64(4), h.FirstLSN)
	_, _, err = bounded.Next()
	require.ErrorIs(t, err, io.EOF)
}

// buildLog writes a log with a rolled first segment and a last segment of
// three batches, in files that grow with each append (no zeros written
// ahead: the files end where the data does, as a log written without
// WriterOptions.ZeroAhead or by an older binary); it returns the directory,
// the last segment path, the offset of the last batch in it, all events and
// the last batch's first LSN.
func buildLog(t *testing.T, lastBatchEvents int) (dir, lastPath string, lastOff int64, want []Event, lastFirst uint64) {
	return buildLogZeroAhead(t, lastBatchEvents, -1)
}

// buildLogZeroAhead is buildLog with WriterOptions.ZeroAhead zeroAhead.
func buildLogZeroAhead(t *testing.T, lastBatchEvents int, zeroAhead int64) (dir, lastPath string, lastOff int64, want []Event, lastFirst uint64) {
	dir = t.TempDir()
	w, err := OpenWriter(dir, &WriterOptions{SegmentSize: 600, ZeroAhead: zeroAhead})
	require.NoError(t, err)
	for b := 0; b < 4; b++ {
		evs := testEvents(4, b)
		_, err := w.Append(1, evs)
		require.NoError(t, err)
		want = append(want, evs...)
	}
	// Force a fresh last segment with two batches, then the victim.
	require.NoError(t, w.roll(w.NextLSN()))
	w.opts.SegmentSize = 1 << 20
	for b := 0; b < 2; b++ {
		evs := testEvents(2, 10+b)
		_, err := w.Append(1, evs)
		require.NoError(t, err)
		want = append(want, evs...)
	}
	lastPath = filepath.Join(dir, w.seg.name)
	lastOff = w.size
	evs := testEvents(lastBatchEvents, 20)
	h, err := w.Append(2, evs)
	require.NoError(t, err)
	require.Equal(t, lastPath, filepath.Join(dir, w.seg.name))
	want = append(want, evs...)
	require.NoError(t, w.Close())
	segs, err := listSegments(vfs.Default, dir, 0)
	require.NoError(t, err)
	require.Greater(t, len(segs), 2)
	return dir, lastPath, lastOff, want, h.FirstLSN
}

// checkRecovered opens a writer on dir and checks that exactly the events
// before lastFirst survive, and that the log accepts and serves new appends.
func checkRecovered(t *testing.T, dir string, want []Event, lastFirst uint64, what string) {
	t.Helper()
	w, err := OpenWriter(dir, nil)
	require.NoError(t, err, what)
	require.Equal(t, lastFirst, w.NextLSN(), what)
	_, got := readAll(t, dir, 0, 0)
	require.Equal(t, want[:lastFirst-1], got, what)
	more := testEvents(2, 77)
	h, err := w.Append(3, more)
	require.NoError(t, err, what)
	require.Equal(t, lastFirst, h.FirstLSN, what)
	require.NoError(t, w.Close())
	_, got = readAll(t, dir, 0, 0)
	require.Equal(t, append(slices.Clone(want[:lastFirst-1]), more...), got, what)
}

func TestTornTailAtEveryOffset(t *testing.T) {
	n := 3
	if os.Getenv("ONCEWAL_LONG") == "1" {
		n = 40
	}
	dir, lastPath, lastOff, want, lastFirst := buildLog(t, n)
	full, err := os.ReadFile(lastPath)
	require.NoError(t, err)
	name := filepath.Base(lastPath)
	// The intact log recovers everything.
	{
		d := testutil.TempCopy(t, dir)
		w, err := OpenWriter(d, nil)
		require.NoError(t, err)
		require.Equal(t, uint64(len(want)+1), w.NextLSN())
		require.NoError(t, w.Close())
	}
	for cut := lastOff; cut < int64(len(full)); cut++ {
		d := testutil.TempCopy(t, dir)
		require.NoError(t, os.WriteFile(filepath.Join(d, name), full[:cut], 0o644))
		checkRecovered(t, d, want, lastFirst, fmt.Sprintf("cut at %d", cut))
		st, err := os.Stat(filepath.Join(d, name))
		require.NoError(t, err)
		require.Greater(t, st.Size(), lastOff, "appended after truncation")
	}
}

func TestTornTailZeroFilled(t *testing.T) {
	dir, lastPath, lastOff, want, lastFirst := buildLog(t, 60) // last batch > 1 KiB
	full, err := os.ReadFile(lastPath)
	require.NoError(t, err)
	require.Greater(t, len(full)-int(lastOff), 2*sectorSize)
	name := filepath.Base(lastPath)

	// The file grew but none of the last batch reached the disk.
	d := testutil.TempCopy(t, dir)
	z := slices.Clone(full)
	clear(z[lastOff:])
	require.NoError(t, os.WriteFile(filepath.Join(d, name), z, 0o644))
	checkRecovered(t, d, want, lastFirst, "all zero")

	// Header and first pages arrived, a later sector did not.
	d = testutil.TempCopy(t, dir)
	z = slices.Clone(full)
	s := (lastOff/sectorSize + 2) * sectorSize
	clear(z[s:])
	require.NoError(t, os.WriteFile(filepath.Join(d, name), z, 0o644))
	checkRecovered(t, d, want, lastFirst, "zero sectors at end")

	// Zeros after a complete batch.
	d = testutil.TempCopy(t, dir)
	require.NoError(t, os.WriteFile(filepath.Join(d, name), append(slices.Clone(full), make([]byte, 3000)...), 0o644))
	w, err := OpenWriter(d, nil)
	require.NoError(t, err)
	require.Equal(t, uint64(len(want)+1), w.NextLSN())
	require.NoError(t, w.Close())
}

// A torn append whose header never reached the disk (its first pages are
// zero, later pages arrived) is cut; the same damage followed by a later
// batch is an acknowledged batch gone bad, and is refused.
func TestTornTailHeaderLost(t *testing.T) {
	dir, lastPath, lastOff, want, lastFirst := buildLog(t, 60)
	full, err := os.ReadFile(lastPath)
	require.NoError(t, err)
	name := filepath.Base(lastPath)
	boundary := (lastOff/sectorSize + 1) * sectorSize // first sector boundary after the header starts
	for _, zeroTo := range []int64{boundary, boundary + sectorSize, (lastOff/4096 + 1) * 4096} {
		if zeroTo <= lastOff || zeroTo >= int64(len(full)) {
			continue
		}
		d := testutil.TempCopy(t, dir)
		z := slices.Clone(full)
		clear(z[lastOff:zeroTo])
		require.NoError(t, os.WriteFile(filepath.Join(d, name), z, 0o644))
		checkRecovered(t, d, want, lastFirst, fmt.Sprintf("zero from %d to %d", lastOff, zeroTo))

		// The same, but a complete later batch follows: a group commit's
		// unsynced batches, cut with the damaged one, while the damage is
		// within MaxUnsyncedBytes of the end...
		d = testutil.TempCopy(t, dir)
		next, err := AppendBatch(nil, 0, 2, uint64(len(want)+1), testEvents(2, 9))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(d, name), append(slices.Clone(z), next...), 0o644))
		checkRecovered(t, d, want, lastFirst, fmt.Sprintf("zero from %d to %d, then a batch", lastOff, zeroTo))

		// ...and beyond it the later batch was acknowledged: corruption.
		d = testutil.TempCopy(t, dir)
		big := testEvents(1, 9)
		big[0].Op, big[0].Key, big[0].Value = OpPut, []byte("k"), make([]byte, MaxUnsyncedBytes)
		next, err = AppendBatch(nil, 0, 2, uint64(len(want)+1), big)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(d, name), append(slices.Clone(z), next...), 0o644))
		requireOpenFails(t, d, ErrCorrupt, fmt.Sprintf("zero from %d to %d, then a large batch", lastOff, zeroTo))
	}
	// Damage that is not zeros (a flipped magic byte) is corruption.
	d := testutil.TempCopy(t, dir)
	z := slices.Clone(full)
	z[lastOff] ^= 0x01
	require.NoError(t, os.WriteFile(filepath.Join(d, name), z, 0o644))
	requireOpenFails(t, d, ErrCorrupt, "flipped magic")
}

// requireOpenFails checks that OpenWriter refuses dir with err and leaves the
// files untouched.
func requireOpenFails(t *testing.T, dir string, target error, what string) {
	t.Helper()
	before := testutil.DirImage(t, vfs.Default, dir)
	_, err := OpenWriter(dir, nil)
	require.ErrorIs(t, err, target, what)
	require.Equal(t, before, testutil.DirImage(t, vfs.Default, dir), "%s: files changed", what)
}

func TestCorruptionIsNotTruncated(t *testing.T) {
	dir, lastPath, lastOff, _, _ := buildLog(t, 3)
	full, err := os.ReadFile(lastPath)
	require.NoError(t, err)
	name := filepath.Base(lastPath)
	segs, err := listSegments(vfs.Default, dir, 0)
	require.NoError(t, err)
	firstPath := filepath.Join(dir, segs[0].name)
	first, err := os.ReadFile(firstPath)
	require.NoError(t, err)

	mutate := func(path string, b []byte, what string, target error) {
		d := testutil.TempCopy(t, dir)
		require.NoError(t, os.WriteFile(filepath.Join(d, filepath.Base(path)), b, 0o644))
		requireOpenFails(t, d, target, what)
		// The reader reports it too, at open or when it gets there,
		// rather than stopping quietly.
		r, err := OpenReader(d, 0)
		if err == nil {
			defer r.Close()
			for err == nil {
				_, _, err = r.Next()
			}
		}
		require.ErrorIs(t, err, target, "%s: reader", what)
	}
	// Every bit of the last batch's body: no zero sector, so not torn.
	for off := lastOff + HeaderSize; off < int64(len(full)); off++ {
		b := slices.Clone(full)
		b[off] ^= 0x10
		mutate(lastPath, b, fmt.Sprintf("body flip at %d", off), ErrChecksum)
	}
	// A bad batch before the last one.
	b := slices.Clone(full)
	b[HeaderSize+3] ^= 1
	mutate(lastPath, b, "middle batch body", ErrChecksum)
	b = slices.Clone(full)
	b[10] ^= 1
	mutate(lastPath, b, "middle batch header", ErrChecksum)
	// Garbage (not zero) after the last batch, longer than a header.
	mutate(lastPath, append(slices.Clone(full), bytes.Repeat([]byte{0xee}, 100)...), "garbage tail", ErrCorrupt)
	// A non-last segment cut short or with a bad header.
	mutate(firstPath, first[:len(first)-1], "non-last truncated", ErrTruncated)
	mutate(firstPath, first[:len(first)-HeaderSize+1], "non-last short tail", ErrTruncated)
	b = slices.Clone(first)
	b[0] = 'X'
	mutate(firstPath, b, "non-last magic", ErrCorrupt)
	// A batch of the wrong shard.
	b = slices.Clone(full)
	binary.LittleEndian.PutUint32(b[lastOff+8:], 9)
	binary.LittleEndian.PutUint32(b[lastOff+40:], crc32Castagnoli(b[lastOff:lastOff+40]))
	mutate(lastPath, b, "foreign shard", ErrCorrupt)

	// A missing middle segment is a gap.
	d := testutil.TempCopy(t, dir)
	require.NoError(t, os.Remove(filepath.Join(d, segs[1].name)))
	requireOpenFails(t, d, ErrCorrupt, "gap")
	r, err := OpenReader(d, 0)
	require.NoError(t, err)
	for err == nil {
		_, _, err = r.Next()
	}
	require.ErrorIs(t, err, ErrCorrupt)
	require.NoError(t, r.Close())
	// A segment whose name disagrees with its first batch.
	d = testutil.TempCopy(t, dir)
	require.NoError(t, os.Rename(filepath.Join(d, name), filepath.Join(d, SegmentName(0, segs[len(segs)-1].first+1))))
	requireOpenFails(t, d, ErrCorrupt, "renamed")
	// A malformed .wal name.
	d = testutil.TempCopy(t, dir)
	require.NoError(t, os.WriteFile(filepath.Join(d, "junk.wal"), nil, 0o644))
	requireOpenFails(t, d, ErrBadSegmentName, "bad name")
	_, err = OpenReader(d, 0)
	require.ErrorIs(t, err, ErrBadSegmentName)
	// Any other file makes it a non-WAL directory.
	d = testutil.TempCopy(t, dir)
	require.NoError(t, os.WriteFile(filepath.Join(d, "LOCK"), nil, 0o644))
	requireOpenFails(t, d, ErrNotWAL, "foreign file")
	_, err = OpenReader(d, 0)
	require.ErrorIs(t, err, ErrNotWAL)
}

func TestOpenReaderMissingDir(t *testing.T) {
	_, err := OpenReader(filepath.Join(t.TempDir(), "nope"), 0)
	require.ErrorIs(t, err, os.ErrNotExist)
	r, err := OpenReader(t.TempDir(), 0)
	require.NoError(t, err)
	require.NoError(t, r.Seek(5))
	_, _, err = r.Next()
	require.ErrorIs(t, err, io.EOF)
	require.NoError(t, r.Close())
	_, _, err = r.Next()
	require.ErrorIs(t, err, ErrClosed)
}

func TestConcurrentAppends(t *testing.T) {
	dir := t.TempDir()
	w, err := OpenWriter(dir, &WriterOptions{SegmentSize: 4096, Sync: SyncManual})
	require.NoError(t, err)
	const goroutines, perG = 4, 25
	errs := make(chan error, goroutines)
	for g := 0; g < goroutines; g++ {
		go func() {
			for i := 0; i < perG; i++ {
				evs := testEvents(3, g*1000+i)
				h, err := w.Append(1, evs)
				if err == nil && (evs[0].LSN != h.FirstLSN || evs[2].LSN != h.LastLSN()) {
					err = fmt.Errorf("LSNs %d..%d, header %d..%d", evs[0].LSN, evs[2].LSN, h.FirstLSN, h.LastLSN())
				}
				if err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for g := 0; g < goroutines; g++ {
		require.NoError(t, <-errs)
	}
	require.Equal(t, uint64(goroutines*perG*3+1), w.NextLSN())
	require.NoError(t, w.Close())
	hs, evs := readAll(t, dir, 0, 0)
	require.Len(t, hs, goroutines*perG)
	for i, e := range evs {
		require.Equal(t, uint64(i+1), e.LSN)
	}
}
