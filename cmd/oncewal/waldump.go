package main

import (
	"bufio"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/oncewal/oncewal/wal"
)

const waldumpSynopsis = `waldump PATH [--json] [--from LSN] [--shard N]
waldump --cut-epoch-regression [--shard N] WALDIR

Prints the batches and events of a WAL, like pg_waldump. PATH is one segment
file or a WAL directory (every shard found, in shard order, unless --shard).
Human output: one line per batch header and one per event. --json: JSON Lines,
one object per event with lsn, shard, epoch, op, session (hex), seq, idem (hex
or null), ts (WAL clock, unix ns), key and value (base64, when the op has
them), delta (add).

A corrupt or incomplete batch is reported on stderr with its LSN, where it is,
and the typed error (e.g. wal.ErrChecksum); the exit status is then 1. So is
a batch whose epoch is below the one before it (wal.ErrEpochRegression): a
log never goes back in epoch.

--cut-epoch-regression repairs such a log (the leader refuses to start on
it and names this command): for each shard of WALDIR (or --shard N) it
moves the first batch whose epoch goes back, and everything after it, into
a side file beside WALDIR (stale-epoch-shard-NNNN-from-lsn-L.walcut, the
batches verbatim: waldump reads it) and cuts the log before it. Nothing it
cuts was acknowledged: every replica refuses a batch of an epoch below one
it applied (see package wal, "Epochs never go back"). The leader must be
stopped (the WAL's lock). Exit 0 when every shard's log is sound after it.`

// errNotSegment is the refusal of a file that cannot be a WAL segment.
var errNotSegment = errors.New("not a WAL segment")

// maxShown bounds how many bytes of a key or value human output prints.
const maxShown = 64

func runWaldump(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("waldump", waldumpSynopsis, stderr)
	jsonOut := fs.Bool("json", false, "JSON Lines output, one object per event")
	from := fs.Uint64("from", 0, "start at the batch holding this `LSN` and print events from it on (0: from the start)")
	shard := fs.Int64("shard", -1, "only this shard `N` (directories; for a file it must match the file's shard); -1: all")
	cutRegression := fs.Bool("cut-epoch-regression", false, "repair: cut each shard's log at its first batch whose epoch goes back, keeping the cut batches in a side file")
	pos, status, ok := parseArgs(fs, args, stdout)
	if !ok {
		return status
	}
	if len(pos) != 1 {
		return usageError(fs, stderr, "want exactly one PATH, got %d arguments", len(pos))
	}
	if *shard < -1 || *shard > math.MaxUint32 {
		return usageError(fs, stderr, "--shard %d out of range (0..%d, or -1 for all)", *shard, uint32(math.MaxUint32))
	}
	path := pos[0]
	if *cutRegression {
		if *jsonOut || *from != 0 {
			return usageError(fs, stderr, "--cut-epoch-regression takes no --json or --from: it repairs, it does not print the log")
		}
		return cutEpochRegression(path, *shard, stdout, stderr)
	}
	st, err := os.Stat(path)
	if err != nil {
		fmt.Fprintf(stderr, "oncewal waldump: %v\n", err)
		return exitFailure
	}

	out := bufio.NewWriterSize(stdout, 64<<10)
	d := &dumper{out: out, json: *jsonOut, from: *from, shard: *shard}
	if st.IsDir() {
		err = d.dumpDir(path)
	} else {
		err = d.dumpFile(path, st)
	}
	if ferr := out.Flush(); err == nil && ferr != nil {
		err = ferr
	}
	if err != nil {
		fmt.Fprintf(stderr, "oncewal waldump: %v\n", err)
		return exitFailure
	}
	return exitOK
}

// corruptError is a batch waldump could not read: where it is and why.
type corruptError struct {
	shard    uint32
	noShard  bool   // the shard is not known: no valid header, no segment name, no --shard
	lsn      uint64 // the batch's first LSN, or the LSN expected there when its header is unreadable
	expected bool   // lsn is the expected LSN, not read from a valid header
	where    string // segment file and offset, when known
	err      error  // wraps a wal sentinel
}

func (e *corruptError) Error() string {
	var b strings.Builder
	what := "corrupt batch"
	if errors.Is(e.err, wal.ErrTruncated) {
		what = "incomplete batch"
	}
	shard := fmt.Sprintf("shard %d", e.shard)
	if e.noShard {
		shard = "shard unknown"
	}
	switch {
	case e.expected && e.lsn == 0:
		fmt.Fprintf(&b, "%s at the start of the file (%s", what, shard)
	case e.expected:
		fmt.Fprintf(&b, "%s at expected LSN %d (%s", what, e.lsn, shard)
	default:
		fmt.Fprintf(&b, "%s at LSN %d (%s", what, e.lsn, shard)
	}
	if e.where != "" {
		fmt.Fprintf(&b, ", %s", e.where)
	}
	fmt.Fprintf(&b, "): %v", e.err)
	if name := sentinelName(e.err); name != "" {
		fmt.Fprintf(&b, " [%s]", name)
	}
	return b.String()
}

func (e *corruptError) Unwrap() error { return e.err }

// sentinelName names the wal sentinel err wraps, so a reader of the message
// knows which errors.Is test a program would use.
func sentinelName(err error) string {
	for _, s := range []struct {
		err  error
		name string
	}{
		{wal.ErrChecksum, "wal.ErrChecksum"},
		{wal.ErrTruncated, "wal.ErrTruncated"},
		{wal.ErrTooLarge, "wal.ErrTooLarge"},
		{wal.ErrVersion, "wal.ErrVersion"},
		{wal.ErrBadSegmentName, "wal.ErrBadSegmentName"},
		{wal.ErrEpochRegression, "wal.ErrEpochRegression"},
		{wal.ErrCorrupt, "wal.ErrCorrupt"},
	} {
		if errors.Is(err, s.err) {
			return s.name
		}
	}
	return ""
}

type dumper struct {
	out   *bufio.Writer
	json  bool
	from  uint64
	shard int64 // -1: all

	events []wal.Event
	line   []byte

	// Per shard, for the summary line.
	lastShard        int64
	batches, count   uint64
	firstLSN, endLSN uint64 // first printed batch's first LSN; last printed batch's last LSN
}

// segment is one segment file of a WAL directory.
type segment struct {
	path     string
	shard    uint32
	firstLSN uint64
}

// dumpDir dumps every shard's log in dir (or only d.shard) through
// wal.Reader — the same path the shipper reads — and then checks that the
// reader reached the end of the bytes on disk, because a Reader deliberately
// stops without error at an incomplete batch (it may be tailing a writer).
func (d *dumper) dumpDir(dir string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	byShard := map[uint32][]segment{}
	for _, e := range ents {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".wal") {
			continue
		}
		shard, first, err := wal.ParseSegmentName(e.Name())
		if err != nil {
			return fmt.Errorf("%s: %w", filepath.Join(dir, e.Name()), err)
		}
		byShard[shard] = append(byShard[shard], segment{filepath.Join(dir, e.Name()), shard, first})
	}
	if len(byShard) == 0 {
		return fmt.Errorf("%s: no WAL segments (*.wal) in this directory", dir)
	}
	var shards []uint32
	for s := range byShard {
		shards = append(shards, s)
	}
	slices.Sort(shards)
	if d.shard >= 0 {
		want := uint32(d.shard)
		if _, ok := byShard[want]; !ok {
			return fmt.Errorf("%s: no segments of shard %d (shards present: %s)", dir, want, joinShards(shards))
		}
		shards = []uint32{want}
	}
	for _, s := range shards {
		segs := byShard[s]
		slices.SortFunc(segs, func(a, b segment) int { return cmpU64(a.firstLSN, b.firstLSN) })
		if err := d.dumpShard(dir, s, segs); err != nil {
			return err
		}
	}
	return nil
}

func joinShards(shards []uint32) string {
	s := make([]string, len(shards))
	for i, v := range shards {
		s[i] = fmt.Sprint(v)
	}
	return strings.Join(s, ", ")
}

func cmpU64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func (d *dumper) dumpShard(dir string, shard uint32, segs []segment) error {
	d.startShard()
	r, err := wal.OpenReader(dir, shard)
	if err != nil {
		return fmt.Errorf("shard %d: opening reader: %w", shard, err)
	}
	defer r.Close()
	if d.from > 0 {
		// --from is a lower bound: a log whose older segments were deleted
		// by retention (or that starts later) is dumped from its first
		// retained LSN; the Reader itself refuses an LSN below it.
		if err := r.Seek(max(d.from, segs[0].firstLSN)); err != nil {
			return &corruptError{shard: shard, lsn: d.from, expected: true, where: "seeking", err: err}
		}
	}
	var last uint64  // last LSN returned by the reader; 0: none
	var epoch uint64 // epoch of that batch
	for {
		h, raw, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			next := max(last+1, d.from, segs[0].firstLSN)
			return &corruptError{shard: shard, lsn: next, expected: true, err: err}
		}
		if h.Shard != shard {
			return &corruptError{shard: shard, lsn: h.FirstLSN, err: fmt.Errorf("%w: reader of shard %d returned a batch of shard %d", wal.ErrCorrupt, shard, h.Shard)}
		}
		if last != 0 && h.FirstLSN != last+1 {
			return &corruptError{shard: shard, lsn: h.FirstLSN, err: fmt.Errorf("%w: batch starts at LSN %d, expected %d", wal.ErrCorrupt, h.FirstLSN, last+1)}
		}
		if h.Epoch < epoch {
			return &corruptError{shard: shard, lsn: h.FirstLSN, err: fmt.Errorf("%w: %w: the batch at LSN %d has epoch %d, after a batch of epoch %d "+
				"(repair: oncewal waldump --cut-epoch-regression --shard %d %s)", wal.ErrCorrupt, wal.ErrEpochRegression, h.FirstLSN, h.Epoch, epoch, shard, dir)}
		}
		if err := d.decodeAndEmit(shard, h.FirstLSN, "", raw); err != nil {
			return err
		}
		last, epoch = h.LastLSN(), h.Epoch
	}
	if err := d.checkTail(shard, segs, last); err != nil {
		return err
	}
	d.endShard(shard)
	return nil
}

// checkTail walks the batch headers (not bodies) from the segment holding the
// last LSN the reader returned to the end of the shard's log. It reports the
// first framing defect — an incomplete batch, a bad header, an LSN gap
// between segments — or batches that exist beyond where the reader stopped.
func (d *dumper) checkTail(shard uint32, segs []segment, last uint64) error {
	if last == 0 && len(segs) > 0 {
		// Nothing read: the log ends before its first segment's LSN (a
		// promoted leader's log that holds no batch yet starts there).
		last = segs[0].firstLSN - 1
	}
	at := max(last, d.from)
	i := 0
	for j, s := range segs {
		if s.firstLSN <= at {
			i = j
		}
	}
	var end uint64 // last LSN found on disk
	for j := i; j < len(segs); j++ {
		s := segs[j]
		if end != 0 && s.firstLSN != end+1 {
			return &corruptError{shard: shard, lsn: end + 1, expected: true, where: filepath.Base(s.path),
				err: fmt.Errorf("%w: segment starts at LSN %d, previous segment ends at LSN %d", wal.ErrCorrupt, s.firstLSN, end)}
		}
		segEnd, err := d.scanSegment(s.path, &s, false)
		if err != nil {
			return err
		}
		if segEnd != 0 {
			end = segEnd
		} else if end == 0 {
			end = s.firstLSN - 1 // an empty segment: the next one must start at its LSN
		}
	}
	if end > last && end >= d.from {
		return &corruptError{shard: shard, lsn: last + 1, expected: true,
			err: fmt.Errorf("%w: the reader stopped after LSN %d but the segments hold batches up to LSN %d", wal.ErrCorrupt, last, end)}
	}
	return nil
}

// dumpFile dumps one segment file, read directly: it need not sit in a WAL
// directory or carry a segment name (a copy under another name is read too,
// with the continuity checks the name would add left out).
//
// A segment has no file header, so an empty file is a WAL segment only by
// its name (a writer that crashed right after rolling leaves one); an empty
// file under another name, or anything but a regular file (/dev/null, a
// pipe), is refused with errNotSegment rather than dumped as "no batches".
func (d *dumper) dumpFile(path string, st os.FileInfo) error {
	if !st.Mode().IsRegular() {
		return fmt.Errorf("%s: %w: not a regular file (mode %v)", path, errNotSegment, st.Mode().Type())
	}
	var seg *segment
	shard, first, nameErr := wal.ParseSegmentName(filepath.Base(path))
	if nameErr == nil {
		seg = &segment{path: path, shard: shard, firstLSN: first}
		if d.shard >= 0 && uint32(d.shard) != shard {
			return fmt.Errorf("%s: segment of shard %d, not of --shard %d", path, shard, d.shard)
		}
	} else if st.Size() == 0 {
		return fmt.Errorf("%s: %w: empty, and its name is not a segment name (%w)", path, errNotSegment, nameErr)
	}
	d.startShard()
	if _, err := d.scanSegment(path, seg, true); err != nil {
		return err
	}
	if d.batches > 0 {
		d.endShard(uint32(d.lastShard))
	} else if !d.json {
		fmt.Fprintf(d.out, "no batches at or after LSN %d\n", d.from)
	}
	return nil
}

// scanSegment reads a segment file batch by batch. With emit it decodes and
// prints every batch that holds LSNs ≥ d.from (and only checks the headers of
// earlier ones); without, it only walks the headers. seg, when known, gives
// the shard and first LSN the file must start with. It returns the last LSN
// in the file (0 if it holds no batch).
func (d *dumper) scanSegment(path string, seg *segment, emit bool) (uint64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return 0, err
	}
	size := st.Size()
	name := filepath.Base(path)
	br := bufio.NewReaderSize(f, 64<<10)

	var (
		shard  uint32
		haveSh bool
		expect uint64 // LSN the next batch must start at; 0: unknown
		last   uint64
		off    int64
		buf    = make([]byte, wal.HeaderSize)
		where  = func() string { return fmt.Sprintf("%s offset %d", name, off) }
		// badHere is the error of a batch whose header cannot be
		// trusted: its shard is the segment's, else the one the file
		// name still shows (a renamed copy, "….wal.bak"), else --shard,
		// else unknown — never a guess.
		badHere = func(err error) *corruptError {
			e := &corruptError{shard: shard, lsn: expect, expected: true, where: where(), err: err}
			switch {
			case haveSh:
			case d.shard >= 0:
				e.shard = uint32(d.shard)
			default:
				var ok bool
				e.shard, ok = shardInName(name)
				e.noShard = !ok
			}
			return e
		}
	)
	if seg != nil {
		shard, haveSh, expect = seg.shard, true, seg.firstLSN
	}
	// Zeros the writer wrote ahead of its appends follow the batches; a
	// batch may end in zeros of its own, so it is read up to the file size.
	data, err := wal.DataEnd(f, size)
	if err != nil {
		return 0, err
	}
	for off < data {
		if size-off < wal.HeaderSize {
			return last, badHere(fmt.Errorf("%w: %d bytes at the end of the file, a batch header needs %d", wal.ErrTruncated, size-off, wal.HeaderSize))
		}
		if _, err := io.ReadFull(br, buf[:wal.HeaderSize]); err != nil {
			return last, fmt.Errorf("%s: %w", where(), err)
		}
		h, err := wal.DecodeHeader(buf[:wal.HeaderSize])
		if err != nil {
			return last, badHere(err)
		}
		if !haveSh {
			shard, haveSh = h.Shard, true
			if d.shard >= 0 && uint32(d.shard) != shard {
				return last, fmt.Errorf("%s: batches of shard %d, not of --shard %d", path, shard, d.shard)
			}
		}
		if h.Shard != shard {
			return last, &corruptError{shard: shard, lsn: h.FirstLSN, where: where(),
				err: fmt.Errorf("%w: batch of shard %d in a segment of shard %d", wal.ErrCorrupt, h.Shard, shard)}
		}
		if expect != 0 && h.FirstLSN != expect {
			return last, &corruptError{shard: shard, lsn: h.FirstLSN, where: where(),
				err: fmt.Errorf("%w: batch starts at LSN %d, expected %d", wal.ErrCorrupt, h.FirstLSN, expect)}
		}
		if rem := size - off - wal.HeaderSize; int64(h.BodyLen) > rem {
			return last, &corruptError{shard: shard, lsn: h.FirstLSN, where: where(),
				err: fmt.Errorf("%w: header announces a %d-byte body, %d bytes left in the file", wal.ErrTruncated, h.BodyLen, rem)}
		}
		if emit && h.LastLSN() >= d.from {
			if cap(buf) < h.Size() {
				buf = append(buf[:wal.HeaderSize], make([]byte, h.Size()-wal.HeaderSize)...)
			}
			buf = buf[:h.Size()]
			if _, err := io.ReadFull(br, buf[wal.HeaderSize:]); err != nil {
				return last, fmt.Errorf("%s: %w", where(), err)
			}
			if err := d.decodeAndEmit(shard, h.FirstLSN, where(), buf); err != nil {
				return last, err
			}
		} else if _, err := br.Discard(int(h.BodyLen)); err != nil {
			return last, fmt.Errorf("%s: %w", where(), err)
		}
		off += int64(h.Size())
		last, expect = h.LastLSN(), h.LastLSN()+1
	}
	return last, nil
}

// decodeAndEmit fully decodes one raw batch (body checksum and every event)
// and prints it.
func (d *dumper) decodeAndEmit(shard uint32, lsn uint64, where string, raw []byte) error {
	h, evs, err := wal.DecodeBatch(raw, d.events[:0])
	d.events = evs[:0]
	if err != nil {
		return &corruptError{shard: shard, lsn: lsn, where: where, err: err}
	}
	if d.batches == 0 {
		d.firstLSN = h.FirstLSN
	}
	d.batches++
	d.endLSN = h.LastLSN()
	d.lastShard = int64(h.Shard)
	if !d.json {
		fmt.Fprintf(d.out, "batch: shard %d, epoch %d, lsn %d..%d, events %d, len %d (header %d + body %d), body crc %08x\n",
			h.Shard, h.Epoch, h.FirstLSN, h.LastLSN(), h.Count, h.Size(), wal.HeaderSize, h.BodyLen, h.BodyCRC)
	}
	for i := range evs {
		e := &evs[i]
		if e.LSN < d.from {
			continue
		}
		d.count++
		if d.json {
			if err := d.emitJSON(&h, e); err != nil {
				return err
			}
		} else {
			d.emitText(e)
		}
	}
	return nil
}

func (d *dumper) emitText(e *wal.Event) {
	idem := "-"
	if e.HasIdemKey {
		idem = e.IdemKey.String()
	}
	fmt.Fprintf(d.out, "  lsn: %d, op: %s, session: %s, seq: %d, idem: %s, ts: %s",
		e.LSN, e.Op, e.Session, e.Seq, idem, time.Unix(0, e.Time).UTC().Format(time.RFC3339Nano))
	switch e.Op {
	case wal.OpPut:
		fmt.Fprintf(d.out, ", key: %s, value: %s", quote(e.Key, maxShown), quote(e.Value, maxShown))
	case wal.OpDelete:
		fmt.Fprintf(d.out, ", key: %s", quote(e.Key, maxShown))
	case wal.OpAdd:
		fmt.Fprintf(d.out, ", key: %s, delta: %+d", quote(e.Key, maxShown), e.Delta)
	}
	d.out.WriteByte('\n')
}

// eventJSON is one line of waldump --json. Key and Value use omitzero so that
// an op without them omits the field while an empty key (valid) is "".
type eventJSON struct {
	LSN     uint64  `json:"lsn"`
	Shard   uint32  `json:"shard"`
	Epoch   uint64  `json:"epoch"`
	Op      string  `json:"op"`
	Session string  `json:"session"`
	Seq     uint64  `json:"seq"`
	Idem    *string `json:"idem"`
	TS      int64   `json:"ts"`
	Key     []byte  `json:"key,omitzero"`
	Value   []byte  `json:"value,omitzero"`
	Delta   *int64  `json:"delta,omitempty"`
}

func (d *dumper) emitJSON(h *wal.Header, e *wal.Event) error {
	j := eventJSON{
		LSN: e.LSN, Shard: h.Shard, Epoch: h.Epoch, Op: e.Op.String(),
		Session: hex.EncodeToString(e.Session[:]), Seq: uint64(e.Seq), TS: e.Time,
	}
	if e.HasIdemKey {
		s := hex.EncodeToString(e.IdemKey[:])
		j.Idem = &s
	}
	nonNil := func(b []byte) []byte {
		if b == nil {
			return []byte{}
		}
		return b
	}
	switch e.Op {
	case wal.OpPut:
		j.Key, j.Value = nonNil(e.Key), nonNil(e.Value)
	case wal.OpDelete:
		j.Key = nonNil(e.Key)
	case wal.OpAdd:
		j.Key = nonNil(e.Key)
		delta := e.Delta
		j.Delta = &delta
	}
	b, err := json.Marshal(&j)
	if err != nil {
		return err
	}
	d.out.Write(b)
	return d.out.WriteByte('\n')
}

func (d *dumper) startShard() {
	d.batches, d.count, d.firstLSN, d.endLSN = 0, 0, 0, 0
}

func (d *dumper) endShard(shard uint32) {
	if d.json {
		return
	}
	if d.batches == 0 {
		fmt.Fprintf(d.out, "shard %d: no batches at or after LSN %d\n", shard, d.from)
		return
	}
	fmt.Fprintf(d.out, "shard %d: %d batches, %d events printed, lsn %d..%d\n", shard, d.batches, d.count, d.firstLSN, d.endLSN)
}

// shardInName reads the shard from a file name that starts with a segment
// name (wal.SegmentName) followed by anything, e.g. a copy saved as
// "0000000001-00000000000000000001.wal.bak"; ok is false for any other name.
func shardInName(name string) (shard uint32, ok bool) {
	i := strings.Index(name, ".wal")
	if i < 0 {
		return 0, false
	}
	shard, _, err := wal.ParseSegmentName(name[:i+len(".wal")])
	return shard, err == nil
}

// cutEpochRegression runs wal.CutEpochRegression on every shard of walDir
// (or only shard), side files beside walDir.
func cutEpochRegression(walDir string, shard int64, stdout, stderr io.Writer) int {
	shards, err := wal.ListShards(walDir)
	if err == nil && shard >= 0 {
		if !slices.Contains(shards, uint32(shard)) {
			err = fmt.Errorf("%s: no segments of shard %d (shards present: %s)", walDir, shard, joinShards(shards))
		}
		shards = []uint32{uint32(shard)}
	}
	if err == nil && len(shards) == 0 {
		err = fmt.Errorf("%s: no WAL segments (*.wal) in this directory", walDir)
	}
	if err != nil {
		fmt.Fprintf(stderr, "oncewal waldump: %v\n", err)
		return exitFailure
	}
	side := filepath.Dir(filepath.Clean(walDir))
	for _, s := range shards {
		cut, err := wal.CutEpochRegression(vfs.Default, walDir, s, side)
		if err != nil {
			fmt.Fprintf(stderr, "oncewal waldump: shard %d: %v\n", s, err)
			return exitFailure
		}
		if cut.LSN == 0 {
			fmt.Fprintf(stdout, "shard %d: no epoch regression, nothing cut\n", s)
			continue
		}
		fmt.Fprintf(stdout, "shard %d: cut the log at LSN %d (a batch of epoch %d after epoch %d); %d bytes from LSN %d on kept in %s\n",
			s, cut.LSN, cut.Epoch, cut.Prev, cut.Bytes, cut.LSN, cut.SideFile)
	}
	return exitOK
}
