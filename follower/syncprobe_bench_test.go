package follower_test

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// syncProbe wraps an FS and times every Sync, SyncData and SyncTo of the
// files opened through it: how many, how long in total, and for how long at
// least one was in flight. total/busy is the mean number of syncs in flight
// while any is: 1.0 means the syncs of separate stores never overlapped.
// WAL syncs (files *.log) are also counted apart: one per synced batch.
type syncProbe struct {
	vfs.FS

	mu       sync.Mutex
	inFlight int
	since    time.Time
	busy     time.Duration
	total    time.Duration
	n        int
	walTotal time.Duration
	walN     int
}

type syncProbeStats struct {
	n, walN               int
	busy, total, walTotal time.Duration
}

func (p *syncProbe) stats() syncProbeStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return syncProbeStats{n: p.n, walN: p.walN, busy: p.busy, total: p.total, walTotal: p.walTotal}
}

func (s syncProbeStats) sub(o syncProbeStats) syncProbeStats {
	return syncProbeStats{n: s.n - o.n, walN: s.walN - o.walN, busy: s.busy - o.busy,
		total: s.total - o.total, walTotal: s.walTotal - o.walTotal}
}

// report adds the probe's metrics to b for a run of wall time elapsed.
func (s syncProbeStats) report(b *testing.B, elapsed time.Duration) {
	if s.walN > 0 {
		b.ReportMetric(float64(s.walTotal.Microseconds())/float64(s.walN), "wal-sync-µs")
	}
	if s.busy > 0 {
		b.ReportMetric(float64(s.total)/float64(s.busy), "syncs-in-flight")
		b.ReportMetric(100*float64(s.busy)/float64(elapsed), "sync-busy-%")
	}
}

func (p *syncProbe) begin() time.Time {
	now := time.Now()
	p.mu.Lock()
	if p.inFlight == 0 {
		p.since = now
	}
	p.inFlight++
	p.mu.Unlock()
	return now
}

func (p *syncProbe) end(start time.Time, wal bool) {
	now := time.Now()
	p.mu.Lock()
	p.inFlight--
	if p.inFlight == 0 {
		p.busy += now.Sub(p.since)
	}
	d := now.Sub(start)
	p.total += d
	p.n++
	if wal {
		p.walTotal += d
		p.walN++
	}
	p.mu.Unlock()
}

func (p *syncProbe) wrap(name string, f vfs.File, err error) (vfs.File, error) {
	if err != nil {
		return f, err
	}
	return &probeFile{File: f, p: p, wal: strings.HasSuffix(name, ".log")}, nil
}

func (p *syncProbe) Create(name string, c vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := p.FS.Create(name, c)
	return p.wrap(name, f, err)
}

func (p *syncProbe) OpenReadWrite(name string, c vfs.DiskWriteCategory, opts ...vfs.OpenOption) (vfs.File, error) {
	f, err := p.FS.OpenReadWrite(name, c, opts...)
	return p.wrap(name, f, err)
}

func (p *syncProbe) ReuseForWrite(oldname, newname string, c vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := p.FS.ReuseForWrite(oldname, newname, c)
	return p.wrap(newname, f, err)
}

func (p *syncProbe) OpenDir(name string) (vfs.File, error) {
	f, err := p.FS.OpenDir(name)
	return p.wrap(name, f, err)
}

type probeFile struct {
	vfs.File
	p   *syncProbe
	wal bool
}

func (f *probeFile) Sync() error {
	defer f.p.end(f.p.begin(), f.wal)
	return f.File.Sync()
}

func (f *probeFile) SyncData() error {
	defer f.p.end(f.p.begin(), f.wal)
	return f.File.SyncData()
}

func (f *probeFile) SyncTo(length int64) (bool, error) {
	defer f.p.end(f.p.begin(), f.wal)
	return f.File.SyncTo(length)
}
