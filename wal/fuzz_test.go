package wal

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func fuzzSeedBatches(t testing.TB) [][]byte {
	var seeds [][]byte
	add := func(evs []Event, first uint64) {
		b, err := AppendBatch(nil, 3, 7, first, evs)
		require.NoError(t, err)
		seeds = append(seeds, b)
	}
	add(goldenEvents(), 4096)
	add(allCombos()[:40], 1)
	for _, e := range allCombos() {
		if len(e.Key) < 10 && len(e.Value) < 10 {
			add([]Event{e}, 1)
		}
	}
	add(testEvents(20, 1), 1<<40)
	add(goldenLedgerEvents(), 4096)
	add(goldenKVEvents(), 4096)
	for _, e := range ledgerEvents() {
		add([]Event{e}, 1)
	}
	return seeds
}

// FuzzDecodeBatch: decoding arbitrary bytes never panics, fails only with a
// wal sentinel, and whatever decodes re-encodes to exactly the same bytes
// (the encoding is canonical, so nothing unchecked can hide in a batch).
func FuzzDecodeBatch(f *testing.F) {
	for _, s := range fuzzSeedBatches(f) {
		f.Add(s)
	}
	f.Add([]byte{})
	f.Add(bytes.Repeat([]byte{0xff}, HeaderSize+30))
	var evs []Event
	f.Fuzz(func(t *testing.T, b []byte) {
		h, out, err := DecodeBatch(b, evs)
		evs = out[:0]
		if err != nil {
			requireTyped(t, err)
			return
		}
		require.Equal(t, int(h.Count), len(out))
		re, err := AppendBatch(nil, h.Shard, h.Epoch, h.FirstLSN, out)
		require.NoError(t, err)
		require.Equal(t, b, re)
	})
}

func segmentSeed(t testing.TB, batches int) []byte {
	var seg []byte
	lsn := uint64(1)
	for i := 0; i < batches; i++ {
		evs := testEvents(1+i%4, i)
		var err error
		seg, err = AppendBatch(seg, 0, 1, lsn, evs)
		require.NoError(t, err)
		lsn += uint64(len(evs))
	}
	return seg
}

// FuzzReadSegment: a segment file with arbitrary contents never makes the
// Reader or the Writer's recovery panic; both fail only with typed errors;
// when recovery succeeds, the recovered log reads back completely and
// accepts appends.
func FuzzReadSegment(f *testing.F) {
	full := segmentSeed(f, 4)
	f.Add(full)
	f.Add(full[:len(full)-5])
	f.Add(full[:HeaderSize-1])
	f.Add(append(bytes.Clone(full), make([]byte, 700)...))
	f.Add(append(bytes.Clone(full), 1, 2, 3))
	f.Add([]byte{})
	flip := bytes.Clone(full)
	flip[len(flip)-3] ^= 4
	f.Add(flip)
	f.Fuzz(func(t *testing.T, seg []byte) {
		dir := t.TempDir()
		name := SegmentName(0, 1)
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), seg, 0o644))

		r, err := OpenReader(dir, 0)
		readerOK, next := true, uint64(1)
		if err != nil {
			requireTyped(t, err)
			readerOK = false
		}
		for readerOK {
			h, raw, err := r.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				requireTyped(t, err)
				readerOK = false
				break
			}
			require.Equal(t, next, h.FirstLSN)
			require.Equal(t, h.Size(), len(raw))
			next = h.LastLSN() + 1
		}
		if r != nil {
			require.NoError(t, r.Close())
		}

		w, err := OpenWriter(dir, &WriterOptions{Sync: SyncManual}) // fsyncs would dominate
		if err != nil {
			requireTyped(t, err)
			return
		}
		defer w.Close()
		if readerOK {
			// A clean read to EOF ends where recovery does.
			require.Equal(t, next, w.NextLSN())
		}
		want := w.NextLSN()
		_, err = w.Append(1, testEvents(2, 5))
		require.NoError(t, err)
		r, err = OpenReader(dir, 0)
		require.NoError(t, err)
		defer r.Close()
		lsn := uint64(1)
		for {
			h, _, err := r.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			require.NoError(t, err)
			require.Equal(t, lsn, h.FirstLSN)
			lsn = h.LastLSN() + 1
		}
		require.Equal(t, want+2, lsn)
	})
}
