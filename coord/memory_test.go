package coord

import (
	"errors"
	"testing"
	"time"
)

// TestMemory: the in-process coordinator keeps the contract.
func TestMemory(t *testing.T) {
	runSuite(t, engine{
		name: "memory",
		open: func(t *testing.T, ttl time.Duration) (Coordinator, Coordinator) {
			m := NewMemory()
			if ttl != 0 {
				if err := m.SetTTL(ttl); err != nil {
					t.Fatal(err)
				}
			}
			t.Cleanup(func() { _ = m.Close() })
			return m, m
		},
		kill: func(t *testing.T, l Leadership) {
			l.(*memLeadership).m.Expire(l)
		},
	})
}

// TestMemorySetTTL: a TTL too short to renew is refused and changes
// nothing; a good one is what LeaseTTL reports and what terms run on.
func TestMemorySetTTL(t *testing.T) {
	m := NewMemory()
	defer m.Close()
	if m.LeaseTTL() != DefaultLeaseTTL {
		t.Fatalf("LeaseTTL %v, want the default %v", m.LeaseTTL(), DefaultLeaseTTL)
	}
	for _, bad := range []time.Duration{0, -time.Second, time.Millisecond} {
		if err := m.SetTTL(bad); !errors.Is(err, ErrBadInput) {
			t.Errorf("SetTTL(%v): %v, want ErrBadInput", bad, err)
		}
	}
	if m.LeaseTTL() != DefaultLeaseTTL {
		t.Fatalf("a refused SetTTL changed LeaseTTL to %v", m.LeaseTTL())
	}
	if err := m.SetTTL(time.Minute); err != nil {
		t.Fatal(err)
	}
	l, err := m.Campaign(ctxT(t), "c1", nodeA)
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Until(l.Deadline()); d <= DefaultLeaseTTL || d > time.Minute {
		t.Fatalf("deadline %v ahead with a TTL of 1m", d)
	}
}
