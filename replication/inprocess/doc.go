// Package inprocess is a replication transport inside one process: a
// Transport is both the leader's Listener and the followers' Dialer, over
// channels, and injects faults — dropped, duplicated, reordered and delayed
// batches and acks, disconnects — from a plan seeded by one number, so a
// seed replays a run's faults (FaultOptions; FaultsNone, FaultsLight,
// FaultsHeavy). It keeps the replication.Transport contract in its weakest
// form, which is what the simulation and the shipping and receiving tests
// prove exactly-once against.
package inprocess
