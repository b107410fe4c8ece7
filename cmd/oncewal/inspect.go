package main

import (
	"bufio"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/oncewal/oncewal/internal/keyspace"
	"github.com/oncewal/oncewal/store"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/oncewal/oncewal/idempotency"
	"github.com/oncewal/oncewal/session"
)

const inspectSynopsis = `inspect DIR [DIR...] [--json]

Prints a follower store's applied position and epoch, the batch that ends
there, WAL clock, window size, and per session its HWM, closed flag and
state. The store is opened read-only and never changed, so it is safe on a
copy, a crashed store, or one a stopped follower left; a running follower
holds the store's lock, so stop it or inspect a copy. A follower (or
leader) node directory (one store per shard, DIR/shard-NNNN) prints one row
per shard: applied LSN, epoch, last batch, sessions, journal keys, WAL
clock (--json: {"node", "shards": [{"shard", "dir", "applied_lsn",
"epoch", "last_batch", ...}]}).
--json: one object {"epoch", "applied_lsn", "last_batch": {"epoch",
"crc"} or null, "window", "sessions": [{"id", "hwm", "closed", "state":
{base64 key: base64 value}}, ...]} (plus "wal_clock", "journal_keys", and
per session "tracked" and "last_ts").

Several DIRs (stores of one shard, or node directories of one deployment)
compare their positions to choose the follower to promote: per store its
applied LSN, epoch and last batch, marked when no store of its shard is
ahead of it (the later last-batch epoch wins, then the higher LSN), and the
directory that is so on every shard (--json: {"stores": [{"dir", "node",
"shard", "applied_lsn", "epoch", "last_batch", "most_advanced"}, ...],
"most_advanced": DIR or ""}).`

// errNotStore is the refusal of a directory that is not a follower store.
var errNotStore = errors.New("not an oncewal follower store")

func runInspect(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("inspect", inspectSynopsis, stderr)
	jsonOut := fs.Bool("json", false, "print one JSON object")
	pos, status, ok := parseArgs(fs, args, stdout)
	if !ok {
		return status
	}
	if len(pos) == 0 {
		return usageError(fs, stderr, "want a DIR")
	}
	out := bufio.NewWriterSize(stdout, 64<<10)
	var err error
	if len(pos) == 1 {
		err = inspect(pos[0], *jsonOut, out, stderr)
	} else {
		err = inspectPositions(pos, *jsonOut, out, stderr)
	}
	if ferr := out.Flush(); err == nil && ferr != nil {
		err = ferr
	}
	if err != nil {
		fmt.Fprintf(stderr, "oncewal inspect: %v\n", err)
		return exitFailure
	}
	return exitOK
}

// openReadOnly opens dir as a Pebble store without changing a byte of it.
//
// Pebble is given readOnlyFS, which refuses every write, and a directory is
// first checked to look like a Pebble store (a MANIFEST and a LOCK file), so
// that a stray directory gets a clear refusal; ErrorIfNotExists backs that up.
func openReadOnly(dir string, stderr io.Writer) (db *pebble.DB, err error) {
	st, err := os.Stat(dir)
	if err != nil {
		return nil, err
	}
	if !st.IsDir() {
		return nil, fmt.Errorf("%s: %w: not a directory", dir, errNotStore)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var manifest, lock bool
	for _, e := range ents {
		switch {
		case strings.HasPrefix(e.Name(), "MANIFEST-"):
			manifest = true
		case e.Name() == "LOCK":
			lock = true
		}
	}
	if !manifest {
		return nil, fmt.Errorf("%s: %w: no Pebble store in it (no MANIFEST file)", dir, errNotStore)
	}
	if !lock {
		return nil, fmt.Errorf("%s: %w: Pebble store without a LOCK file (inspect will not create one; copy the whole directory)", dir, errNotStore)
	}
	// A Pebble fatal error is reported through Logger.Fatalf, whose default
	// exits; turn it into an error instead.
	defer func() {
		if p := recover(); p != nil {
			fe, ok := p.(*store.FatalError)
			if !ok {
				panic(p)
			}
			db, err = nil, fmt.Errorf("%s: opening the Pebble store: %w", dir, fe)
		}
	}()
	po := &pebble.Options{
		FS:                 readOnlyFS{vfs.Default},
		ReadOnly:           true,
		ErrorIfNotExists:   true,
		FormatMajorVersion: pebble.FormatNewest, // never ratcheted in ReadOnly mode
		Logger:             inspectLogger{w: stderr},
	}
	// A block that fails its checksum is an error of the read, not a
	// Fatalf (which inspectLogger would turn into a panic on the reading
	// goroutine).
	store.NonFatalCorruption(po, nil)
	db, err = pebble.Open(dir, po)
	switch {
	case errors.Is(err, pebble.ErrDBDoesNotExist) || errors.Is(err, os.ErrNotExist):
		// As store reads it (store.DirLayout): Pebble's files without a
		// committed manifest are a creation a crash cut short — no store
		// yet — unless data files are there too, which is damage.
		if layout, _, lerr := store.DirLayout(vfs.Default, dir); lerr == nil && layout == store.LayoutEmpty {
			return nil, fmt.Errorf("%s: %w: no Pebble store in it (a creation that never finished)", dir, errNotStore)
		}
		return nil, fmt.Errorf("%s: %w: it holds Pebble data files but its manifest marker, or the MANIFEST it names, is missing: %v",
			dir, store.ErrCorrupt, err)
	case errors.Is(err, store.ErrLocked):
		return nil, fmt.Errorf("%s: %w", dir, err)
	case pebble.IsCorruptionError(err):
		return nil, store.CorruptError(dir, err)
	case err != nil:
		return nil, fmt.Errorf("%s: opening the Pebble store: %w", dir, err)
	}
	return db, nil
}

// inspectLogger keeps Pebble's info lines (WAL replay, …) out of inspect's
// output, passes its errors on, and turns a fatal error into a panic that
// openReadOnly recovers, where Pebble's default logger would exit.
type inspectLogger struct{ w io.Writer }

func (l inspectLogger) Infof(string, ...any) {}

func (l inspectLogger) Errorf(format string, args ...any) {
	fmt.Fprintf(l.w, "oncewal inspect: pebble: %s\n", fmt.Sprintf(format, args...))
}

func (l inspectLogger) Fatalf(format string, args ...any) {
	panic(&store.FatalError{Msg: fmt.Sprintf(format, args...)})
}

// inspectSession is one session of inspect --json.
type inspectSession struct {
	ID      string            `json:"id"`
	HWM     uint64            `json:"hwm"`
	Closed  bool              `json:"closed"`
	Tracked bool              `json:"tracked"` // has an HWM record (false: state only, e.g. after GC)
	LastTS  int64             `json:"last_ts"` // last activity on the WAL clock; 0 when untracked
	State   map[string]string `json:"state"`
}

func inspect(dir string, jsonOut bool, out *bufio.Writer, stderr io.Writer) error {
	if shards := nodeShardsOf(dir); len(shards) > 0 {
		return inspectNode(dir, shards, jsonOut, out, stderr)
	}
	return store.CorruptError(dir, inspectOneStore(dir, jsonOut, out, stderr))
}

func inspectOneStore(dir string, jsonOut bool, out *bufio.Writer, stderr io.Writer) error {
	db, err := openReadOnly(dir, stderr)
	if err != nil {
		return err
	}
	defer db.Close()

	applied, epoch, ok, err := store.ReadMeta(db)
	if err != nil {
		return fmt.Errorf("%s: reading metadata: %w", dir, err)
	}
	if !ok {
		return fmt.Errorf("%s: %w: the Pebble store has no oncewal metadata (%s)", dir, errNotStore, keyspace.MetaFormat)
	}
	clock, err := walClock(db)
	if err != nil {
		return fmt.Errorf("%s: %w", dir, err)
	}
	_, last, err := store.ReadLastBatch(db)
	if err != nil {
		return fmt.Errorf("%s: %w", dir, err)
	}
	// The window a follower opened with the recorded capacity starts with
	// (a store older than its identity record: the default capacity).
	id, recorded, err := store.ReadIdentity(db)
	if err != nil {
		return fmt.Errorf("%s: %w", dir, err)
	}
	capacity, capNote := idempotency.DefaultCapacity, "assumed"
	if recorded {
		capacity, capNote = id.WindowCapacity, "recorded"
	}
	window, journal, err := store.JournalWindow(db, capacity)
	if err != nil {
		return fmt.Errorf("%s: reading the window journal: %w", dir, err)
	}

	state := session.NewState(db)
	stateIDs, err := state.Sessions()
	if err != nil {
		return fmt.Errorf("%s: listing session state: %w", dir, err)
	}

	if jsonOut {
		lb, err := json.Marshal(lastBatchOf(last))
		if err != nil {
			return err
		}
		fmt.Fprintf(out, `{"epoch":%d,"applied_lsn":%d,"last_batch":%s,"wal_clock":%d,"window":%d,"journal_keys":%d,"sessions":[`,
			epoch, applied, lb, clock, window, journal)
	} else {
		fmt.Fprintf(out, "store:        %s\n", filepath.Clean(dir))
		fmt.Fprintf(out, "applied lsn:  %d\n", applied)
		fmt.Fprintf(out, "epoch:        %d\n", epoch)
		fmt.Fprintf(out, "last batch:   %s\n", fmtBatchRef(last))
		fmt.Fprintf(out, "wal clock:    %s\n", fmtTS(clock))
		if recorded {
			fmt.Fprintf(out, "identity:     %s\n", id)
		}
		fmt.Fprintf(out, "window:       %d keys (journal holds %d; capacity %s %d)\n", window, journal, capNote, capacity)
	}

	// Sessions are the union of those with an HWM record and those with
	// state, merged in ID order as both sources are sorted by ID.
	n := 0
	emit := func(id session.ID, hwm session.SeqNo, closed, tracked bool, lastTS int64) error {
		kv, err := state.Keys(id)
		if err != nil {
			return fmt.Errorf("%s: reading state of session %s: %w", dir, id, err)
		}
		if jsonOut {
			s := inspectSession{ID: hex.EncodeToString(id[:]), HWM: uint64(hwm), Closed: closed, Tracked: tracked,
				LastTS: lastTS, State: make(map[string]string, len(kv))}
			for k, v := range kv {
				s.State[base64.StdEncoding.EncodeToString([]byte(k))] = base64.StdEncoding.EncodeToString(v)
			}
			b, err := json.Marshal(&s)
			if err != nil {
				return err
			}
			if n > 0 {
				out.WriteByte(',')
			}
			out.Write(b)
		} else {
			printSession(out, id, hwm, closed, tracked, lastTS, kv)
		}
		n++
		return nil
	}
	if !jsonOut {
		fmt.Fprintln(out)
	}
	err = session.ScanHWMs(db, func(id session.ID, hwm session.SeqNo, closed bool, lastTS int64) error {
		for len(stateIDs) > 0 && idLess(stateIDs[0], id) {
			if err := emit(stateIDs[0], 0, false, false, 0); err != nil {
				return err
			}
			stateIDs = stateIDs[1:]
		}
		if len(stateIDs) > 0 && stateIDs[0] == id {
			stateIDs = stateIDs[1:]
		}
		return emit(id, hwm, closed, true, lastTS)
	})
	if err != nil {
		return fmt.Errorf("%s: scanning HWM records: %w", dir, err)
	}
	for _, id := range stateIDs {
		if err := emit(id, 0, false, false, 0); err != nil {
			return err
		}
	}
	if jsonOut {
		out.WriteString("]}\n")
	} else {
		fmt.Fprintf(out, "%d sessions\n", n)
	}
	return nil
}

func idLess(a, b session.ID) bool { return string(a[:]) < string(b[:]) }

// walClock reads the tracker's persisted WAL clock through the session
// package, so the record format stays in one place. OpenTracker only reads.
func walClock(db *pebble.DB) (int64, error) {
	t, err := session.OpenTracker(db, &session.TrackerOptions{CacheSize: 1})
	if err != nil {
		return 0, fmt.Errorf("reading the WAL clock: %w", err)
	}
	return t.Clock(), nil
}

func printSession(out *bufio.Writer, id session.ID, hwm session.SeqNo, closed, tracked bool, lastTS int64, kv map[string][]byte) {
	switch {
	case !tracked:
		fmt.Fprintf(out, "session %s  hwm -  (no HWM record: collected or never advanced)  keys %d\n", id, len(kv))
	default:
		status := "open"
		if closed {
			status = "closed"
		}
		fmt.Fprintf(out, "session %s  hwm %d  %s  last %s  keys %d\n", id, hwm, status, fmtTS(lastTS), len(kv))
	}
	keys := make([]string, 0, len(kv))
	for k := range kv {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		v := kv[k]
		fmt.Fprintf(out, "  %s = %s", quote([]byte(k), maxShown), quote(v, maxShown))
		if len(v) == 8 {
			fmt.Fprintf(out, "  (as int64: %d)", int64(binary.LittleEndian.Uint64(v)))
		}
		out.WriteByte('\n')
	}
}

func fmtTS(ns int64) string {
	if ns == 0 {
		return "-"
	}
	return fmt.Sprintf("%s (%d)", time.Unix(0, ns).UTC().Format(time.RFC3339Nano), ns)
}
