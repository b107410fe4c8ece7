package bench

import "testing"

func BenchmarkLeaderShip(b *testing.B) {
	b.Run("followers=1", LeaderShip(1))
	b.Run("followers=3", LeaderShip(3))
}

func BenchmarkLeaderQuorum(b *testing.B) {
	b.Run("followers=1", LeaderQuorum(1))
	b.Run("followers=3", LeaderQuorum(3))
}
