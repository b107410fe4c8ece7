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

func BenchmarkLeaderConcurrent(b *testing.B) {
	b.Run("appenders=1", LeaderConcurrent(1))
	b.Run("appenders=4", LeaderConcurrent(4))
	b.Run("appenders=16", LeaderConcurrent(16))
}
