package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/oncewal/oncewal/follower"
	"github.com/oncewal/oncewal/leader"
	"github.com/oncewal/oncewal/replication"
)

const promoteSynopsis = `promote --dir DIR [--out LEADER_DIR] [--epoch E] [--peers DIR,DIR,...]

Turns a stopped follower into the leader of its shards at a higher epoch,
after its leader died: oncewal leader --dir LEADER_DIR then serves it.

DIR is a follower node directory (DIR/shard-NNNN for shards 0..N-1, what
oncewal follower --shards N keeps): it becomes the leader node directory in
place (the leader adds DIR/wal), or moves to --out first. Or DIR is a single
follower store (oncewal follower --dir DIR): it moves to LEADER_DIR/shard-0000,
the leader of a one-shard deployment; --out is then required.

--peers names the other followers of the same shards (stopped: promote
reads their stores): promote refuses DIR if any of them is more advanced on
any shard — the later last-batch epoch, then the higher applied LSN; equal
is fine — naming it, so the LSNs a majority acknowledged survive. --epoch
must exceed every epoch DIR and the peers have seen (default: the highest
+ 1). The new epoch and the LSN its log starts at are persisted in each
store before promote returns; from then on those stores refuse the deposed
leader's batches. A peer behind the promoted follower cannot continue from
the new leader's log (it starts after the promoted position: refused as
behind retention) and must be rebuilt, e.g. from a copy of DIR taken before
the promotion. Nothing is moved or written when a check fails.`

// Refusals of promote.
var (
	// errNotMostAdvanced: a peer's history goes further than DIR's on some
	// shard; promoting DIR would lose what only the peer holds.
	errNotMostAdvanced = errors.New("not the most advanced follower")
	// errCannotPromote: DIR is not something promote can turn into a leader
	// node directory as asked.
	errCannotPromote = errors.New("cannot promote")
)

func runPromote(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("promote", promoteSynopsis, stderr)
	dir := fs.String("dir", "", "the follower to promote: a node directory or a single store (required)")
	out := fs.String("out", "", "move it here first (required for a single store, which becomes OUT/shard-0000)")
	epoch := fs.Uint64("epoch", 0, "the new leader epoch (0: the highest epoch DIR and the peers have seen + 1)")
	peers := fs.String("peers", "", "comma-separated other followers of the same shards, to check DIR is the most advanced")
	pos, status, ok := parseArgs(fs, args, stdout)
	if !ok {
		return status
	}
	if len(pos) > 0 {
		return usageError(fs, stderr, "unexpected argument %q", pos[0])
	}
	var c flagCheck
	if *dir == "" {
		c.failf("--dir is required")
	}
	var peerDirs []string
	if strings.TrimSpace(*peers) != "" {
		for _, p := range strings.Split(*peers, ",") {
			p = strings.TrimSpace(p)
			switch {
			case p == "":
				c.failf("--peers %q holds an empty entry", *peers)
			case filepath.Clean(p) == filepath.Clean(*dir):
				c.failf("--peers names --dir %s itself", p)
			default:
				peerDirs = append(peerDirs, p)
			}
		}
	}
	checkEpochFlag(&c, *epoch)
	if *out != "" && filepath.Clean(*out) == filepath.Clean(*dir) {
		c.failf("--out is --dir: leave --out out to promote a node directory in place")
	}
	if code, bad := c.refuse(fs, stderr); bad {
		return code
	}
	if err := promote(promoteConfig{dir: *dir, out: *out, epoch: *epoch, peers: peerDirs}, stdout, stderr); err != nil {
		fmt.Fprintf(stderr, "oncewal promote: %v\n", err)
		return exitFailure
	}
	return exitOK
}

type promoteConfig struct {
	dir, out string
	epoch    uint64
	peers    []string
}

func promote(c promoteConfig, stdout, stderr io.Writer) error {
	rows, node, err := readRows(c.dir, stderr)
	if err != nil {
		return err
	}
	for _, r := range rows {
		if r.err != nil {
			return r.err
		}
	}
	if _, err := os.Stat(filepath.Join(c.dir, leader.WALDirName)); err == nil {
		return fmt.Errorf("%w: %s is already a leader node directory (it has %s): start it with oncewal leader --dir %s, with --epoch to raise the epoch",
			errCannotPromote, c.dir, leader.WALDirName, c.dir)
	}
	shards := len(rows)
	for i, r := range rows {
		if r.shard != uint32(i) {
			return fmt.Errorf("%w: %s holds the stores of shards %v; a leader needs every shard 0..N-1", errCannotPromote, c.dir, shardsOf(rows))
		}
	}
	if !node && c.out == "" {
		return fmt.Errorf("%w: %s is a single follower store: give --out DIR, the leader node directory it moves into as DIR/shard-0000 "+
			"(the leader of a one-shard deployment; a multi-shard deployment's followers run as nodes, oncewal follower --shards N)",
			errCannotPromote, c.dir)
	}

	// Every peer's every store, against DIR's store of the same shard.
	seen, seenBy := uint64(0), ""
	note := func(r storeRow) {
		if e := max(r.pos.Epoch, r.pos.LastBatch.Epoch); e > seen {
			seen, seenBy = e, r.dir
		}
	}
	for _, r := range rows {
		note(r)
	}
	for _, p := range c.peers {
		prows, pnode, err := readRows(p, stderr)
		if err != nil {
			return fmt.Errorf("peer %w", err)
		}
		if pnode != node {
			return fmt.Errorf("%w: %w: %s and peer %s", errCannotPromote, errMixedLayouts, c.dir, p)
		}
		for _, pr := range prows {
			if pr.err != nil {
				return fmt.Errorf("peer %s: %w", p, pr.err)
			}
			note(pr)
			if int(pr.shard) >= shards {
				return fmt.Errorf("%w: peer %s holds shard %d, %s only shards 0..%d", errCannotPromote, p, pr.shard, c.dir, shards-1)
			}
			mine := rows[pr.shard]
			if replication.ComparePositions(pr.pos, mine.pos) > 0 {
				return fmt.Errorf("%w: %s%s is at LSN %d (last batch %s), peer %s is ahead at LSN %d (last batch %s): promote %s instead",
					errNotMostAdvanced, c.dir, shardNote(mine), mine.pos.AppliedLSN, fmtBatchRef(mine.pos.LastBatch),
					pr.dir, pr.pos.AppliedLSN, fmtBatchRef(pr.pos.LastBatch), p)
			}
		}
	}
	epoch := c.epoch
	if epoch == 0 {
		if epoch, err = replication.NextEpoch(seen, seenBy); err != nil {
			return err
		}
	} else if epoch <= seen {
		return fmt.Errorf("%w: --epoch %d is not above epoch %d, which %s has seen", replication.ErrStaleEpoch, epoch, seen, seenBy)
	}

	target := c.dir
	if c.out != "" {
		if _, err := os.Lstat(c.out); err == nil || !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("%w: --out %s already exists", errCannotPromote, c.out)
		}
		target = c.out
		if err := moveInto(c.dir, c.out, node); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "moved %s to %s\n", c.dir, storeDirIn(c.out, node))
	}
	l, err := leader.Open(target, &leader.Options{
		Shards: shards, Epoch: epoch, Promote: true,
		Logger: slog.New(slog.DiscardHandler), Store: follower.Options{Logger: slog.New(slog.DiscardHandler)},
	})
	if err != nil {
		return fmt.Errorf("opening %s as the leader at epoch %d: %w", target, epoch, err)
	}
	for s := range uint32(shards) {
		sh, _ := l.Shard(s)
		fmt.Fprintf(stdout, "shard %d: epoch %d starts at LSN %d (after %s)\n", s, sh.Epoch(), sh.NextLSN(), fmtBatchRef(rows[s].pos.LastBatch))
	}
	if err := l.Close(); err != nil {
		return err
	}
	if err := checkPromoted(target, shards, epoch); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "promoted: %s is the leader node directory of %d shard(s) at epoch %d\n", target, shards, epoch)
	fmt.Fprintf(stdout, "serve it: oncewal leader --dir %s --shards %d --followers ID,... --listen ADDR (TLS flags)\n", target, shards)
	return nil
}

// checkPromoted re-reads every store of target as persisted and refuses to
// report a promotion the stores do not hold: each must be at epoch, marked
// a leader's.
func checkPromoted(target string, shards int, epoch uint64) error {
	for s := range uint32(shards) {
		dir := follower.ShardDir(target, s)
		info, err := follower.PeekStore(nil, dir)
		if err != nil {
			return fmt.Errorf("re-reading %s after the promotion: %w", dir, err)
		}
		if info.Epoch != epoch || !info.Leader {
			return fmt.Errorf("%w: %s holds epoch %d (leader's store: %v) after the promotion to epoch %d",
				errCannotPromote, dir, info.Epoch, info.Leader, epoch)
		}
	}
	return nil
}

func shardsOf(rows []storeRow) []uint32 {
	out := make([]uint32, len(rows))
	for i, r := range rows {
		out[i] = r.shard
	}
	return out
}

func shardNote(r storeRow) string {
	if !r.node {
		return ""
	}
	return fmt.Sprintf(" shard %d", r.shard)
}

func storeDirIn(out string, node bool) string {
	if node {
		return out
	}
	return follower.ShardDir(out, 0)
}

// moveInto renames a node directory to out, or a single store to
// out/shard-0000, and makes the renames durable. A rename is atomic: after
// a crash the directory is in one place or the other.
func moveInto(dir, out string, node bool) error {
	parent := filepath.Dir(filepath.Clean(out))
	if !node {
		if err := os.Mkdir(out, 0o755); err != nil {
			return err
		}
		parent = out
	}
	if err := os.Rename(dir, storeDirIn(out, node)); err != nil {
		if !node {
			_ = os.Remove(out)
		}
		return fmt.Errorf("moving %s: %w", dir, err)
	}
	for _, d := range []string{filepath.Dir(filepath.Clean(dir)), parent, filepath.Dir(filepath.Clean(out))} {
		if err := syncDir(d); err != nil {
			return err
		}
	}
	return nil
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}
