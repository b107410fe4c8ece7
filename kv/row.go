package kv

import (
	"encoding/binary"
	"fmt"
)

// Row is a key's stored state: its value, its version (1 when created, +1
// with every put; a delete removes the row, so a key put again starts at 1)
// and the LSN of the event that wrote it last.
type Row struct {
	Value   []byte
	Version uint64
	ModLSN  uint64
}

const (
	rowFormat    = 1
	rowHeaderLen = 1 + 8 + 8
)

// AppendRow appends r's stored bytes to dst: format byte 1, version u64 LE,
// modLSN u64 LE, value.
func AppendRow(dst []byte, r Row) []byte {
	dst = append(dst, rowFormat)
	dst = binary.LittleEndian.AppendUint64(dst, r.Version)
	dst = binary.LittleEndian.AppendUint64(dst, r.ModLSN)
	return append(dst, r.Value...)
}

// DecodeRow decodes a row's stored bytes; Value aliases b. Bytes that are
// not a row AppendRow makes for a written key — another format, too short,
// version or modLSN 0 — are ErrCorrupt.
func DecodeRow(b []byte) (Row, error) {
	if len(b) < rowHeaderLen || b[0] != rowFormat {
		return Row{}, fmt.Errorf("%w: %d bytes, want format %d and at least %d", ErrCorrupt, len(b), rowFormat, rowHeaderLen)
	}
	r := Row{
		Version: binary.LittleEndian.Uint64(b[1:]),
		ModLSN:  binary.LittleEndian.Uint64(b[9:]),
		Value:   b[rowHeaderLen:],
	}
	if r.Version == 0 || r.ModLSN == 0 {
		return Row{}, fmt.Errorf("%w: version %d, modLSN %d: a written row has both ≥ 1", ErrCorrupt, r.Version, r.ModLSN)
	}
	return r, nil
}
