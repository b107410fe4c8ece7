package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/oncewal/oncewal/leader"
	"github.com/oncewal/oncewal/store"
)

const promoteSynopsis = `promote --dir DIR [--out LEADER_DIR] [--epoch E] [--peers DIR,DIR,... [--catch-up]]

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
is fine — naming it, so the LSNs a majority acknowledged survive. When no
follower is the most advanced on every shard, --catch-up first replaces each
store of DIR a peer is ahead on with a verified copy of the most advanced
peer's store of that shard (same identity; installed atomically). --epoch
must exceed every epoch DIR and the peers have seen (default: the highest
+ 1). The new epoch and the LSN its log starts at are persisted in each
store before promote returns; from then on those stores refuse the deposed
leader's batches. A peer behind the promoted follower cannot continue from
the new leader's log (it starts after the promoted position: refused as
behind retention) and must be rebuilt, e.g. from a copy of DIR taken before
the promotion. Nothing is moved or written when a check fails: every
store of DIR and the peers is read in full first (a damaged one is refused,
naming it). Then the decision (epoch, target) is written to PROMOTING in the
node directory being made, and the move and each shard's new epoch follow:
a promotion interrupted at any step (a crash, an error) is finished by
running the same command again; oncewal leader and oncewal follower refuse
the directory until then.`

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
	catchUp := fs.Bool("catch-up", false, "first replace each store of DIR that a peer is ahead on with a verified copy of the most advanced peer's store of that shard (when no follower is the most advanced on every shard)")
	pos, status, ok := parseArgs(fs, args, stdout)
	if !ok {
		return status
	}
	if len(pos) > 0 {
		return usageError(fs, stderr, "unexpected argument %q", pos[0])
	}
	var c flagCheck
	checkEpochFlag(&c, *epoch)
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
	if *out != "" && filepath.Clean(*out) == filepath.Clean(*dir) {
		c.failf("--out is --dir: leave --out out to promote a node directory in place")
	}
	if code, bad := c.refuse(fs, stderr); bad {
		return code
	}
	if *catchUp && len(peerDirs) == 0 {
		c.failf("--catch-up needs --peers")
	}
	if code, bad := c.refuse(fs, stderr); bad {
		return code
	}
	if err := promote(promoteConfig{dir: *dir, out: *out, epoch: *epoch, peers: peerDirs, catchUp: *catchUp}, stdout, stderr); err != nil {
		fmt.Fprintf(stderr, "oncewal promote: %v\n", err)
		return exitFailure
	}
	return exitOK
}

type promoteConfig struct {
	dir, out string
	epoch    uint64
	peers    []string
	catchUp  bool   // replace DIR's stores that a peer is ahead on with a verified copy of the most advanced
	fs       vfs.FS // what promote changes files through (nil: the OS); its reads are the OS's
}

func promote(c promoteConfig, stdout, stderr io.Writer) error {
	fs := c.fs
	if fs == nil {
		fs = vfs.Default
	}
	// An interrupted run of this command is finished, not started again.
	if in, ok, err := findIntent(fs, c); err != nil {
		return err
	} else if ok {
		fmt.Fprintf(stdout, "finishing an interrupted promotion of %s to epoch %d\n", in.Dir, in.Epoch)
		return reportPromoted(finishPromote(fs, in, stdout, stderr), in, stdout)
	}
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
	all := slices.Clone(rows)
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
			if int(pr.shard) >= shards {
				return fmt.Errorf("%w: peer %s holds shard %d, %s only shards 0..%d", errCannotPromote, p, pr.shard, c.dir, shards-1)
			}
		}
		all = append(all, prows...)
	}
	// Per shard, the most advanced store of DIR and the peers (DIR's on a
	// tie: its rows come first).
	rank := leader.Rank(candidatesOf(all))
	var catchUp []catchUpStore
	for _, sr := range rank.Shards {
		b := all[sr.Best]
		if b.arg == c.dir {
			continue
		}
		mine := rows[sr.Shard]
		if !c.catchUp {
			return notMostAdvanced(c, mine, b, all)
		}
		catchUp = append(catchUp, catchUpStore{Shard: sr.Shard, From: b.dir, AppliedLSN: b.pos.AppliedLSN,
			LastBatch: b.pos.LastBatch})
	}
	// Every store is read in full before anything changes: a damaged block
	// met by the leader's open would otherwise stop the promotion after the
	// move and after earlier shards took the new epoch.
	for _, d := range append([]string{c.dir}, c.peers...) {
		rs, _, err := readRows(d, stderr)
		if err != nil {
			return err
		}
		for _, r := range rs {
			if err := verifyStore(r.dir, stderr); err != nil {
				return fmt.Errorf("%w: %w", errCannotPromote, err)
			}
		}
	}
	for _, cu := range catchUp {
		if err := checkCatchUpIdentity(c.dir, node, cu); err != nil {
			return err
		}
	}
	epoch, err := rank.Epoch(c.epoch, "--epoch")
	if err != nil {
		return err
	}

	in := promoteIntent{Dir: c.dir, Out: c.out, Node: node, Shards: shards, Epoch: epoch, CatchUp: catchUp}
	if c.out != "" {
		// An empty --out (or one holding a partial intent) is what a run
		// interrupted before its intent was durable leaves.
		names, err := fs.List(c.out)
		names = slices.DeleteFunc(names, func(n string) bool { return n == promoteIntentName+".tmp" })
		if err == nil && len(names) > 0 || err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("%w: --out %s already exists", errCannotPromote, c.out)
		}
		if !node {
			if err := fs.MkdirAll(c.out, 0o755); err != nil {
				return err
			}
			if err := syncDirFS(fs, filepath.Dir(filepath.Clean(c.out))); err != nil {
				return err
			}
		}
	}
	// From here on the promotion is all or nothing: the intent is durable
	// before anything else changes, and the same command run again after a
	// crash or an error finishes it (finishPromote).
	if err := writeIntent(fs, in.home(false), in); err != nil {
		return err
	}
	return reportPromoted(finishPromote(fs, in, stdout, stderr), in, stdout)
}

func reportPromoted(err error, in promoteIntent, stdout io.Writer) error {
	if err != nil {
		return err
	}
	target := in.target()
	fmt.Fprintf(stdout, "promoted: %s is the leader node directory of %d shard(s) at epoch %d\n", target, in.Shards, in.Epoch)
	fmt.Fprintf(stdout, "serve it: oncewal leader --dir %s --shards %d --followers ID,... --listen ADDR (TLS flags)\n", target, in.Shards)
	return nil
}

// notMostAdvanced is the refusal of DIR when peer row ahead is ahead of
// DIR's row mine: "promote X instead" when one directory is the most
// advanced on every shard; otherwise the catch-up command (the same advice
// whichever directory was given: no two answers name each other).
func notMostAdvanced(c promoteConfig, mine, ahead storeRow, all []storeRow) error {
	args := append([]string{c.dir}, c.peers...)
	what := fmt.Sprintf("%s%s is at LSN %d (last batch %s), peer %s is ahead at LSN %d (last batch %s)",
		c.dir, shardNote(mine), mine.pos.AppliedLSN, fmtBatchRef(mine.pos.LastBatch),
		ahead.dir, ahead.pos.AppliedLSN, fmtBatchRef(ahead.pos.LastBatch))
	if best, _ := mostAdvanced(all); best != "" {
		return fmt.Errorf("%w: %s: promote %s instead", errNotMostAdvanced, what, best)
	}
	return fmt.Errorf("%w: %s, and no follower is the most advanced on every shard: %s",
		errNotMostAdvanced, what, catchUpAdvice(args))
}

// catchUpAdvice is the recipe when no directory is the most advanced on
// every shard: promote the first with the others' stores of the shards
// they lead.
func catchUpAdvice(args []string) string {
	return fmt.Sprintf("promote one with a copy of the most advanced store of each shard: oncewal promote --dir %s --peers %s --catch-up",
		args[0], strings.Join(args[1:], ","))
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
	return store.ShardDir(out, 0)
}

// moveInto renames a node directory to out, or a single store to
// out/shard-0000 (out exists then: promote made it), and makes the renames
// durable. A rename is atomic: after a crash the directory is in one place
// or the other.
func moveInto(fs vfs.FS, dir, out string, node bool) error {
	parent := filepath.Dir(filepath.Clean(out))
	if !node {
		parent = out
	}
	if err := fs.Rename(dir, storeDirIn(out, node)); err != nil {
		return fmt.Errorf("moving %s: %w", dir, err)
	}
	for _, d := range []string{filepath.Dir(filepath.Clean(dir)), parent, filepath.Dir(filepath.Clean(out))} {
		if err := syncDirFS(fs, d); err != nil {
			return err
		}
	}
	return nil
}
