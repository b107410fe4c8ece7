package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/oncewal/oncewal/store"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/oncewal/oncewal/leader"
)

// promoteIntentName is the file a promotion keeps in the node directory it
// builds while it changes anything (see finishPromote).
const promoteIntentName = "PROMOTING"

// errPromoteInterrupted: a directory holds the intent of a promotion that
// did not finish; running the same promote command again finishes it.
var errPromoteInterrupted = errors.New("an interrupted promotion")

// promoteIntent is what a promotion decided before it changed anything: the
// same command run again after a crash or an error finishes it with these
// values (the epoch is not chosen again: the shards promoted already hold
// it, so "the highest seen + 1" would now be one more).
type promoteIntent struct {
	Dir    string `json:"dir"`
	Out    string `json:"out"`
	Node   bool   `json:"node"`
	Shards int    `json:"shards"`
	Epoch  uint64 `json:"epoch"`
	// CatchUp are the stores of Dir replaced first (promote --catch-up).
	CatchUp []catchUpStore `json:"catch_up,omitempty"`
}

// intentHome is the directory that holds the intent: the node directory
// (it moves to --out with it), or --out for a single store (made first).
func (in promoteIntent) home(moved bool) string {
	if in.Node && (in.Out == "" || !moved) {
		return in.Dir
	}
	return in.Out
}

// target is the leader node directory the promotion makes.
func (in promoteIntent) target() string {
	if in.Out != "" {
		return in.Out
	}
	return in.Dir
}

func (in promoteIntent) command() string {
	cmd := "oncewal promote --dir " + in.Dir
	if in.Out != "" {
		cmd += " --out " + in.Out
	}
	return cmd
}

// findIntent looks for the intent of an interrupted promotion of c: in
// --out (after the move, or a single store's) or in --dir (a node before
// the move). An intent of another command is refused.
func findIntent(fs vfs.FS, c promoteConfig) (promoteIntent, bool, error) {
	var homes []string
	if c.out != "" {
		homes = append(homes, c.out)
	}
	homes = append(homes, c.dir)
	for _, h := range homes {
		b, err := readAll(fs, fs.PathJoin(h, promoteIntentName))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return promoteIntent{}, false, err
		}
		var in promoteIntent
		if err := json.Unmarshal(b, &in); err != nil {
			return promoteIntent{}, false, fmt.Errorf("%w: %s: %v", errCannotPromote, fs.PathJoin(h, promoteIntentName), err)
		}
		if filepath.Clean(in.Dir) != filepath.Clean(c.dir) || filepath.Clean(in.Out) != filepath.Clean(c.out) && !(in.Out == "" && c.out == "") {
			return promoteIntent{}, false, fmt.Errorf("%w: %w in %s was started as %s: run that command to finish it",
				errCannotPromote, errPromoteInterrupted, h, in.command())
		}
		return in, true, nil
	}
	return promoteIntent{}, false, nil
}

func readAll(fs vfs.FS, name string) ([]byte, error) {
	f, err := fs.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(f)
}

// writeIntent makes the intent durable in dir: written to a temporary
// file, synced, renamed into place and the directory synced, so that after
// a crash it is there whole or not at all.
func writeIntent(fs vfs.FS, dir string, in promoteIntent) error {
	b, err := json.Marshal(in)
	if err != nil {
		return err
	}
	tmp, name := fs.PathJoin(dir, promoteIntentName+".tmp"), fs.PathJoin(dir, promoteIntentName)
	f, err := fs.Create(tmp, vfs.WriteCategoryUnspecified)
	if err != nil {
		return fmt.Errorf("writing %s: %w", tmp, err)
	}
	if _, err := f.Write(b); err != nil {
		_ = f.Close()
		return fmt.Errorf("writing %s: %w", tmp, err)
	}
	if err := errors.Join(f.Sync(), f.Close()); err != nil {
		return fmt.Errorf("writing %s: %w", tmp, err)
	}
	if err := fs.Rename(tmp, name); err != nil {
		return fmt.Errorf("writing %s: %w", name, err)
	}
	return syncDirFS(fs, dir)
}

// finishPromote carries out a promotion whose intent is durable, every
// step of it idempotent, so that the same command run again after a crash
// or an error at any step finishes it: replace the --catch-up stores (if
// DIR is still in place), move DIR into --out if it is still in place, open the target as the leader at the intent's epoch (each
// shard's store takes the epoch and its log starts; a shard that took it
// already keeps it), then remove the intent.
func finishPromote(fs vfs.FS, in promoteIntent, stdout, stderr io.Writer) error {
	if exists(fs, in.Dir) {
		// Not moved yet: the catch-up copies come first.
		if err := catchUp(fs, in, stderr); err != nil {
			return fmt.Errorf("%w (run %s again to finish the promotion)", err, in.command())
		}
		for _, cu := range in.CatchUp {
			fmt.Fprintf(stdout, "shard %d: caught up from %s (LSN %d, last batch %s)\n", cu.Shard, cu.From, cu.AppliedLSN, fmtBatchRef(cu.LastBatch))
		}
	}
	if in.Out != "" {
		if _, err := fs.Stat(in.Dir); err == nil {
			if err := moveInto(fs, in.Dir, in.Out, in.Node); err != nil {
				return err
			}
			fmt.Fprintf(stdout, "moved %s to %s\n", in.Dir, storeDirIn(in.Out, in.Node))
		} else if !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	target := in.target()
	l, err := leader.Open(target, &leader.Options{
		FS: fs, Shards: in.Shards, Epoch: in.Epoch, Promote: true,
		Logger: slog.New(slog.DiscardHandler), Store: store.Options{FS: fs, Logger: slog.New(slog.DiscardHandler)},
	})
	if err != nil {
		return fmt.Errorf("opening %s as the leader at epoch %d: %w (run %s again to finish the promotion)", target, in.Epoch, err, in.command())
	}
	for s := range uint32(in.Shards) {
		sh, _ := l.Shard(s)
		fmt.Fprintf(stdout, "shard %d: epoch %d starts at LSN %d\n", s, sh.Epoch(), sh.NextLSN())
	}
	if err := l.Close(); err != nil {
		return fmt.Errorf("closing %s: %w (run %s again to finish the promotion)", target, err, in.command())
	}
	if err := checkPromoted(fs, target, in.Shards, in.Epoch); err != nil {
		return err
	}
	if err := fs.Remove(fs.PathJoin(target, promoteIntentName)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("finishing the promotion: %w (run %s again)", err, in.command())
	}
	// The promotion is complete on disk once the intent is gone; a failed
	// sync only leaves the removal undurable (after a crash the intent may
	// be back, and the same command finishes again), so it is a warning.
	if err := syncDirFS(fs, target); err != nil {
		fmt.Fprintf(stdout, "warning: syncing %s after removing %s failed (%v); if the machine crashes before the next sync, run %s again\n",
			target, promoteIntentName, err, in.command())
	}
	return nil
}

func syncDirFS(fs vfs.FS, dir string) error {
	f, err := fs.OpenDir(dir)
	if err != nil {
		return err
	}
	return errors.Join(f.Sync(), f.Close())
}

// checkNoIntent refuses a directory that holds the intent of an
// interrupted promotion (oncewal leader, oncewal follower --shards): its
// shards may stand at different epochs until the promote command that left
// it, run again, finishes.
func checkNoIntent(dir string) error {
	b, err := os.ReadFile(filepath.Join(dir, promoteIntentName))
	if err != nil {
		return nil // none (or dir is no directory: leader.Open says so)
	}
	cmd := "the promote command that was interrupted"
	var in promoteIntent
	if json.Unmarshal(b, &in) == nil {
		cmd = in.command()
	}
	return fmt.Errorf("%s holds %w (%s): run %s again to finish it first",
		dir, errPromoteInterrupted, promoteIntentName, cmd)
}

func exists(fs vfs.FS, path string) bool {
	_, err := fs.Stat(path)
	return err == nil
}

// checkPromoted re-reads every store of target as persisted and refuses to
// report a promotion the stores do not hold: each must be at epoch, marked
// a leader's.
func checkPromoted(fs vfs.FS, target string, shards int, epoch uint64) error {
	for s := range uint32(shards) {
		dir := store.ShardDir(target, s)
		info, err := store.PeekStore(fs, dir)
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
