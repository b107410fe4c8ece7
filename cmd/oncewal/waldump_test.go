package main

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/oncewal/oncewal/idempotency"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/wal"
)

const baseTS = int64(1_790_000_000_000_000_000) // 2026-09-21, unix ns

// dumped is an event as waldump reports it: the event plus its batch's shard
// and epoch.
type dumped struct {
	Shard uint32
	Epoch uint64
	wal.Event
}

// testBatches returns batches covering every op, with and without
// idempotency keys, empty and binary keys and values, and negative deltas.
// Session IDs are fixed so that runs compare; Seq follows each session.
func testBatches(shard uint32) [][]wal.Event {
	return testBatchesAt(shard, baseTS+int64(shard)*1000)
}

func testBatchesAt(shard uint32, ts int64) [][]wal.Event {
	a := session.ID{0xa0, byte(shard)}
	b := session.ID{0xb0, byte(shard), 0xff}
	seq := map[session.ID]session.SeqNo{}
	ev := func(id session.ID, op wal.Op, key, value string, delta int64, keyed bool) wal.Event {
		seq[id]++
		ts += 17
		e := wal.Event{Op: op, Session: id, Seq: seq[id], Time: ts, Delta: delta}
		if key != "" || op == wal.OpPut || op == wal.OpDelete || op == wal.OpAdd {
			e.Key = []byte(key)
		}
		if value != "" {
			e.Value = []byte(value)
		}
		if len(e.Key) == 0 {
			e.Key = nil
		}
		if keyed {
			e.HasIdemKey = true
			e.IdemKey = idempotency.DeriveKey(id, e.Seq, e.AppendOpBytes(nil))
		}
		return e
	}
	return [][]wal.Event{
		{
			ev(a, wal.OpOpen, "", "", 0, false),
			ev(a, wal.OpPut, "user", "alice", 0, true),
			ev(a, wal.OpAdd, "n", "", 5, true),
		},
		{
			ev(b, wal.OpOpen, "", "", 0, true),
			ev(b, wal.OpPut, "", "empty key", 0, false), // empty key is valid
			ev(b, wal.OpPut, "bin\x00\xff", "\x00\x01\x02\xfe", 0, true),
			ev(a, wal.OpAdd, "n", "", -12, true),
		},
		{
			ev(a, wal.OpPut, "blank", "", 0, false), // empty value
			ev(a, wal.OpDelete, "user", "", 0, true),
			ev(b, wal.OpAdd, "n", "", 0, false), // zero delta still carries "delta"
			ev(a, wal.OpClose, "", "", 0, false),
		},
		{
			ev(b, wal.OpPut, strings.Repeat("k", 100), strings.Repeat("v", 300), 0, true),
			ev(b, wal.OpClose, "", "", 0, true),
		},
	}
}

// writeLog appends batches to a WAL in dir with the wal.Writer and returns
// what waldump should report, LSNs included.
func writeLog(t *testing.T, dir string, shard uint32, segSize int64, batches [][]wal.Event) []dumped {
	t.Helper()
	w, err := wal.OpenWriter(dir, &wal.WriterOptions{Shard: shard, SegmentSize: segSize})
	if err != nil {
		t.Fatal(err)
	}
	var want []dumped
	for i, evs := range batches {
		epoch := uint64(1 + i/2) // epochs change inside the log
		evs = slices.Clone(evs)
		h, err := w.Append(epoch, evs)
		if err != nil {
			t.Fatal(err)
		}
		if h.Count != uint32(len(evs)) || h.Shard != shard || h.Epoch != epoch {
			t.Fatalf("Append returned header %+v for %d events", h, len(evs))
		}
		for j := range evs {
			e := evs[j]
			e.LSN = h.FirstLSN + uint64(j)
			want = append(want, dumped{shard, epoch, e})
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return want
}

// parseJSONLines decodes waldump --json output strictly: every line is one
// object with exactly the fields its op calls for.
func parseJSONLines(t *testing.T, out string) []dumped {
	t.Helper()
	var got []dumped
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var m map[string]json.RawMessage
		if err := json.Unmarshal(line, &m); err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		var d dumped
		str := func(k string) string {
			var s string
			if err := json.Unmarshal(m[k], &s); err != nil {
				t.Fatalf("line %s: field %q: %v", line, k, err)
			}
			return s
		}
		num := func(k string, v any) {
			if err := json.Unmarshal(m[k], v); err != nil {
				t.Fatalf("line %s: field %q: %v", line, k, err)
			}
		}
		b64 := func(k string) []byte {
			v, err := base64.StdEncoding.DecodeString(str(k))
			if err != nil {
				t.Fatalf("line %s: field %q: %v", line, k, err)
			}
			if len(v) == 0 {
				return nil
			}
			return v
		}
		num("lsn", &d.LSN)
		num("shard", &d.Shard)
		num("epoch", &d.Epoch)
		num("seq", &d.Seq)
		num("ts", &d.Time)
		op, err := wal.ParseOp(str("op"))
		if err != nil {
			t.Fatalf("line %s: %v", line, err)
		}
		d.Op = op
		sid, err := session.ParseID(str("session"))
		if err != nil {
			t.Fatalf("line %s: %v", line, err)
		}
		d.Session = sid
		if string(m["idem"]) != "null" {
			k, err := idempotency.ParseKey(str("idem"))
			if err != nil {
				t.Fatalf("line %s: %v", line, err)
			}
			d.HasIdemKey, d.IdemKey = true, k
		}
		fields := []string{"lsn", "shard", "epoch", "op", "session", "seq", "idem", "ts"}
		switch op {
		case wal.OpPut:
			d.Key, d.Value = b64("key"), b64("value")
			fields = append(fields, "key", "value")
		case wal.OpDelete:
			d.Key = b64("key")
			fields = append(fields, "key")
		case wal.OpAdd:
			d.Key = b64("key")
			num("delta", &d.Delta)
			fields = append(fields, "key", "delta")
		}
		var keys []string
		for k := range m {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		slices.Sort(fields)
		if !slices.Equal(keys, fields) {
			t.Fatalf("line %s: fields %v, want %v", line, keys, fields)
		}
		got = append(got, d)
	}
	return got
}

func diffEvents(t *testing.T, got, want []dumped) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("got %d events, want %d", len(got), len(want))
	}
	for i := range want {
		g, w := got[i], want[i]
		if g.LSN != w.LSN || g.Shard != w.Shard || g.Epoch != w.Epoch || g.Op != w.Op || g.Session != w.Session ||
			g.Seq != w.Seq || g.HasIdemKey != w.HasIdemKey || g.IdemKey != w.IdemKey || g.Time != w.Time ||
			!bytes.Equal(g.Key, w.Key) || !bytes.Equal(g.Value, w.Value) || g.Delta != w.Delta {
			t.Errorf("event %d:\n got %+v\nwant %+v", i, g, w)
		}
	}
}

func segments(t *testing.T, dir string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, "*.wal"))
	if err != nil || len(m) == 0 {
		t.Fatalf("no segments in %s (%v)", dir, err)
	}
	slices.Sort(m)
	return m
}

func TestWaldumpJSONRoundTrip(t *testing.T) {
	dir := t.TempDir()
	want := writeLog(t, dir, 0, 0, testBatches(0))

	out, errOut, code := runCmd(t, "waldump", dir, "--json")
	if code != exitOK || errOut != "" {
		t.Fatalf("waldump DIR --json: code %d, stderr %q", code, errOut)
	}
	diffEvents(t, parseJSONLines(t, out), want)

	// The same through the single segment file.
	segs := segments(t, dir)
	if len(segs) == 1 {
		out, errOut, code = runCmd(t, "waldump", "--json", segs[0])
		if code != exitOK || errOut != "" {
			t.Fatalf("waldump SEGMENT --json: code %d, stderr %q", code, errOut)
		}
		diffEvents(t, parseJSONLines(t, out), want)
	}
}

// Small segments: the log spans several files; the directory dump follows
// them and each file dumps its own part.
func TestWaldumpSeveralSegments(t *testing.T) {
	dir := t.TempDir()
	var batches [][]wal.Event
	for range 5 {
		batches = append(batches, testBatches(0)...)
	}
	// Seqs restart per testBatches call, which the WAL does not check.
	want := writeLog(t, dir, 0, 512, batches)
	out, errOut, code := runCmd(t, "waldump", dir, "--json")
	if code != exitOK {
		t.Fatalf("code %d, stderr %q", code, errOut)
	}
	diffEvents(t, parseJSONLines(t, out), want)

	segs := segments(t, dir)
	if len(segs) < 3 {
		t.Fatalf("want a log of several segments, got %d", len(segs))
	}
	var all []dumped
	for _, seg := range segs {
		out, errOut, code := runCmd(t, "waldump", seg, "--json")
		if code != exitOK {
			t.Fatalf("%s: code %d, stderr %q", seg, code, errOut)
		}
		all = append(all, parseJSONLines(t, out)...)
	}
	diffEvents(t, all, want)

	// After retention deleted the oldest segments, --from below the first
	// retained LSN dumps from that LSN (not an error).
	w, err := wal.OpenWriter(dir, &wal.WriterOptions{SegmentSize: 512})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := w.DeleteBelow(want[len(want)/2].LSN); err != nil || n < 2 {
		t.Fatalf("DeleteBelow: %d, %v", n, err)
	}
	first := w.FirstLSN()
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	out, errOut, code = runCmd(t, "waldump", dir, "--json", "--from", "1")
	if code != exitOK {
		t.Fatalf("--from 1 after retention: code %d, stderr %q", code, errOut)
	}
	diffEvents(t, parseJSONLines(t, out), want[first-1:])
}

// A log that holds no batch yet — a promoted leader's shard, its one
// segment named after the store's applied LSN + 1 and empty — dumps as
// empty, not as a reader that stopped short of the segments.
func TestWaldumpEmptyLogAfterPromotion(t *testing.T) {
	dir := t.TempDir()
	w, err := wal.OpenWriter(dir, &wal.WriterOptions{Shard: 1, FirstLSN: 287})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := runCmd(t, "waldump", dir, "--json")
	if code != exitOK || len(parseJSONLines(t, out)) != 0 {
		t.Fatalf("code %d, stdout %q, stderr %q", code, out, errOut)
	}
}

func TestWaldumpShardsAndFrom(t *testing.T) {
	dir := t.TempDir()
	want3 := writeLog(t, dir, 3, 0, testBatches(3))
	want0 := writeLog(t, dir, 0, 0, testBatches(0))

	out, _, code := runCmd(t, "waldump", "--json", dir)
	if code != exitOK {
		t.Fatalf("code %d", code)
	}
	diffEvents(t, parseJSONLines(t, out), append(slices.Clone(want0), want3...)) // shard order

	out, _, code = runCmd(t, "waldump", dir, "--json", "--shard", "3")
	if code != exitOK {
		t.Fatalf("code %d", code)
	}
	diffEvents(t, parseJSONLines(t, out), want3)

	// --from in the middle of the second batch: events from that LSN on.
	from := want0[4].LSN
	out, errOut, code := runCmd(t, "waldump", dir, "--json", "--shard=0", "--from", fmt.Sprint(from))
	if code != exitOK {
		t.Fatalf("code %d, stderr %q", code, errOut)
	}
	diffEvents(t, parseJSONLines(t, out), want0[4:])
	out, _, code = runCmd(t, "waldump", segments(t, dir)[0], "--json", "--from", fmt.Sprint(from))
	if code != exitOK {
		t.Fatalf("code %d", code)
	}
	diffEvents(t, parseJSONLines(t, out), want0[4:])

	// Past the end: nothing, and no error.
	out, errOut, code = runCmd(t, "waldump", dir, "--json", "--from", "1000")
	if code != exitOK || out != "" {
		t.Fatalf("--from past the end: code %d, stdout %q, stderr %q", code, out, errOut)
	}

	_, errOut, code = runCmd(t, "waldump", dir, "--shard", "7")
	if code != exitFailure || !strings.Contains(errOut, "no segments of shard 7") || !strings.Contains(errOut, "0, 3") {
		t.Errorf("--shard 7: code %d, stderr %q", code, errOut)
	}
	_, errOut, code = runCmd(t, "waldump", segments(t, dir)[0], "--shard", "3")
	if code != exitFailure || !strings.Contains(errOut, "shard 0") {
		t.Errorf("segment of shard 0 with --shard 3: code %d, stderr %q", code, errOut)
	}
	_, errOut, code = runCmd(t, "waldump", dir, "--shard", "-5")
	if code != exitUsage {
		t.Errorf("--shard -5: code %d, stderr %q", code, errOut)
	}
}

func TestWaldumpHuman(t *testing.T) {
	dir := t.TempDir()
	batches := testBatches(0)
	want := writeLog(t, dir, 0, 0, batches)
	out, errOut, code := runCmd(t, "waldump", dir)
	if code != exitOK || errOut != "" {
		t.Fatalf("code %d, stderr %q", code, errOut)
	}
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	// One line per batch header, one per event, one summary.
	if len(lines) != len(batches)+len(want)+1 {
		t.Fatalf("%d lines for %d batches and %d events:\n%s", len(lines), len(batches), len(want), out)
	}
	i := 0
	for bi, evs := range batches {
		first := want[i].LSN
		head := fmt.Sprintf("batch: shard 0, epoch %d, lsn %d..%d, events %d,", want[i].Epoch, first, first+uint64(len(evs))-1, len(evs))
		if !strings.HasPrefix(lines[bi+i], head) {
			t.Errorf("line %d = %q, want prefix %q", bi+i, lines[bi+i], head)
		}
		for range evs {
			w := want[i]
			l := lines[bi+i+1]
			pre := fmt.Sprintf("  lsn: %d, op: %s, session: %s, seq: %d, ", w.LSN, w.Op, w.Session, w.Seq)
			if !strings.HasPrefix(l, pre) {
				t.Errorf("line %q, want prefix %q", l, pre)
			}
			if w.Op == wal.OpPut && !strings.Contains(l, fmt.Sprintf("value: %s", quote(w.Value, maxShown))) {
				t.Errorf("line %q lacks the value", l)
			}
			i++
		}
	}
	if !strings.Contains(out, "…") || !strings.Contains(out, "(300 B)") {
		t.Errorf("long value not cut:\n%s", out)
	}
	if last := lines[len(lines)-1]; last != fmt.Sprintf("shard 0: %d batches, %d events printed, lsn 1..%d", len(batches), len(want), len(want)) {
		t.Errorf("summary %q", last)
	}
}

// flip inverts one byte of a file.
func flip(t *testing.T, path string, off int64) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if off < 0 {
		off += int64(len(b))
	}
	b[off] ^= 0xff
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestWaldumpCorrupt(t *testing.T) {
	batches := testBatches(0)
	size0 := func() int64 { // encoded size of the first batch
		b, err := wal.AppendBatch(nil, 0, 1, 1, batches[0])
		if err != nil {
			t.Fatal(err)
		}
		return int64(len(b))
	}()
	second := uint64(len(batches[0]) + 1) // first LSN of batch 2

	for _, tc := range []struct {
		name  string
		spoil func(seg string)
		want  []string
	}{
		{"body byte", func(seg string) { flip(t, seg, size0+wal.HeaderSize+3) },
			// The file is read directly, the directory through wal.Reader,
			// which checks the body before handing out the batch.
			[]string{fmt.Sprintf("LSN %d (shard 0", second), "corrupt batch at ", "wal.ErrChecksum"}},
		{"header byte", func(seg string) { flip(t, seg, size0+21) },
			[]string{fmt.Sprintf("corrupt batch at expected LSN %d", second), "wal.ErrChecksum"}},
		{"torn tail", func(seg string) {
			must(t, os.Truncate(seg, segmentDataEnd(t, seg)-3))
		}, []string{"incomplete batch at LSN", "wal.ErrTruncated"}},
		{"trailing garbage", func(seg string) { writeAtDataEnd(t, seg, []byte("garbage")) },
			// Over the zeros written ahead: a header that does not decode.
			[]string{"corrupt batch at expected LSN", "bad magic", "wal.ErrCorrupt"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			want := writeLog(t, dir, 0, 0, batches)
			segs := segments(t, dir)
			tc.spoil(segs[len(segs)-1])
			for _, path := range []string{segs[0], dir} {
				for _, mode := range [][]string{{"--json"}, nil} {
					args := append([]string{"waldump", path}, mode...)
					out, errOut, code := runCmd(t, args...)
					if code != exitFailure {
						t.Errorf("%q: code %d, want %d; stderr %q", args, code, exitFailure, errOut)
					}
					for _, w := range tc.want {
						if !strings.Contains(errOut, w) {
							t.Errorf("%q: stderr %q lacks %q", args, errOut, w)
						}
					}
					if mode != nil && tc.name != "torn tail" && tc.name != "trailing garbage" {
						// What precedes the bad batch is still printed.
						diffEvents(t, parseJSONLines(t, out), want[:len(batches[0])])
					}
				}
			}
		})
	}
}

func TestWaldumpBadPaths(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name string
		path string
		want string
	}{
		{"missing", filepath.Join(dir, "nope"), "no such file or directory"},
		{"empty dir", dir, "no WAL segments"},
	} {
		_, errOut, code := runCmd(t, "waldump", tc.path)
		if code != exitFailure || !strings.Contains(errOut, tc.want) {
			t.Errorf("%s: code %d, stderr %q, want %q", tc.name, code, errOut, tc.want)
		}
	}

	bad := filepath.Join(dir, "junk.wal")
	if err := os.WriteFile(bad, []byte("not a wal"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, errOut, code := runCmd(t, "waldump", dir)
	if code != exitFailure || !strings.Contains(errOut, "junk.wal") || !strings.Contains(errOut, "bad segment name") {
		t.Errorf("malformed segment name: code %d, stderr %q", code, errOut)
	}
	_, errOut, code = runCmd(t, "waldump", bad)
	if code != exitFailure || !strings.Contains(errOut, "wal.ErrTruncated") {
		t.Errorf("short junk file: code %d, stderr %q", code, errOut)
	}
	if err := os.WriteFile(bad, bytes.Repeat([]byte("x"), 100), 0o644); err != nil {
		t.Fatal(err)
	}
	_, errOut, code = runCmd(t, "waldump", bad)
	if code != exitFailure || !strings.Contains(errOut, "corrupt batch at the start of the file") || !strings.Contains(errOut, "wal.ErrCorrupt") {
		t.Errorf("junk file: code %d, stderr %q", code, errOut)
	}
}

// TestWaldumpCorruptFirstHeaderShard: a file whose first batch header is
// corrupt has no header to take the shard from; waldump names the shard
// its file name shows (a segment name, also with a suffix such as a
// backup's), else --shard, else says it is unknown. It printed "shard 0"
// for a file of shard 1.
func TestWaldumpCorruptFirstHeaderShard(t *testing.T) {
	src := t.TempDir()
	writeLog(t, src, 1, 0, testBatches(1))
	seg := segments(t, src)[0]
	flip(t, seg, 21) // inside the first header: its CRC fails
	raw, err := os.ReadFile(seg)
	if err != nil {
		t.Fatal(err)
	}
	name := filepath.Base(seg)
	for _, tc := range []struct {
		file  string
		flags []string
		want  string
	}{
		{name, nil, "(shard 1, "},
		{name + ".bak", nil, "(shard 1, "},
		{"copy.wal", nil, "(shard unknown, "},
		{"copy.wal", []string{"--shard", "1"}, "(shard 1, "},
	} {
		path := filepath.Join(t.TempDir(), tc.file)
		if err := os.WriteFile(path, raw, 0o644); err != nil {
			t.Fatal(err)
		}
		args := append([]string{"waldump", path}, tc.flags...)
		_, errOut, code := runCmd(t, args...)
		if code != exitFailure || !strings.Contains(errOut, "corrupt batch at ") || !strings.Contains(errOut, tc.want) ||
			strings.Contains(errOut, "shard 0") {
			t.Errorf("%q: exit %d, stderr %q; want %q", args[1:], code, errOut, tc.want)
		}
	}
}

// segmentDataEnd is where the batches of the segment file at path end and
// the zeros its writer wrote ahead begin (wal.DataEnd).
func segmentDataEnd(t *testing.T, path string) int64 {
	t.Helper()
	f, err := os.Open(path)
	must(t, err)
	defer f.Close()
	st, err := f.Stat()
	must(t, err)
	end, err := wal.DataEnd(f, st.Size())
	must(t, err)
	return end
}

// writeAtDataEnd writes b after the batches of the segment file at path, as
// a writer appending there would (over the zeros written ahead, if any).
func writeAtDataEnd(t *testing.T, path string, b []byte) {
	t.Helper()
	end := segmentDataEnd(t, path)
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	must(t, err)
	_, err = f.WriteAt(b, end)
	must(t, err)
	must(t, f.Close())
}
