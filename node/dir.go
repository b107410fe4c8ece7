package node

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// identity is what the NODE file says: whose directory this is.
type identity struct {
	Cluster string `json:"cluster"`
	ID      string `json:"id"`
	Shards  int    `json:"shards"`
}

// checkIdentity refuses a directory of another cluster, member or shard
// count, and records want in a new one (invariant 5).
func checkIdentity(fs vfs.FS, dir string, want identity) error {
	path := fs.PathJoin(dir, nodeFileName)
	f, err := fs.Open(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return writeIdentity(fs, dir, want)
	case err != nil:
		return fmt.Errorf("node: reading %s: %w", path, err)
	}
	defer f.Close()
	b, err := io.ReadAll(f)
	if err != nil {
		return fmt.Errorf("node: reading %s: %w", path, err)
	}
	var got identity
	if err := json.Unmarshal(b, &got); err != nil {
		return fmt.Errorf("%w: %s does not decode (%v): it is not a node directory", ErrForeignDir, path, err)
	}
	if got != want {
		return fmt.Errorf("%w: %s is member %q of cluster %q with %d shards, not member %q of %q with %d",
			ErrForeignDir, dir, got.ID, got.Cluster, got.Shards, want.ID, want.Cluster, want.Shards)
	}
	return nil
}

// writeIdentity writes the NODE file durably: a temporary file synced,
// renamed into place, and the directory synced.
func writeIdentity(fs vfs.FS, dir string, id identity) error {
	tmp := fs.PathJoin(dir, nodeFileName+".tmp")
	f, err := fs.Create(tmp, vfs.WriteCategoryUnspecified)
	if err != nil {
		return fmt.Errorf("node: writing %s: %w", tmp, err)
	}
	b, _ := json.Marshal(id)
	if _, err = f.Write(append(b, '\n')); err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = fs.Rename(tmp, fs.PathJoin(dir, nodeFileName))
	}
	if err == nil {
		err = syncDir(fs, dir)
	}
	if err != nil {
		return fmt.Errorf("node: writing the NODE file in %s: %w", dir, err)
	}
	return nil
}

func syncDir(fs vfs.FS, dir string) error {
	d, err := fs.OpenDir(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}
