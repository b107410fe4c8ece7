package coord

import (
	"testing"
	"time"
)

// TestTermDoneAtDeadline: a term not renewed ends when its deadline
// passes, not before; a renewal moves the deadline forward only; after
// the end no renewal reopens it or moves the deadline (invariant 7).
func TestTermDoneAtDeadline(t *testing.T) {
	start := time.Now()
	tm := newTerm(start.Add(20 * time.Millisecond))
	tm.extend(start.Add(10 * time.Millisecond)) // earlier: ignored
	if got := tm.Deadline(); !got.Equal(start.Add(20 * time.Millisecond)) {
		t.Fatalf("an earlier renewal moved the deadline to %v after the start", got.Sub(start))
	}
	tm.extend(start.Add(60 * time.Millisecond))
	select {
	case <-tm.Done():
	case <-time.After(bound):
		t.Fatalf("Done open %v after its deadline", bound)
	}
	if now := time.Now(); now.Before(start.Add(60 * time.Millisecond)) {
		t.Fatalf("Done closed %v before the renewed deadline", start.Add(60*time.Millisecond).Sub(now))
	}
	d := tm.Deadline()
	tm.extend(time.Now().Add(time.Hour))
	if !tm.Deadline().Equal(d) {
		t.Fatal("a renewal after the end moved the deadline")
	}
}

// TestTermEndPullsDeadlineBack: a term ended early (lease gone, resign)
// has its deadline no later than the end.
func TestTermEndPullsDeadlineBack(t *testing.T) {
	tm := newTerm(time.Now().Add(time.Hour))
	tm.end()
	ended := time.Now()
	select {
	case <-tm.Done():
	default:
		t.Fatal("Done open after end")
	}
	if d := tm.Deadline(); d.After(ended) {
		t.Fatalf("deadline %v after the end", d.Sub(ended))
	}
	tm.end() // twice is harmless
}

// TestTermBornPast: a term whose deadline is already past when it is made
// (a renewal answered after its deadline) ends at once, and its timer, which
// fires at once, finds itself set (a race the race detector caught in a
// node test).
func TestTermBornPast(t *testing.T) {
	for range 100 {
		tm := newTerm(time.Now().Add(-time.Millisecond))
		<-tm.Done()
		if tm.Deadline().After(time.Now()) {
			t.Fatal("an ended term's deadline is ahead")
		}
	}
}
