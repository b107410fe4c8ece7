package keyspace

import (
	"strings"
	"testing"
)

// mayShare reports whether some key can belong to both a and b.
func mayShare(a, b Entry) bool {
	switch {
	case a.Fixed && b.Fixed:
		return a.Key == b.Key
	case a.Fixed:
		return strings.HasPrefix(a.Key, b.Key) && (b.Len == 0 || len(a.Key) == b.Len)
	case b.Fixed:
		return mayShare(b, a)
	}
	if !strings.HasPrefix(a.Key, b.Key) && !strings.HasPrefix(b.Key, a.Key) {
		return false
	}
	// Nested prefixes: two fixed-length families of different lengths
	// still share no key.
	return a.Len == 0 || b.Len == 0 || a.Len == b.Len
}

func TestNoOverlap(t *testing.T) {
	for i, a := range Layout {
		for _, b := range Layout[i+1:] {
			if mayShare(a, b) {
				t.Errorf("%q and %q can name the same key", a.Key, b.Key)
			}
		}
	}
	for i, a := range Spaces {
		for _, b := range Spaces[i+1:] {
			if strings.HasPrefix(a, b) || strings.HasPrefix(b, a) {
				t.Errorf("spaces %q and %q overlap", a, b)
			}
		}
	}
}

func TestEveryEntryInOneSpace(t *testing.T) {
	for _, e := range Layout {
		n := 0
		for _, s := range Spaces {
			if strings.HasPrefix(e.Key, s) {
				n++
			}
		}
		if n != 1 {
			t.Errorf("%q lies in %d spaces, want 1", e.Key, n)
		}
		if e.Fixed && e.Len != 0 {
			t.Errorf("%q: a fixed key has no family length", e.Key)
		}
	}
	for _, r := range Reserved {
		found := false
		for _, s := range Spaces {
			found = found || s == r
		}
		if !found {
			t.Errorf("reserved %q is not a space", r)
		}
	}
}

// TestDefaultStateMachineSpaces: s/ and k/ are oncewal's (a store holding
// them is one it wrote) but not reserved: a custom Applier replaces the
// default state machine and may use them.
func TestDefaultStateMachineSpaces(t *testing.T) {
	for _, k := range []string{"s/x", "k/\x05alicekey"} {
		if IsReserved([]byte(k)) || !IsOncewal([]byte(k)) {
			t.Errorf("%q: reserved %v, oncewal's %v; want false, true", k, IsReserved([]byte(k)), IsOncewal([]byte(k)))
		}
	}
	if !IsReserved([]byte("l/r/x")) || IsOncewal([]byte("x/")) {
		t.Error("IsReserved or IsOncewal misjudges l/r/x or x/: this test would pass vacuously")
	}
}

// TestMayShare checks the overlap rule itself on pairs that do and do not
// collide, so TestNoOverlap cannot pass by a rule that never reports.
func TestMayShare(t *testing.T) {
	for _, c := range []struct {
		a, b Entry
		want bool
	}{
		{Entry{Key: "m/"}, Entry{Key: "m/slot/"}, true},
		{Entry{Key: "m/epoch", Fixed: true}, Entry{Key: "m/epoch", Fixed: true}, true},
		{Entry{Key: "m/epoch", Fixed: true}, Entry{Key: "m/"}, true},
		{Entry{Key: "h/clock", Fixed: true}, Entry{Key: "h/", Len: 7}, true},
		{Entry{Key: "h/clock", Fixed: true}, Entry{Key: "h/", Len: 18}, false},
		{Entry{Key: "h/", Len: 18}, Entry{Key: "h/x", Len: 20}, false},
		{Entry{Key: "l/r/"}, Entry{Key: "l/x/"}, false},
		{Entry{Key: "m/epoch", Fixed: true}, Entry{Key: "m/epoch_start", Fixed: true}, false},
		{Entry{Key: "m/promise", Fixed: true}, Entry{Key: "m/position", Fixed: true}, false},
	} {
		if got := mayShare(c.a, c.b); got != c.want {
			t.Errorf("mayShare(%+v, %+v) = %v, want %v", c.a, c.b, got, c.want)
		}
	}
}

func TestReserved(t *testing.T) {
	for _, k := range []string{"h/clock", "hd/\x00", "m/position", "w/j/1", "l/r/x"} {
		if !IsReserved([]byte(k)) {
			t.Errorf("IsReserved(%q) = false", k)
		}
	}
	for _, k := range []string{"s/x", "acct/1", "h", "", "x/h/"} {
		if IsReserved([]byte(k)) {
			t.Errorf("IsReserved(%q) = true", k)
		}
	}
	for _, c := range []struct {
		start, end string
		want       bool
	}{
		{"a", "b", false},
		{"a", "z", true}, // spans every space
		{"m/slot/", "m/slot0", true},
		{"hd0", "l/", false}, // between hd/ and l/, l/ itself excluded
		{"hd0", "l/\x00", true},
		{"s/", "s0", false},
		{"x", "zz", false},
		{"l0", "zz", true}, // m/ and w/ lie inside
	} {
		if got := OverlapsReserved([]byte(c.start), []byte(c.end)); got != c.want {
			t.Errorf("OverlapsReserved(%q, %q) = %v", c.start, c.end, got)
		}
	}
	if got := string(UpperBound(LedgerRow)); got != "l/r0" {
		t.Errorf("UpperBound(%q) = %q", LedgerRow, got)
	}
}
