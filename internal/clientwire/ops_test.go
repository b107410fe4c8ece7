package clientwire

import (
	"bytes"
	"errors"
	"reflect"
	"testing"

	"github.com/oncewal/oncewal/wal"
)

func TestOpsRoundTrip(t *testing.T) {
	ops := []Op{
		{Kind: OpPut, Key: []byte("k"), Value: []byte("v")},
		{Kind: OpAdd, Key: []byte("counter"), Delta: -30},
		{Kind: OpDelete, Key: []byte("gone")},
		{Kind: OpPut, Key: []byte("empty value")},
	}
	b := AppendOps(nil, ops)
	got, err := DecodeOps(b)
	if err != nil || !reflect.DeepEqual(got, ops) {
		t.Fatalf("DecodeOps = %+v, %v; want %+v", got, err, ops)
	}
	for n := range len(b) {
		if _, err := DecodeOps(b[:n]); !errors.Is(err, ErrMalformed) {
			t.Errorf("cut to %d of %d bytes: %v", n, len(b), err)
		}
	}
	if OpKind(wal.OpPut) != OpPut || OpKind(wal.OpDelete) != OpDelete || OpKind(wal.OpAdd) != OpAdd {
		t.Error("op kinds differ from package wal's")
	}
}

func TestOpsRefused(t *testing.T) {
	for name, b := range map[string][]byte{
		"no ops":         AppendOps(nil, nil),
		"empty key":      AppendOps(nil, []Op{{Kind: OpDelete}}),
		"unknown kind":   AppendOps(nil, []Op{{Kind: 9, Key: []byte("k")}}),
		"open":           AppendOps(nil, []Op{{Kind: OpKind(wal.OpOpen), Key: []byte("k")}}),
		"trailing":       append(AppendOps(nil, []Op{{Kind: OpDelete, Key: []byte("k")}}), 0),
		"another frame":  (&StatusRequest{RequestID: "x"}).Marshal(),
		"too many":       append([]byte{Version, typeOps}, 0x81, 0x40),
		"long delta enc": append(AppendOps(nil, []Op{{Kind: OpAdd, Key: []byte("k")}})[:6], 0x80, 0x00),
	} {
		if _, err := DecodeOps(b); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func FuzzDecodeOps(f *testing.F) {
	f.Add(AppendOps(nil, []Op{{Kind: OpPut, Key: []byte("k"), Value: []byte("v")}, {Kind: OpAdd, Key: []byte("c"), Delta: 1}}))
	f.Fuzz(func(t *testing.T, b []byte) {
		ops, err := DecodeOps(b)
		if err == nil && !bytes.Equal(AppendOps(nil, ops), b) {
			t.Fatalf("%x decodes but re-encodes differently", b)
		}
	})
}
