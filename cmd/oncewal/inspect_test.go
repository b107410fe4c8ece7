package main

import (
	"bufio"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/oncewal/oncewal/internal/drill"
	"github.com/oncewal/oncewal/store"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/oncewal/oncewal/follower"
	"github.com/oncewal/oncewal/idempotency"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/testutil"
	"github.com/oncewal/oncewal/wal"
)

type inspectJSON struct {
	Epoch       *uint64 `json:"epoch"`
	AppliedLSN  *uint64 `json:"applied_lsn"`
	Window      *int    `json:"window"`
	JournalKeys int     `json:"journal_keys"`
	WALClock    int64   `json:"wal_clock"`
	Sessions    []struct {
		ID      string            `json:"id"`
		HWM     uint64            `json:"hwm"`
		Closed  bool              `json:"closed"`
		Tracked bool              `json:"tracked"`
		LastTS  int64             `json:"last_ts"`
		State   map[string]string `json:"state"`
	} `json:"sessions"`
}

type wantSession struct {
	hwm     session.SeqNo
	closed  bool
	tracked bool
	state   map[string][]byte
}

type wantStore struct {
	applied, epoch uint64
	window         int
	sessions       map[session.ID]wantSession
}

// buildFollower applies a workload to a follower store in dir and returns
// what the follower itself reports, read before it is closed (or killed).
//
// Session c is applied first and then left idle while session d's batches
// move the WAL clock past the retention horizon, so the receiver's GC
// collects c's HWM record and c is left with state only. Sessions a and b are
// applied last and closed, so they keep closed HWM records.
func buildFollower(t *testing.T, dir string, kill bool) wantStore {
	t.Helper()
	f, err := follower.Open(dir, &follower.Options{Store: store.Options{Logger: slog.New(slog.DiscardHandler), RetentionHorizon: time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	c, d := session.ID{0xc0}, session.ID{0xd0}
	ts := baseTS
	keyed := func(e wal.Event) wal.Event {
		e.HasIdemKey = true
		e.IdemKey = idempotency.DeriveKey(e.Session, e.Seq, e.AppendOpBytes(nil))
		return e
	}
	batches := [][]wal.Event{{
		{Op: wal.OpOpen, Session: c, Seq: 1, Time: ts},
		keyed(wal.Event{Op: wal.OpPut, Session: c, Seq: 2, Time: ts, Key: []byte("color"), Value: []byte("teal")}),
		keyed(wal.Event{Op: wal.OpAdd, Session: c, Seq: 3, Time: ts, Key: []byte("visits"), Delta: 3}),
	}}
	ts += 2 * int64(time.Second)
	batches = append(batches, []wal.Event{{Op: wal.OpOpen, Session: d, Seq: 1, Time: ts}})
	for i := 2; i <= 70; i++ {
		batches = append(batches, []wal.Event{keyed(wal.Event{Op: wal.OpAdd, Session: d, Seq: session.SeqNo(i), Time: ts + int64(i), Key: []byte("n"), Delta: int64(i)})})
	}
	batches = append(batches, testBatchesAt(0, ts+int64(time.Second))...)

	lsn := uint64(1)
	for i, evs := range batches {
		epoch := uint64(1 + i/40)
		raw, err := wal.AppendBatch(nil, 0, epoch, lsn, evs)
		if err != nil {
			t.Fatal(err)
		}
		res, err := f.Apply(raw)
		if err != nil {
			t.Fatalf("batch %d: %v", i, err)
		}
		if res.Applied != len(evs) {
			t.Fatalf("batch %d: applied %d of %d events (%+v)", i, res.Applied, len(evs), res)
		}
		lsn += uint64(len(evs))
	}

	var w wantStore
	w.applied, w.epoch = f.Position()
	w.window = f.Stats().WindowLen
	w.sessions = map[session.ID]wantSession{}
	ids, err := f.State().Sessions()
	if err != nil {
		t.Fatal(err)
	}
	ids = append(ids, session.ID{0xa0}, session.ID{0xb0, 0, 0xff}, c, d)
	for _, id := range ids {
		hwm, closed, found, err := f.Tracker().Get(id)
		if err != nil {
			t.Fatal(err)
		}
		kv, err := f.State().Keys(id)
		if err != nil {
			t.Fatal(err)
		}
		w.sessions[id] = wantSession{hwm, closed, found, kv}
	}
	if w.sessions[c].tracked || len(w.sessions[c].state) == 0 {
		t.Fatalf("test setup: session c should have state but no HWM record after GC: %+v", w.sessions[c])
	}
	if !w.sessions[session.ID{0xa0}].closed || w.window == 0 || w.epoch < 2 {
		t.Fatalf("test setup: want a closed session, a non-empty window and epoch ≥ 2: %+v", w)
	}
	if kill {
		err = drill.Kill(f)
	} else {
		err = f.Close()
	}
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func TestInspectMatchesFollower(t *testing.T) {
	for _, kill := range []bool{false, true} {
		name := "closed"
		if kill {
			name = "killed" // Pebble WAL not flushed: read-only open replays it in memory
		}
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			want := buildFollower(t, dir, kill)
			before := testutil.TreeDigest(t, dir)

			out, errOut, code := runCmd(t, "inspect", dir, "--json")
			if code != exitOK || errOut != "" {
				t.Fatalf("inspect --json: code %d, stderr %q", code, errOut)
			}
			var got inspectJSON
			if err := json.Unmarshal([]byte(out), &got); err != nil {
				t.Fatalf("%v in %s", err, out)
			}
			if got.Epoch == nil || *got.Epoch != want.epoch || got.AppliedLSN == nil || *got.AppliedLSN != want.applied ||
				got.Window == nil || *got.Window != want.window {
				t.Errorf("inspect: epoch %v applied %v window %v; follower: epoch %d applied %d window %d",
					got.Epoch, got.AppliedLSN, got.Window, want.epoch, want.applied, want.window)
			}
			var ids []string
			for _, s := range got.Sessions {
				ids = append(ids, s.ID)
				id, err := session.ParseID(s.ID)
				if err != nil {
					t.Fatal(err)
				}
				w, ok := want.sessions[id]
				if !ok {
					t.Errorf("inspect reports unknown session %s", s.ID)
					continue
				}
				state := map[string][]byte{}
				for k, v := range s.State {
					kb, err1 := base64.StdEncoding.DecodeString(k)
					vb, err2 := base64.StdEncoding.DecodeString(v)
					if err1 != nil || err2 != nil {
						t.Fatalf("state entry %q: %q: %v %v", k, v, err1, err2)
					}
					state[string(kb)] = vb
				}
				if s.HWM != uint64(w.hwm) || s.Closed != w.closed || s.Tracked != w.tracked ||
					!maps.EqualFunc(state, w.state, func(a, b []byte) bool { return string(a) == string(b) }) {
					t.Errorf("session %s: inspect %+v, follower %+v", s.ID, s, w)
				}
				delete(want.sessions, id)
			}
			if len(want.sessions) != 0 {
				t.Errorf("sessions missing from inspect: %v", want.sessions)
			}
			if !slices.IsSorted(ids) {
				t.Errorf("sessions not in ID order: %v", ids)
			}

			out, errOut, code = runCmd(t, "inspect", dir)
			if code != exitOK || errOut != "" {
				t.Fatalf("inspect: code %d, stderr %q", code, errOut)
			}
			for _, s := range []string{
				fmt.Sprintf("applied lsn:  %d\n", want.applied),
				fmt.Sprintf("epoch:        %d\n", want.epoch),
				fmt.Sprintf("window:       %d keys", want.window),
				fmt.Sprintf("session %s  hwm -", session.ID{0xc0}),
				fmt.Sprintf("session %s  hwm 7  closed", session.ID{0xa0}),
				`  "visits" = "\x03\x00\x00\x00\x00\x00\x00\x00"  (as int64: 3)`,
				fmt.Sprintf("\n%d sessions\n", len(got.Sessions)),
			} {
				if !strings.Contains(out, s) {
					t.Errorf("human output lacks %q:\n%s", s, out)
				}
			}

			if after := testutil.TreeDigest(t, dir); !maps.Equal(before, after) {
				t.Errorf("inspect changed the store:\nbefore %v\nafter  %v", before, after)
			}
		})
	}
}

func TestInspectRefusesNonStores(t *testing.T) {
	root := t.TempDir()
	empty := filepath.Join(root, "empty")
	file := filepath.Join(root, "file")
	plain := filepath.Join(root, "plain")
	walDir := filepath.Join(root, "wal")
	for _, d := range []string{empty, walDir} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(file, []byte("hello"), 0o644); err != nil {
		t.Fatal(err)
	}
	writeLog(t, walDir, 0, 0, testBatches(0))
	db, err := pebble.Open(plain, &pebble.Options{FormatMajorVersion: pebble.FormatNewest, Logger: inspectLogger{}})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Set([]byte("m/position"), []byte("not ours"), pebble.Sync); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	// A creation cut short: Pebble's first MANIFEST and LOCK, no marker.
	unfinished := filepath.Join(root, "unfinished")
	if err := os.Mkdir(unfinished, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"LOCK", "MANIFEST-000001"} {
		if err := os.WriteFile(filepath.Join(unfinished, name), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// A store with data that lost its manifest marker: damaged, not "no store".
	lost := filepath.Join(root, "lost")
	testutil.CopyDir(t, plain, lost)
	markers, err := filepath.Glob(filepath.Join(lost, "marker.manifest.*"))
	if err != nil || len(markers) != 1 {
		t.Fatalf("manifest markers of %s: %v, %v", lost, markers, err)
	}
	if err := os.Remove(markers[0]); err != nil {
		t.Fatal(err)
	}
	before := testutil.TreeDigest(t, root)

	for _, tc := range []struct{ path, want string }{
		{unfinished, "not an oncewal follower store: no Pebble store in it (a creation that never finished)"},
		{lost, lost + ": store: store is damaged: it holds Pebble data files but its manifest marker"},
		{filepath.Join(root, "missing"), "no such file or directory"},
		{empty, "not an oncewal follower store: no Pebble store"},
		{file, "not an oncewal follower store: not a directory"},
		{walDir, "not an oncewal follower store: no Pebble store"},
		{plain, "not an oncewal follower store: the Pebble store has no oncewal metadata"},
	} {
		for _, mode := range [][]string{nil, {"--json"}} {
			args := append([]string{"inspect", tc.path}, mode...)
			out, errOut, code := runCmd(t, args...)
			if code != exitFailure || !strings.Contains(errOut, tc.want) || out != "" {
				t.Errorf("%q: code %d, stdout %q, stderr %q; want %q", args, code, out, errOut, tc.want)
			}
		}
	}
	if after := testutil.TreeDigest(t, root); !maps.Equal(before, after) {
		t.Errorf("inspect changed what it refused:\nbefore %v\nafter  %v", before, after)
	}
}

// TestHelperHoldLock is not a test: run as a subprocess by
// TestInspectLockedStore, it holds Pebble's exclusive lock on a store the way
// a running follower does, until its stdin closes.
func TestHelperHoldLock(t *testing.T) {
	dir := os.Getenv("ONCEWAL_TEST_HOLD_LOCK")
	if dir == "" {
		t.Skip("helper process")
	}
	l, err := pebble.LockDirectory(dir, vfs.Default)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Println("locked")
	io.Copy(io.Discard, os.Stdin)
	l.Close()
}

func TestInspectLockedStore(t *testing.T) {
	if runtime.GOOS != "linux" && runtime.GOOS != "darwin" {
		t.Skip("POSIX record locks")
	}
	dir := t.TempDir()
	buildFollower(t, dir, false)
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperHoldLock$")
	cmd.Env = append(os.Environ(), "ONCEWAL_TEST_HOLD_LOCK="+dir)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		stdin.Close()
		cmd.Wait()
	}()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || line != "locked\n" {
		t.Fatalf("helper: %q, %v", line, err)
	}
	_, errOut, code := runCmd(t, "inspect", dir)
	// store.ErrLocked, naming the lock file and the remedy (was:
	// "the store is locked — is a follower running on it?").
	if code != exitFailure || !strings.Contains(errOut, store.ErrLocked.Error()) ||
		!strings.Contains(errOut, filepath.Join(dir, "LOCK")) || !strings.Contains(errOut, "stop the follower or leader running on "+dir) {
		t.Errorf("inspect of a locked store: code %d, stderr %q", code, errOut)
	}
}
