package keyspace

import "strings"

// Top-level spaces. Every key oncewal writes starts with exactly one of them.
const (
	// HWM holds the session Tracker's records (package session): one row per
	// session, HWM + session ID (16 bytes), and the tracker's WAL clock.
	HWM = "h/"
	// HWMLog holds the HWM delta log (package session): HWMLog + seq u64 BE.
	HWMLog = "hd/"
	// State holds the default state machine's rows (session.State, used by
	// the default Applier): State + session ID (16) + user key.
	State = "s/"
	// KV holds the default state machine's principal key space (package
	// kv, applied by the default Applier): KV + scoped key (kv.Scoped:
	// len(principal) u8, principal, key) → kv.AppendRow's row. Like State
	// it is the default state machine's, not Reserved: a custom Applier
	// replaces that state machine and may use it.
	KV = "k/"
	// Meta holds the store's metadata: position, epoch, format, identity,
	// epoch boundary, last batch, the epoch promised to a fencing leader
	// (package store and follower) and the leader's replication slots
	// (package leader).
	Meta = "m/"
	// Window holds the idempotency window's journal (package replication).
	Window = "w/"
	// Ledger holds the request ledger's table (package idempotency).
	Ledger = "l/"
)

// Keys and row prefixes inside the spaces.
const (
	// HWMRow + session ID (16 bytes): a session's HWM record. Every row key
	// is HWMRowLen bytes long.
	HWMRow    = HWM
	HWMRowLen = len(HWMRow) + 16
	// HWMClock is the tracker's WAL clock. It lies inside HWMRow's prefix but
	// is 7 bytes long where every row is HWMRowLen, so scans tell them apart.
	HWMClock = HWM + "clock"

	// Journal + last LSN (u64 BE): one window journal entry.
	Journal = Window + "j/"

	// MetaPosition: the applied LSN.
	MetaPosition = Meta + "position"
	// MetaEpoch: the highest committed leader epoch.
	MetaEpoch = Meta + "epoch"
	// MetaFormat: the store format; marks an oncewal store.
	MetaFormat = Meta + "format"
	// MetaEpochStart: first LSN of the epoch this store leads (after a
	// promotion).
	MetaEpochStart = Meta + "epoch_start"
	// MetaEpochPrev: the batch ending just before MetaEpochStart.
	MetaEpochPrev = Meta + "epoch_prev"
	// MetaLastBatch: the batch ending at MetaPosition.
	MetaLastBatch = Meta + "last_batch"
	// MetaIdentity: the store's identity (kind, shard, window capacity,
	// retention horizon).
	MetaIdentity = Meta + "identity"
	// MetaSlot + follower ID: a leader's replication slot for that follower.
	MetaSlot = Meta + "slot/"
	// MetaLeader: the epoch at which a leader raised this store's epoch —
	// the mark that a leader (leader.Open, oncewal promote) made it a
	// leader's store (leader-only: a rebuilt store never inherits it).
	MetaLeader = Meta + "leader"
	// MetaPromise: the highest epoch this store promised to a fencing
	// leader (store.Promise): no batch of an older epoch applies once it is
	// written. Replicated, not leader-only: a snapshot that carries it
	// carries a committed epoch at least as high when its donor is a
	// leader, and from another follower it fences only epochs an election
	// already superseded; a rebuild keeps the higher of the store's own
	// and the snapshot's (follower.Rebuild).
	MetaPromise = Meta + "promise"

	// LedgerRow + scope length (u8) + scope + request key: a ledger entry.
	LedgerRow = Ledger + "r/"
	// LedgerIndex + expiry (u64 BE, sign-flipped) + scope length + scope +
	// request key: the ledger's expiry index.
	LedgerIndex = Ledger + "x/"
	// LedgerClock: the ledger's WAL clock.
	LedgerClock = Ledger + "clock"
	// LedgerSweep: WAL-clock time of the ledger's last sweep.
	LedgerSweep = Ledger + "sweep"
	// LedgerProbe: written by idempotency.Ledger.Probe.
	LedgerProbe = Ledger + "probe"
)

// LeaderOnly lists the row families a store holds only while it leads: a
// leader's replication slots, its record of its own followers. They
// describe one leader's epoch: a store that starts a new epoch starts
// without them (replication stages their deletion with the raised epoch),
// and a store rebuilt from a snapshot never inherits them (follower.Rebuild
// deletes them from the staged store). m/epoch_start and m/epoch_prev are
// not in it: they are facts of the history every replica of it shares, and
// a promotion rewrites them. MetaLeader is: a new epoch writes it again in
// the same batch, and a store rebuilt from a leader's snapshot is a
// follower's.
var LeaderOnly = []string{MetaSlot, MetaLeader}

// Reserved lists the spaces oncewal writes whatever the Applier: a custom
// Applier must not write a key that starts with any of them.
var Reserved = []string{HWM, HWMLog, Meta, Window, Ledger}

// Spaces lists every top-level space: Reserved, State and KV.
var Spaces = []string{HWM, HWMLog, State, KV, Meta, Window, Ledger}

// IsReserved reports whether key lies in a space oncewal reserves
// (Reserved).
func IsReserved(key []byte) bool { return inAny(key, Reserved) }

// IsOncewal reports whether key lies in any of oncewal's spaces (Spaces):
// a store with a key outside them is not one oncewal wrote with the default
// Applier.
func IsOncewal(key []byte) bool { return inAny(key, Spaces) }

// OverlapsReserved reports whether the key range [start, end) contains a
// key in a Reserved space.
func OverlapsReserved(start, end []byte) bool {
	for _, p := range Reserved {
		if string(start) < string(UpperBound(p)) && string(end) > p {
			return true
		}
	}
	return false
}

func inAny(key []byte, prefixes []string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(string(key), p) {
			return true
		}
	}
	return false
}

// Entry is one row family or fixed key of the layout.
type Entry struct {
	Key   string // the fixed key, or the family's prefix
	Fixed bool   // a single key, not a prefix
	// Len is the length of every key of a family whose keys all have one
	// length (HWMRow), else 0.
	Len int
}

// Layout lists every row family and fixed key oncewal writes (what the
// overlap test checks; keep it complete when adding a key).
var Layout = []Entry{
	{Key: HWMRow, Len: HWMRowLen},
	{Key: HWMClock, Fixed: true},
	{Key: HWMLog},
	{Key: State},
	{Key: KV},
	{Key: MetaPosition, Fixed: true},
	{Key: MetaEpoch, Fixed: true},
	{Key: MetaFormat, Fixed: true},
	{Key: MetaEpochStart, Fixed: true},
	{Key: MetaEpochPrev, Fixed: true},
	{Key: MetaLastBatch, Fixed: true},
	{Key: MetaIdentity, Fixed: true},
	{Key: MetaSlot},
	{Key: MetaLeader, Fixed: true},
	{Key: MetaPromise, Fixed: true},
	{Key: Journal},
	{Key: LedgerRow},
	{Key: LedgerIndex},
	{Key: LedgerClock, Fixed: true},
	{Key: LedgerSweep, Fixed: true},
	{Key: LedgerProbe, Fixed: true},
}

// UpperBound returns the smallest key above every key that starts with
// prefix (an iterator's exclusive upper bound). prefix must not end in 0xff;
// none of the layout's does.
func UpperBound(prefix string) []byte {
	b := []byte(prefix)
	b[len(b)-1]++
	return b
}
