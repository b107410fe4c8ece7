package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"text/tabwriter"

	"github.com/oncewal/oncewal/leader"
	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/store"
	"github.com/oncewal/oncewal/wal"
)

// storeRow is one store's position — what its hello would state — as
// inspect of several directories and promote read it.
type storeRow struct {
	arg   string // the directory named on the command line
	dir   string // the store
	node  bool   // arg is a node directory, dir its store of shard
	shard uint32
	pos   replication.Ack
	err   error
}

// errMixedLayouts: the directories compared are not all of one kind (node
// directories or single stores).
var errMixedLayouts = errors.New("cannot compare a follower node directory with a single store")

// readRows opens every store of path read-only and reads its position: one
// row for a store, one per shard for a node directory. A store that cannot
// be read is a row with err set; a path that is neither is an error.
func readRows(path string, stderr io.Writer) (rows []storeRow, node bool, err error) {
	if shards := nodeShardsOf(path); len(shards) > 0 {
		for _, s := range shards {
			r := storeRow{arg: path, dir: store.ShardDir(path, s), node: true, shard: s}
			r.pos, r.err = readStorePosition(r.dir, stderr)
			rows = append(rows, r)
		}
		return rows, true, nil
	}
	pos, err := readStorePosition(path, stderr)
	if err != nil {
		return nil, false, err
	}
	return []storeRow{{arg: path, dir: path, pos: pos}}, false, nil
}

// readStorePosition reads the position of the store in dir; Pebble's
// corruption comes back as store.ErrCorrupt.
func readStorePosition(dir string, stderr io.Writer) (replication.Ack, error) {
	pos, err := readStorePositionOf(dir, stderr)
	return pos, store.CorruptError(dir, err)
}

func readStorePositionOf(dir string, stderr io.Writer) (replication.Ack, error) {
	db, err := openReadOnly(dir, stderr)
	if err != nil {
		return replication.Ack{}, err
	}
	defer db.Close()
	pos, ok, err := store.ReadPosition(db)
	if err != nil {
		return replication.Ack{}, fmt.Errorf("%s: reading its position: %w", dir, err)
	}
	if !ok {
		return replication.Ack{}, fmt.Errorf("%s: %w: the Pebble store has no oncewal metadata", dir, errNotStore)
	}
	return pos, nil
}

// readAllRows reads every directory's rows; all must be of one kind.
func readAllRows(dirs []string, stderr io.Writer) ([]storeRow, bool, error) {
	var all []storeRow
	kind := false
	for i, d := range dirs {
		rows, node, err := readRows(d, stderr)
		if err != nil {
			return nil, false, err
		}
		if i > 0 && node != kind {
			return nil, false, fmt.Errorf("%w: %s and %s", errMixedLayouts, dirs[0], d)
		}
		kind = node
		all = append(all, rows...)
	}
	return all, kind, nil
}

// mostAdvanced marks each readable row that no row of its shard is ahead of,
// and returns the first directory, in argument order, whose rows are marked
// on every shard any directory has: the one to promote. It returns "" when
// no directory is, or when a row could not be read (its position is
// unknown). The rules are the library's (leader.Rank).
func mostAdvanced(rows []storeRow) (best string, marked []bool) {
	r := leader.Rank(candidatesOf(rows))
	return r.Leader, r.MostAdvanced
}

// candidatesOf is rows as the promotion policy weighs them, in their order.
func candidatesOf(rows []storeRow) []leader.Candidate {
	cands := make([]leader.Candidate, len(rows))
	for i, r := range rows {
		cands[i] = leader.Candidate{Holder: r.arg, Name: r.dir, Shard: r.shard, Pos: r.pos, Unknown: r.err != nil}
	}
	return cands
}

// lastBatchJSON is a batch identity in JSON (null when unknown).
type lastBatchJSON struct {
	Epoch uint64 `json:"epoch"`
	CRC   string `json:"crc"` // the batch header's CRC-32C, 8 hex digits
}

func lastBatchOf(ref wal.BatchRef) *lastBatchJSON {
	if ref.IsZero() {
		return nil
	}
	return &lastBatchJSON{Epoch: ref.Epoch, CRC: fmt.Sprintf("%08x", ref.CRC)}
}

func fmtBatchRef(ref wal.BatchRef) string {
	if ref.IsZero() {
		return "-"
	}
	return ref.String()
}

// positionJSON is one store of inspect --json on several directories.
type positionJSON struct {
	Dir          string         `json:"dir"`
	Node         string         `json:"node,omitempty"`
	Shard        *uint32        `json:"shard,omitempty"` // node directories only: a store does not record its shard
	AppliedLSN   uint64         `json:"applied_lsn"`
	Epoch        uint64         `json:"epoch"`
	LastBatch    *lastBatchJSON `json:"last_batch"`
	MostAdvanced bool           `json:"most_advanced"`
	Error        string         `json:"error,omitempty"`
}

// inspectPositions prints the position of every store of dirs and which
// directory is the most advanced. It fails when a store cannot be read.
func inspectPositions(dirs []string, jsonOut bool, out *bufio.Writer, stderr io.Writer) error {
	rows, _, err := readAllRows(dirs, stderr)
	if err != nil {
		return err
	}
	best, marked := mostAdvanced(rows)
	failed := 0
	var rowErrs []error
	if jsonOut {
		res := struct {
			Stores       []positionJSON `json:"stores"`
			MostAdvanced string         `json:"most_advanced"`
		}{MostAdvanced: best}
		for i, r := range rows {
			p := positionJSON{Dir: filepath.Clean(r.dir), AppliedLSN: r.pos.AppliedLSN, Epoch: r.pos.Epoch,
				LastBatch: lastBatchOf(r.pos.LastBatch), MostAdvanced: marked[i]}
			if r.node {
				p.Node, p.Shard = filepath.Clean(r.arg), &r.shard
			}
			if r.err != nil {
				p.Error, failed = r.err.Error(), failed+1
				rowErrs = append(rowErrs, r.err)
			}
			res.Stores = append(res.Stores, p)
		}
		b, err := json.Marshal(res)
		if err != nil {
			return err
		}
		out.Write(b)
		out.WriteByte('\n')
	} else {
		tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "store\tshard\tapplied lsn\tepoch\tlast batch\tmost advanced\t")
		for i, r := range rows {
			shard := "-"
			if r.node {
				shard = fmt.Sprint(r.shard)
			}
			if r.err != nil {
				failed++
				rowErrs = append(rowErrs, r.err)
				fmt.Fprintf(tw, "%s\t%s\t-\t-\t%s\t\t\n", filepath.Clean(r.dir), shard, r.err)
				continue
			}
			mark := ""
			if marked[i] {
				mark = "yes"
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\t\n", filepath.Clean(r.dir), shard, r.pos.AppliedLSN, r.pos.Epoch,
				fmtBatchRef(r.pos.LastBatch), mark)
		}
		tw.Flush()
		if best != "" {
			fmt.Fprintf(out, "\nmost advanced: %s\n", best)
		} else {
			switch {
			case failed > 0:
				fmt.Fprintln(out, "\nmost advanced: none known (a store could not be read)")
			default:
				fmt.Fprintf(out, "\nmost advanced: none (no directory is ahead on every shard); %s\n", catchUpAdvice(dirs))
			}
		}
	}
	if failed > 0 {
		// Each reason, typed (errors.Is: store.ErrLocked,
		// ErrStoreCorrupt, ...), not only the count.
		return fmt.Errorf("%d of %d stores could not be read: %w", failed, len(rows), errors.Join(rowErrs...))
	}
	return nil
}

// verifyStore reads every key and value of the store in dir read-only, so
// that each of its blocks has its checksum verified: Pebble reads blocks
// only when asked, and a command that changes stores (promote) checks them
// all before it changes anything, instead of meeting a damaged block half way
// through. Corruption is store.ErrCorrupt naming dir.
func verifyStore(dir string, stderr io.Writer) error {
	db, err := openReadOnly(dir, stderr)
	if err != nil {
		return store.CorruptError(dir, err)
	}
	defer db.Close()
	it, err := db.NewIter(nil)
	if err != nil {
		return store.CorruptError(dir, err)
	}
	for valid := it.First(); valid; valid = it.Next() {
		if _, err := it.ValueAndErr(); err != nil {
			_ = it.Close()
			return store.CorruptError(dir, fmt.Errorf("%s: reading a value: %w", dir, err))
		}
	}
	if err := it.Close(); err != nil {
		return store.CorruptError(dir, fmt.Errorf("%s: reading the store: %w", dir, err))
	}
	return nil
}
