package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/oncewal/oncewal/store"

	"github.com/oncewal/oncewal/idempotency"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/wal"
)

// inspectNodeShard is one shard of inspect --json on a node directory.
type inspectNodeShard struct {
	Shard       uint32         `json:"shard"`
	Dir         string         `json:"dir"`
	AppliedLSN  uint64         `json:"applied_lsn"`
	Epoch       uint64         `json:"epoch"`
	LastBatch   *lastBatchJSON `json:"last_batch"`
	WALClock    int64          `json:"wal_clock"`
	JournalKeys int            `json:"journal_keys"`
	Sessions    int            `json:"sessions"` // sessions with an HWM record
	Error       string         `json:"error,omitempty"`
	last        wal.BatchRef
}

// nodeShardsOf reports the shards of dir if it is a follower node directory
// (shard-NNNN store directories, no Pebble store of its own).
func nodeShardsOf(dir string) []uint32 {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "MANIFEST-") {
			return nil
		}
	}
	shards, err := store.NodeShards(nil, dir)
	if err != nil {
		return nil
	}
	return shards
}

// inspectNode prints each shard's position of a follower node directory
// (follower.OpenNode), opening every shard's store read-only. A shard that
// cannot be read is reported in its row; the command then fails.
func inspectNode(dir string, shards []uint32, jsonOut bool, out *bufio.Writer, stderr io.Writer) error {
	rows := make([]inspectNodeShard, 0, len(shards))
	failed := 0
	var errs []error
	for _, s := range shards {
		row := inspectNodeShard{Shard: s, Dir: store.ShardDir(dir, s)}
		if err := store.CorruptError(row.Dir, readNodeShard(&row, stderr)); err != nil {
			row.Error = err.Error()
			failed++
			errs = append(errs, fmt.Errorf("shard %d: %w", s, err))
		}
		rows = append(rows, row)
	}
	if jsonOut {
		b, err := json.Marshal(struct {
			Node   string             `json:"node"`
			Shards []inspectNodeShard `json:"shards"`
		}{filepath.Clean(dir), rows})
		if err != nil {
			return err
		}
		out.Write(b)
		out.WriteByte('\n')
	} else {
		fmt.Fprintf(out, "node:   %s (%d shards; inspect %s for a shard's sessions)\n\n", filepath.Clean(dir), len(rows), store.ShardDir(dir, shards[0]))
		tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "shard\tapplied lsn\tepoch\tlast batch\tsessions\tjournal keys\twal clock\t")
		for _, r := range rows {
			if r.Error != "" {
				// The reason is in the command's error, below the table.
				fmt.Fprintf(tw, "%d\t-\t-\t-\t-\t-\tcannot be read\t\n", r.Shard)
				continue
			}
			fmt.Fprintf(tw, "%d\t%d\t%d\t%s\t%d\t%d\t%s\t\n", r.Shard, r.AppliedLSN, r.Epoch, fmtBatchRef(r.last),
				r.Sessions, r.JournalKeys, fmtTS(r.WALClock))
		}
		tw.Flush()
	}
	if failed > 0 {
		// Each reason, typed (errors.Is: store.ErrLocked,
		// store.ErrCorrupt, ...), not only the count.
		return fmt.Errorf("%s: %d of %d shards could not be read: %w", dir, failed, len(rows), errors.Join(errs...))
	}
	return nil
}

func readNodeShard(row *inspectNodeShard, stderr io.Writer) error {
	db, err := openReadOnly(row.Dir, stderr)
	if err != nil {
		return err
	}
	defer db.Close()
	applied, epoch, ok, err := store.ReadMeta(db)
	if err != nil {
		return fmt.Errorf("reading metadata: %w", err)
	}
	if !ok {
		return fmt.Errorf("%w: no oncewal metadata", errNotStore)
	}
	row.AppliedLSN, row.Epoch = applied, epoch
	if _, row.last, err = store.ReadLastBatch(db); err != nil {
		return err
	}
	row.LastBatch = lastBatchOf(row.last)
	if row.WALClock, err = walClock(db); err != nil {
		return err
	}
	if _, row.JournalKeys, err = store.JournalWindow(db, idempotency.DefaultCapacity); err != nil {
		return fmt.Errorf("reading the window journal: %w", err)
	}
	return session.ScanHWMs(db, func(session.ID, session.SeqNo, bool, int64) error {
		row.Sessions++
		return nil
	})
}
