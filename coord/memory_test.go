package coord

import (
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
