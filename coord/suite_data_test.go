package coord

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"sync"
	"testing"
	"time"
)

// watchUntil reads ch until a report satisfies ok, checking invariant 8's
// "consecutive reports differ" on the way, and returns the reports read.
func watchUntil(t *testing.T, ch <-chan map[string][]byte, ok func(map[string][]byte) bool) []map[string][]byte {
	t.Helper()
	timeout := time.After(bound)
	var seen []map[string][]byte
	for {
		select {
		case m, open := <-ch:
			if !open {
				t.Fatalf("watch ended after %v", seen)
			}
			if n := len(seen); n > 0 && equalData(seen[n-1], m) {
				t.Fatalf("report %d repeats the one before: %v", n, m)
			}
			seen = append(seen, m)
			if ok(m) {
				return seen
			}
		case <-timeout:
			t.Fatalf("no such report within %v; seen %v", bound, seen)
		}
	}
}

func is(want map[string]string) func(map[string][]byte) bool {
	return func(m map[string][]byte) bool {
		return maps.EqualFunc(m, want, func(v []byte, w string) bool { return string(v) == w })
	}
}

func set(v string) func([]byte, bool) ([]byte, error) {
	return func([]byte, bool) ([]byte, error) { return []byte(v), nil }
}

func update(t *testing.T, c Coordinator, key string, fn func([]byte, bool) ([]byte, error)) {
	t.Helper()
	if err := c.Update(ctxT(t), "c1", key, fn); err != nil {
		t.Fatalf("update %s: %v", key, err)
	}
}

// testWatch: the first report is the keys as they are; then every write
// under the prefix, by Update or by a leader's Guarded, shows, keys outside
// it never; keys are relative to the data space.
func testWatch(t *testing.T, e engine) {
	a, b := e.open(t, 0)
	ctx := ctxT(t)
	update(t, a, "m/x", set("1"))
	update(t, a, "other", set("o"))
	w, err := b.Watch(ctx, "c1", "m/")
	if err != nil {
		t.Fatal(err)
	}
	watchUntil(t, w, is(map[string]string{"m/x": "1"}))
	update(t, a, "m/y", set("2"))
	watchUntil(t, w, is(map[string]string{"m/x": "1", "m/y": "2"}))
	la, err := a.Campaign(ctx, "c1", nodeA)
	if err != nil {
		t.Fatal(err)
	}
	if err := la.Guarded(ctx, Put("m/x", []byte("by a")), Delete("m/y"), Put("other", []byte("p"))); err != nil {
		t.Fatal(err)
	}
	watchUntil(t, w, is(map[string]string{"m/x": "by a"}))
	update(t, b, "m/x", func([]byte, bool) ([]byte, error) { return nil, nil })
	watchUntil(t, w, is(map[string]string{}))

	// "" follows the whole data space.
	all, err := a.Watch(ctx, "c1", "")
	if err != nil {
		t.Fatal(err)
	}
	watchUntil(t, all, is(map[string]string{"other": "p"}))
}

// testWatchSlowReaderGetsLatest: a reader that does not read while many
// writes land is not handed every step (invariant 8): it reads the latest
// state within fewer reports than there were writes, none repeated.
func testWatchSlowReaderGetsLatest(t *testing.T, e engine) {
	a, b := e.open(t, 0)
	ctx := ctxT(t)
	w, err := b.Watch(ctx, "c1", "")
	if err != nil {
		t.Fatal(err)
	}
	watchUntil(t, w, is(map[string]string{}))
	const steps = 20
	for i := 1; i <= steps; i++ {
		update(t, a, "n", set(strconv.Itoa(i)))
	}
	seen := watchUntil(t, w, is(map[string]string{"n": strconv.Itoa(steps)}))
	if len(seen) >= steps {
		t.Fatalf("a reader that read after %d writes got every step: %d reports", steps, len(seen))
	}
	// Writing the value it already has is no change to report: the next
	// report is the next real change.
	update(t, a, "n", set(strconv.Itoa(steps)))
	update(t, a, "n", set("last"))
	if got := watchUntil(t, w, func(map[string][]byte) bool { return true }); !is(map[string]string{"n": "last"})(got[0]) {
		t.Fatalf("after an unchanged write then a change, reported %v", got[0])
	}
}

// testWatchEnds: a watch's channel closes when its context ends, and when
// the coordinator closes.
func testWatchEnds(t *testing.T, e engine) {
	a, _ := e.open(t, 0)
	wctx, cancel := context.WithCancel(ctxT(t))
	w, err := a.Watch(wctx, "c1", "")
	if err != nil {
		t.Fatal(err)
	}
	watchUntil(t, w, is(map[string]string{}))
	cancel()
	drainClosed(t, w)
	w, err = a.Watch(ctxT(t), "c1", "")
	if err != nil {
		t.Fatal(err)
	}
	watchUntil(t, w, is(map[string]string{}))
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	drainClosed(t, w)
}

func drainClosed(t *testing.T, w <-chan map[string][]byte) {
	t.Helper()
	timeout := time.After(bound)
	for {
		select {
		case _, open := <-w:
			if !open {
				return
			}
		case <-timeout:
			t.Fatalf("watch still open %v after its end", bound)
		}
	}
}

func incr(calls *int) func([]byte, bool) ([]byte, error) {
	return func(old []byte, ok bool) ([]byte, error) {
		*calls++
		n := 0
		if ok {
			var err error
			if n, err = strconv.Atoi(string(old)); err != nil {
				return nil, err
			}
		}
		return []byte(strconv.Itoa(n + 1)), nil
	}
}

// testUpdateConflictRetries: a write that lands between Update's read and
// its write makes it run fn again on the new value, whoever wrote: another
// Update, or a leader's Guarded (invariant 9). Concurrent counters add up.
func testUpdateConflictRetries(t *testing.T, e engine) {
	a, b := e.open(t, 0)
	ctx := ctxT(t)
	calls := 0
	err := a.Update(ctx, "c1", "n", func(old []byte, ok bool) ([]byte, error) {
		calls++
		if calls == 1 {
			if ok {
				t.Errorf("first read of an absent key: %q, ok", old)
			}
			update(t, b, "n", set("10")) // lands between the read and the write
		}
		return incr(new(int))(old, ok)
	})
	if err != nil {
		t.Fatal(err)
	}
	if v, _, err := b.Get(ctx, "c1", "n"); err != nil || string(v) != "11" || calls != 2 {
		t.Fatalf("n = %q (%v) after %d calls; want 11 after 2: the conflicting write was lost or not retried", v, err, calls)
	}

	la, err := b.Campaign(ctx, "c1", nodeB)
	if err != nil {
		t.Fatal(err)
	}
	calls = 0
	err = a.Update(ctx, "c1", "n", func(old []byte, ok bool) ([]byte, error) {
		calls++
		if calls == 1 {
			if err := la.Guarded(ctx, Put("n", []byte("20"))); err != nil {
				t.Errorf("guarded write: %v", err)
			}
		}
		return incr(new(int))(old, ok)
	})
	if err != nil {
		t.Fatal(err)
	}
	if v, _, err := a.Get(ctx, "c1", "n"); err != nil || string(v) != "21" || calls != 2 {
		t.Fatalf("n = %q (%v) after %d calls; want 21 after 2: a guarded write between read and write was lost", v, err, calls)
	}

	const each = 15
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for _, c := range []Coordinator{a, b} {
		wg.Go(func() {
			n := 0
			for range each {
				if err := c.Update(ctx, "c1", "count", incr(&n)); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if v, _, err := a.Get(ctx, "c1", "count"); err != nil || string(v) != strconv.Itoa(2*each) {
		t.Fatalf("count = %q (%v) after %d increments from each of two coordinators, want %d", v, err, each, 2*each)
	}
}

var errRefused = errors.New("refused by the test's fn")

// testUpdateDeleteErrorsAndBadInput: nil deletes; an fn error aborts with
// nothing written and comes back errors.Is-able; bad input and a closed
// coordinator are refused before fn runs.
func testUpdateDeleteErrorsAndBadInput(t *testing.T, e engine) {
	a, _ := e.open(t, 0)
	ctx := ctxT(t)
	update(t, a, "k", set("v"))
	err := a.Update(ctx, "c1", "k", func(old []byte, ok bool) ([]byte, error) {
		return []byte("not written"), fmt.Errorf("k was %q: %w", old, errRefused)
	})
	if !errors.Is(err, errRefused) {
		t.Fatalf("update whose fn failed: %v, want the fn's error", err)
	}
	if v, ok, _ := a.Get(ctx, "c1", "k"); !ok || string(v) != "v" {
		t.Fatalf("k = %q, %v after a failed update; want it unchanged", v, ok)
	}
	update(t, a, "k", func(old []byte, ok bool) ([]byte, error) { return nil, nil })
	if v, ok, err := a.Get(ctx, "c1", "k"); ok || err != nil {
		t.Fatalf("k = %q, %v, %v after an update to nil; want it deleted", v, ok, err)
	}
	update(t, a, "k", func(old []byte, ok bool) ([]byte, error) {
		if ok {
			t.Errorf("deleted key read as %q", old)
		}
		return nil, nil // deleting an absent key is no error
	})
	update(t, a, "empty", set(""))
	if _, ok, _ := a.Get(ctx, "c1", "empty"); !ok {
		t.Fatal("an empty, non-nil value deleted its key; only nil deletes")
	}

	ran := false
	fn := func([]byte, bool) ([]byte, error) { ran = true; return nil, nil }
	for _, bad := range []func() error{
		func() error { return a.Update(ctx, "", "k", fn) },
		func() error { return a.Update(ctx, "x/y", "k", fn) },
		func() error { return a.Update(ctx, "c1", "", fn) },
		func() error { return a.Update(ctx, "c1", "k", nil) },
		func() error { _, err := a.Watch(ctx, "", ""); return err },
	} {
		if err := bad(); !errors.Is(err, ErrBadInput) {
			t.Errorf("got %v, want ErrBadInput", err)
		}
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if err := a.Update(ctx, "c1", "k", fn); !errors.Is(err, ErrClosed) {
		t.Errorf("update after Close: %v, want ErrClosed", err)
	}
	if _, err := a.Watch(ctx, "c1", ""); !errors.Is(err, ErrClosed) {
		t.Errorf("watch after Close: %v, want ErrClosed", err)
	}
	if ran {
		t.Error("fn ran for a refused update")
	}
}
