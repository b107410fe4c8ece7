package snapshot

import (
	"fmt"
	"time"
)

// Options configures Fetch. Every zero field takes the default named in its
// comment (EnsureDefaults); Validate reports every problem at once.
type Options struct {
	// ChunkSize is the number of bytes asked for in one read. Default 1 MiB.
	ChunkSize int
	// RateLimit caps the transfer in bytes per second, so that a rebuild
	// does not starve replication on the donor (its disk and, over the
	// network, its link). Default DefaultRateLimit (64 MiB/s); negative: no
	// limit.
	RateLimit int64
	// Retries is how many times a failed chunk read is retried from the same
	// offset before Fetch gives up. Default 5.
	Retries int
	// RetryBackoff is the first wait before a retry; it doubles each time.
	// Default 50ms.
	RetryBackoff time.Duration
	// Holder names the fetcher to a donor that tells fetchers apart
	// (HeldSource): each Begin releases the snapshots the donor still
	// serves to the same holder — one whose Begin answer was lost, one a
	// killed fetcher never ended — instead of leaving them to pin the
	// donor's checkpoint and retained log until its idle timeout. It must
	// be stable across the fetcher's restarts and unique among the donor's
	// fetchers: follower.Rebuild uses the follower's ID and shard. Default:
	// a random name per Fetch (its own retries are covered, a restart is
	// left to the idle timeout).
	Holder string
}

// DefaultRateLimit is the default transfer rate cap, bytes per second.
const DefaultRateLimit = 64 << 20

// EnsureDefaults fills unset fields with their documented defaults.
func (o *Options) EnsureDefaults() *Options {
	if o.ChunkSize == 0 {
		o.ChunkSize = 1 << 20
	}
	if o.RateLimit == 0 {
		o.RateLimit = DefaultRateLimit
	}
	if o.Retries == 0 {
		o.Retries = 5
	}
	if o.RetryBackoff == 0 {
		o.RetryBackoff = 50 * time.Millisecond
	}
	return o
}

// Validate reports every invalid field in one error wrapping ErrBadOptions.
func (o *Options) Validate() error {
	var errs []error
	if o.ChunkSize < 0 || o.ChunkSize > MaxChunkSize {
		errs = append(errs, fmt.Errorf("ChunkSize %d is outside 1..%d", o.ChunkSize, MaxChunkSize))
	}
	if o.Retries < 0 {
		errs = append(errs, fmt.Errorf("Retries %d is negative", o.Retries))
	}
	if o.RetryBackoff < 0 {
		errs = append(errs, fmt.Errorf("RetryBackoff %v is negative", o.RetryBackoff))
	}
	return badOptions("Options", errs)
}

// MaxChunkSize bounds one chunk read (a gRPC message must hold it).
const MaxChunkSize = 4 << 20

// pacer spaces reads so that their bytes average at most rate per second.
type pacer struct {
	rate  int64 // bytes/s; <= 0: no limit
	start time.Time
	bytes int64
}

// reserve accounts n bytes and returns how long to wait before using them.
// An idle pacer (its budget more than a second in the past) starts afresh,
// so a pause does not bank a burst.
func (p *pacer) reserve(n int) time.Duration {
	if p.rate <= 0 {
		return 0
	}
	now := time.Now()
	due := p.start.Add(time.Duration(float64(p.bytes) / float64(p.rate) * float64(time.Second)))
	if p.start.IsZero() || now.Sub(due) > time.Second {
		p.start, p.bytes = now, 0
	}
	p.bytes += int64(n)
	due = p.start.Add(time.Duration(float64(p.bytes) / float64(p.rate) * float64(time.Second)))
	return due.Sub(now)
}
