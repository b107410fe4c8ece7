package snapshot

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"github.com/oncewal/oncewal/internal/ctxtime"
	"io"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/oncewal/oncewal/wal"
	"lukechampine.com/blake3"
)

// Stats reports one Fetch.
type Stats struct {
	Bytes    int64         // bytes of the installed snapshot
	Files    int           // its files
	Retries  int           // chunk reads retried from the same offset
	Restarts int           // snapshots abandoned because the source lost them
	Elapsed  time.Duration // from the first Begin to the verified staging directory
}

// Fetch copies a snapshot from src into the staging directory of storeDir
// (StagingDir), checking it against want before it writes anything and every
// file's BLAKE3 sum as it completes, then syncs it. It finishes or undoes an
// earlier install first (Recover). The store directory itself is not
// touched; on any error the staging directory is removed.
func Fetch(ctx context.Context, src Source, fs vfs.FS, storeDir string, want Want, opts *Options) (Manifest, Stats, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	o.EnsureDefaults()
	if err := o.Validate(); err != nil {
		return Manifest{}, Stats{}, err
	}
	if err := Recover(fs, storeDir); err != nil {
		return Manifest{}, Stats{}, err
	}
	if o.Holder == "" {
		o.Holder = "fetch-" + rand.Text()
	}
	start := time.Now()
	var st Stats
	for {
		m, err := fetchOnce(ctx, src, fs, storeDir, want, &o, &st)
		if err == nil {
			st.Elapsed = time.Since(start)
			st.Bytes, st.Files = m.Bytes(), len(m.Files)
			return m, st, nil
		}
		removeStaging(fs, storeDir)
		if errors.Is(err, ErrUnknownSnapshot) && st.Restarts < o.Retries && ctx.Err() == nil {
			st.Restarts++
			continue
		}
		return Manifest{}, st, err
	}
}

func fetchOnce(ctx context.Context, src Source, fs vfs.FS, storeDir string, want Want, o *Options, st *Stats) (Manifest, error) {
	m, err := begin(ctx, src, want.Shard, o, st)
	if err != nil {
		return Manifest{}, fmt.Errorf("snapshot: beginning a snapshot: %w", err)
	}
	defer release(ctx, src, m.ID, o)
	if err := m.Check(); err != nil {
		return Manifest{}, err
	}
	if err := want.check(&m); err != nil {
		return Manifest{}, err
	}
	staging := StagingDir(storeDir)
	if err := fs.RemoveAll(staging); err != nil {
		return Manifest{}, fmt.Errorf("snapshot: clearing %s: %w", staging, err)
	}
	if err := wal.MkdirAllSynced(fs, staging); err != nil {
		return Manifest{}, fmt.Errorf("snapshot: creating %s: %w", staging, err)
	}
	p := pacer{rate: o.RateLimit}
	buf := make([]byte, o.ChunkSize)
	for _, f := range m.Files {
		if err := fetchFile(ctx, src, fs, staging, m.ID, f, buf, &p, o, st); err != nil {
			return Manifest{}, err
		}
	}
	if err := wal.SyncDir(fs, staging); err != nil {
		return Manifest{}, fmt.Errorf("snapshot: syncing %s: %w", staging, err)
	}
	if want.Describe != nil {
		got, err := want.Describe(fs, staging)
		if err != nil {
			return Manifest{}, fmt.Errorf("%w: the staged store does not open: %w", ErrCorrupt, err)
		}
		if got != m.Cut {
			return Manifest{}, fmt.Errorf("%w: the staged store is %+v, its manifest says %+v", ErrCorrupt, got, m.Cut)
		}
	}
	return m, nil
}

// fetchFile copies one file in chunks; a failed read is retried from the
// offset reached (resuming a dropped connection).
func fetchFile(ctx context.Context, src Source, fs vfs.FS, staging, id string, f File, buf []byte, p *pacer, o *Options, st *Stats) (err error) {
	out, err := fs.Create(fs.PathJoin(staging, f.Name), vfs.WriteCategoryUnspecified)
	if err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	defer func() {
		if cerr := out.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("snapshot: closing %s: %w", f.Name, cerr)
		}
	}()
	h := blake3.New(32, nil)
	var off int64
	failures, backoff := 0, o.RetryBackoff
	for off < f.Size {
		want := int(min(int64(len(buf)), f.Size-off))
		if err := ctxtime.Sleep(ctx, p.reserve(want)); err != nil {
			return err
		}
		n, rerr := src.Read(ctx, id, f.Name, off, buf[:want])
		n = min(max(n, 0), want)
		if n > 0 {
			// Hash before writing: a filesystem may scribble on a written
			// buffer (Pebble's MemFS does under its invariants build).
			h.Write(buf[:n])
			if _, err := out.Write(buf[:n]); err != nil {
				return fmt.Errorf("snapshot: writing %s: %w", f.Name, err)
			}
			off += int64(n)
			failures, backoff = 0, o.RetryBackoff
		}
		switch {
		case rerr == nil && n > 0:
			continue
		case errors.Is(rerr, io.EOF):
			if off < f.Size {
				return fmt.Errorf("%w: %s ended at %d of %d bytes", ErrTruncated, f.Name, off, f.Size)
			}
			continue
		case errors.Is(rerr, ErrUnknownSnapshot), ctx.Err() != nil:
			return cmpErr(ctx, rerr)
		}
		if rerr == nil {
			rerr = io.ErrNoProgress
		}
		if failures >= o.Retries {
			return fmt.Errorf("snapshot: reading %s at %d: %w", f.Name, off, rerr)
		}
		failures++
		st.Retries++
		if err := ctxtime.Sleep(ctx, backoff); err != nil {
			return err
		}
		backoff *= 2
	}
	if sum := hex.EncodeToString(h.Sum(nil)); sum != f.Sum {
		return fmt.Errorf("%w: %s has BLAKE3 %s, the manifest says %s", ErrCorrupt, f.Name, sum, f.Sum)
	}
	if err := out.Sync(); err != nil {
		return fmt.Errorf("snapshot: syncing %s: %w", f.Name, err)
	}
	return nil
}

func cmpErr(ctx context.Context, err error) error {
	if err == nil {
		return ctx.Err()
	}
	return err
}

// Rebuild fetches a snapshot for storeDir and installs it: Fetch, then
// Install. The store must not be open.
func Rebuild(ctx context.Context, src Source, fs vfs.FS, storeDir string, want Want, opts *Options) (Manifest, Stats, error) {
	m, st, err := Fetch(ctx, src, fs, storeDir, want, opts)
	if err != nil {
		return m, st, err
	}
	if err := Install(fs, storeDir); err != nil {
		return m, st, err
	}
	return m, st, nil
}

// release ends the snapshot on the source, retrying a failed call (a
// dropped connection) like a read; a donor releases one nobody ends after
// its idle timeout anyway.
func release(ctx context.Context, src Source, id string, o *Options) {
	ctx = context.WithoutCancel(ctx)
	backoff := o.RetryBackoff
	for try := 0; ; try++ {
		if src.End(ctx, id) == nil || try >= o.Retries {
			return
		}
		_ = ctxtime.Sleep(ctx, backoff)
		backoff *= 2
	}
}

// begin asks src for a snapshot for o.Holder, retrying what may be a
// dropped connection (an error that is none of this package's refusals; a
// closed donor, ErrClosed, is one: it will not answer otherwise on a
// retry, and the current leader may be another process). A
// snapshot whose answer was lost is released by the retry on a HeldSource,
// else by the donor's idle timeout.
func begin(ctx context.Context, src Source, shard uint32, o *Options, st *Stats) (Manifest, error) {
	backoff := o.RetryBackoff
	for try := 0; ; try++ {
		m, err := beginFor(ctx, src, shard, o.Holder)
		if err == nil || try >= o.Retries || ctx.Err() != nil || refusal(err) {
			return m, err
		}
		st.Retries++
		if err := ctxtime.Sleep(ctx, backoff); err != nil {
			return Manifest{}, err
		}
		backoff *= 2
	}
}

// refusal reports whether err is one of the typed refusals, which no retry
// changes.
func refusal(err error) bool {
	for _, r := range []error{ErrMismatch, ErrOlderEpoch, ErrDonorBehind, ErrCorrupt, ErrTruncated, ErrClosed} {
		if errors.Is(err, r) {
			return true
		}
	}
	return false
}
