// Package bench holds oncewal's benchmark suite. The bodies are exported
// functions in non-test files, so `go test -bench` (through thin Benchmark
// wrappers in the _test files) and `oncewal bench` (through
// testing.Benchmark) measure the same code.
//
// End to end (receiver.go, workload.go): a follower on disk applies shipped
// 1000-event batches, each committed with Sync; 100,000 sessions, every
// event a put of a 24-byte key and 100-byte value row, every event carrying
// an idempotency key. Beside it, in the same run: raw Pebble ingest of the
// same rows (the physical floor), raw ingest of everything the receiver
// writes (rows + HWM log delta and checkpoints + window journal + position),
// and a naive design that keeps every idempotency key in Pebble and reads it
// before applying.
// Workloads: all fresh, 100% and 30% redeliveries (SeqNo at or below the
// HWM, re-logged at new LSNs), and 10-event bursts per session. Each design
// is preloaded once (every session gets an HWM) and kept while testing ramps
// b.N; batches are composed with the timer stopped. Figures: events/s and
// cpu-ns/event (process CPU, Pebble's background work included — the
// machines these run on are shared and noisy, so read both).
//
// Workloads also include 100% client retries (Retry: a fresh SeqNo carrying
// the key of one of the last 50,000 fresh events, caught by the window).
// These rows apply each batch and wait for its sync before the next, as
// Receiver.Apply does; ReceiverPipelined applies them the way a serving
// follower does (4 batches between Start and Wait), to show how much of a
// row's wall clock is the fsync wait. oncewal bench has the pipelined
// duplicate rows (dup100_pipelined, dup100_window_pipelined: one at a time
// every batch waits out an fdatasync before its ack; pipelined, dup100's
// batches, which change only the position, share one per
// store.DefaultPositionSyncEvery); pipelined fresh apply is not a CLI row,
// as its raw reference would have to be pipelined too. DupCeiling is the
// floor under the duplicate rows: the same batches only decoded and
// checked against the HWMs, nothing written or synced.
//
// Pipeline (e2e.go): leader WAL → Shipper → in-process transport → follower
// on a client-request workload (16-byte request IDs as keys, 64-byte
// payloads, ClientKey idempotency keys, 0, 30 or 100% retries among the
// last 50,000 IDs), Sync per batch on both sides or on neither, beside the
// at-least-once reference (PipelineRaw: the follower writes every event's
// row, no dedup); and a node of 4 shards applying fresh events with and
// without Sync (Shards). Replicated (replicated.go) runs the same requests
// through a stamping leader and two real followers, every copy synced per
// batch, timed to the majority ack: what a replicated deployment costs
// against the one-follower pipeline.
//
// Leader (leader.go): a leader on disk stamps and ships 1000-event batches
// of puts to n followers over the in-process transport. LeaderShip's
// followers acknowledge without applying, so its CPU per event is the
// leader's own (stamping, WAL append and sync, its local store, one shipping
// stream per follower) — compared at 1 and 3 followers; LeaderQuorum's
// followers are real (on disk, synced) and the client waits for a majority
// after every batch. LeaderConcurrent (leader_concurrent.go): n goroutines
// append 100-event batches to one shard, no followers — group commit shares
// the WAL's fdatasync among them (oncewal bench: 16 appenders against 1).
//
// Client (client.go): the front door. ClientNetwork sends a client-retry
// workload (16-byte request IDs, 64-byte payloads, 30% retries) from 16
// concurrent callers through client.Client to the client service on a
// real gRPC server with mutual TLS on loopback; ClientInProcess does the
// service's work per request (Shard.Claim, the default handler,
// Shard.Commit, the ack wait) in process: the reference. Both without
// followers (ack leader) and with majority acks of 1 and 2 real followers.
//
// Components: the idempotency window against golang-lru/v2 (check cost,
// heap per entry fresh and churned; window.go), DeriveKey against
// blake3.Sum256 (derive.go), and the session Tracker (tracker_test.go).
//
//	go test ./bench -run '^$' -bench Receiver -count 3
//	go test ./bench -run '^$' -bench 'Window$|DeriveKey' -count 3
//	go test ./bench -run '^$' -bench WindowMemory -benchtime 1x
//	go test ./bench -run '^$' -bench 'Leader' -benchtime 2s
//	go test ./bench -run '^$' -bench 'Pipeline|Shards' -benchtime 2s
//	go test ./bench -run '^$' -bench Replicated -benchtime 100x
//	go test ./bench -run '^$' -bench Client -benchtime 2s -count 3
//	go run ./cmd/oncewal bench [--quick] [--json] [--cpu-hog]
package bench
