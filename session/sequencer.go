package session

import "sync"

// sequencerShards spreads sessions over independent locks so that concurrent
// producers on different sessions rarely contend.
const sequencerShards = 64

// Sequencer hands out SeqNos on the leader: the first Next for a session
// returns 1, each later call returns one more. Safe for concurrent use; calls
// for one session are linearizable, so no two callers ever get the same SeqNo.
//
// The Sequencer is memory only. A leader that restarts must restore the last
// SeqNo of each live session (e.g. from its WAL) with Observe before handing
// out new ones, or it would reuse SeqNos that followers treat as duplicates.
type Sequencer struct {
	shards [sequencerShards]sequencerShard
}

type sequencerShard struct {
	mu   sync.Mutex
	last map[ID]SeqNo
	_    [40]byte // keep shards on separate cache lines
}

// NewSequencer returns an empty Sequencer.
func NewSequencer() *Sequencer {
	s := &Sequencer{}
	for i := range s.shards {
		s.shards[i].last = make(map[ID]SeqNo)
	}
	return s
}

func (s *Sequencer) shard(id ID) *sequencerShard {
	// IDs are random, so any byte is a uniform shard selector.
	return &s.shards[id[0]%sequencerShards]
}

// Next returns the next SeqNo of the session (1 for a session it has not seen).
func (s *Sequencer) Next(id ID) SeqNo {
	sh := s.shard(id)
	sh.mu.Lock()
	n := sh.last[id] + 1
	sh.last[id] = n
	sh.mu.Unlock()
	return n
}

// Last returns the last SeqNo handed out for the session, 0 if none.
func (s *Sequencer) Last(id ID) SeqNo {
	sh := s.shard(id)
	sh.mu.Lock()
	n := sh.last[id]
	sh.mu.Unlock()
	return n
}

// Observe raises the session's last SeqNo to seq if it is lower (never lowers
// it). A restarted leader calls it for every event it finds in its WAL.
func (s *Sequencer) Observe(id ID, seq SeqNo) {
	sh := s.shard(id)
	sh.mu.Lock()
	if seq > sh.last[id] {
		sh.last[id] = seq
	}
	sh.mu.Unlock()
}

// Forget drops the session (after its close, or when it expired). A later Next
// for the same ID starts again at 1, which followers would refuse or treat as a
// duplicate while they still remember the session: only forget sessions that
// will not be used again.
func (s *Sequencer) Forget(id ID) {
	sh := s.shard(id)
	sh.mu.Lock()
	delete(sh.last, id)
	sh.mu.Unlock()
}

// Len returns the number of sessions the Sequencer remembers.
func (s *Sequencer) Len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += len(sh.last)
		sh.mu.Unlock()
	}
	return n
}
