package coord

import "testing"

// TestMemory: the in-process coordinator keeps the contract.
func TestMemory(t *testing.T) {
	runSuite(t, engine{
		name: "memory",
		open: func(t *testing.T) (Coordinator, Coordinator) {
			m := NewMemory()
			t.Cleanup(func() { _ = m.Close() })
			return m, m
		},
		kill: func(t *testing.T, l Leadership) {
			l.(*memLeadership).m.Expire(l)
		},
	})
}
