package idempotency

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"math/rand/v2"
	"testing"

	"lukechampine.com/blake3"

	"github.com/oncewal/oncewal/session"
)

// referenceVectors are the first 32 bytes of "hash" from the official BLAKE3
// test_vectors.json (github.com/BLAKE3-team/BLAKE3, test_vectors/; the same
// file ships as testdata/vectors.json in lukechampine.com/blake3). Input i is
// i%251 for i in [0, input_len).
var referenceVectors = []struct {
	n    int
	hash string
}{
	{0, "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"},
	{1, "2d3adedff11b61f14c886e35afa036736dcd87a74d27b5c1510225d0f592e213"},
	{1023, "10108970eeda3eb932baac1428c7a2163b0e924c9a9e25b35bba72b28f70bd11"},
	{1024, "42214739f095a406f3fc83deb889744ac00df831c10daa55189b5d121c855af7"},
	{1025, "d00278ae47eb27b34faecf67b4fe263f82d5412916c1ffd97c8cb7fb814b8444"},
	{2048, "e776b6028c7cd22a4d0ba182a8bf62205d2ef576467e838ed6f2529b85fba24a"},
	{2049, "5f4d72f40d7a5f82b15ca2b2e44b1de3c2ef86c426c95c1af0b6879522563030"},
	{3072, "b98cb0ff3623be03326b373de6b9095218513e64f1ee2edd2525c7ad1e5cffd2"},
	{3073, "7124b49501012f81cc7f11ca069ec9226cecb8a2c850cfe644e327d22d3e1cd3"},
	{4096, "015094013f57a5277b59d8475c0501042c0b642e531b0a1c8f58d2163229e969"},
	{4097, "9b4052b38f1c5fc8b1f9ff7ac7b27cd242487b3d890d15c96a1c25b8aa0fb995"},
	{5120, "9cadc15fed8b5d854562b26a9536d9707cadeda9b143978f319ab34230535833"},
	{5121, "628bd2cb2004694adaab7bbd778a25df25c47b9d4155a55f8fbd79f2fe154cff"},
	{6144, "3e2e5b74e048f3add6d21faab3f83aa44d3b2278afb83b80b3c35164ebeca205"},
	{6145, "f1323a8631446cc50536a9f705ee5cb619424d46887f3c376c695b70e0f0507f"},
	{7168, "61da957ec2499a95d6b8023e2b0e604ec7f6b50e80a9678b89d2628e99ada77a"},
	{7169, "a003fc7a51754a9b3c7fae0367ab3d782dccf28855a03d435f8cfe74605e7817"},
	{8192, "aae792484c8efe4f19e2ca7d371d8c467ffb10748d8a5a1ae579948f718a2a63"},
	{8193, "bab6c09cb8ce8cf459261398d2e7aef35700bf488116ceb94a36d0f5f1b7bc3b"},
	{16384, "f875d6646de28985646f34ee13be9a576fd515f76b5b0a26bb324735041ddde4"},
	{31744, "62b6960e1a44bcc1eb1a611a8d6235b6b4b78f32e7abc4fb4c6cdcce94895c47"},
	{100000, "d93c23eedaf165a7e0be908ba86f1a7a520d568d2d13cde787c8580c5c72cc54"},
}

func vectorInput(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i % 251)
	}
	return b
}

func wordsHex(w [8]uint32) string {
	var b [32]byte
	for i, x := range w {
		binary.LittleEndian.PutUint32(b[4*i:], x)
	}
	return hex.EncodeToString(b[:])
}

// TestSumReferenceVectors checks the hashing core against the official
// vectors for every way of splitting the message into head and op, which
// covers single blocks, chunk boundaries and multi-level trees.
func TestSumReferenceVectors(t *testing.T) {
	for _, v := range referenceVectors {
		in := vectorInput(v.n)
		for _, hl := range []int{0, 1, 23, 24, 25, 63, 64} {
			if hl > v.n {
				continue
			}
			if got := wordsHex(sum(in[:hl], in[hl:])); got != v.hash {
				t.Fatalf("len %d head %d: got %s want %s", v.n, hl, got, v.hash)
			}
		}
	}
}

// TestDeriveKeyReferenceVector: a DeriveKey message is id ‖ seq ‖ op, so an
// id of bytes 0..15, seq = LE bytes 16..23 and op = bytes 24.. of the vector
// input reproduce a reference vector exactly.
func TestDeriveKeyReferenceVector(t *testing.T) {
	for _, v := range referenceVectors {
		if v.n < prefixLen {
			continue
		}
		in := vectorInput(v.n)
		var id session.ID
		copy(id[:], in[:16])
		seq := session.SeqNo(binary.LittleEndian.Uint64(in[16:24]))
		k := DeriveKey(id, seq, in[24:])
		if want := v.hash[:32]; k.String() != want {
			t.Fatalf("len %d: DeriveKey %s, want %s", v.n, k, want)
		}
	}
}

// TestDeriveKeyMatchesBlake3 cross-checks random messages against the
// library's Sum256 over the contiguous message.
func TestDeriveKeyMatchesBlake3(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	msg := make([]byte, 0, 9000)
	for i := 0; i < 600; i++ {
		n := r.IntN(300)
		switch i % 4 {
		case 1:
			n = r.IntN(2100)
		case 2:
			n = 1000 + r.IntN(48) // around the one-chunk boundary (1024-24)
		case 3:
			n = r.IntN(9000)
		}
		var id session.ID
		for j := range id {
			id[j] = byte(r.Uint32())
		}
		seq := session.SeqNo(r.Uint64())
		op := make([]byte, n)
		for j := range op {
			op[j] = byte(r.Uint32())
		}
		msg = append(msg[:0], id[:]...)
		msg = binary.LittleEndian.AppendUint64(msg, uint64(seq))
		msg = append(msg, op...)
		want := blake3.Sum256(msg)
		got := DeriveKey(id, seq, op)
		if !bytes.Equal(got[:], want[:16]) {
			t.Fatalf("op len %d: got %x want %x", n, got, want[:16])
		}
	}
}

// Golden values pin the key format: changing them breaks every stored
// window snapshot and every follower comparing keys with a leader.
func TestDeriveKeyGolden(t *testing.T) {
	id := session.ID{0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff}
	cases := []struct {
		seq  session.SeqNo
		op   []byte
		want string
	}{
		{1, nil, "a4ff9948a5d88fca888ede558f968f4c"},
		{1, []byte("put"), "3fb358eb9223694ae92f958957355f62"},
		{2, []byte("put"), "ba08b54cc457e7836b7c680109f07367"},
		{1 << 40, bytes.Repeat([]byte{0xab}, 64), "05641d0d2e4c5602db9ceb4cc1c563de"},
		{7, vectorInput(5000), "aab9c32d20eed8fc7e375ba82291bc84"},
	}
	for _, c := range cases {
		got := DeriveKey(id, c.seq, c.op).String()
		msg := binary.LittleEndian.AppendUint64(append([]byte(nil), id[:]...), uint64(c.seq))
		ref := blake3.Sum256(append(msg, c.op...))
		if hex.EncodeToString(ref[:16]) != c.want {
			t.Errorf("golden %s disagrees with blake3.Sum256 %x", c.want, ref[:16])
		}
		if got != c.want {
			t.Errorf("DeriveKey(seq %d, op len %d) = %s, want %s", c.seq, len(c.op), got, c.want)
		}
	}
}

func TestDeriveKeyDistinguishesInputs(t *testing.T) {
	var id session.ID
	base := DeriveKey(id, 1, []byte("x"))
	if DeriveKey(id, 1, []byte("x")) != base {
		t.Fatal("not deterministic")
	}
	id2 := id
	id2[15] = 1
	for _, k := range []Key{DeriveKey(id2, 1, []byte("x")), DeriveKey(id, 2, []byte("x")), DeriveKey(id, 1, []byte("y")), DeriveKey(id, 1, nil)} {
		if k == base {
			t.Fatal("different inputs gave the same key")
		}
	}
}

func TestDeriveKeyAllocs(t *testing.T) {
	var id session.ID
	for _, n := range []int{0, 64, 1000, 4096} {
		op := make([]byte, n)
		if a := testing.AllocsPerRun(50, func() { _ = DeriveKey(id, 9, op) }); a != 0 {
			t.Errorf("op %d B: %v allocs", n, a)
		}
	}
	// A caller's stack buffer must not be forced to the heap.
	if a := testing.AllocsPerRun(50, func() {
		var buf [48]byte
		buf[3] = 1
		_ = DeriveKey(id, 9, buf[:])
	}); a != 0 {
		t.Errorf("stack op: %v allocs", a)
	}
}

func TestKeyStringParse(t *testing.T) {
	k := DeriveKey(session.ID{1}, 1, nil)
	s := k.String()
	if len(s) != 32 {
		t.Fatalf("len %d", len(s))
	}
	got, err := ParseKey(s)
	if err != nil || got != k {
		t.Fatalf("round trip: %v %v", got, err)
	}
	up := []byte(s)
	for i := range up {
		if up[i] >= 'a' {
			up[i] -= 'a' - 'A'
		}
	}
	if got, err := ParseKey(string(up)); err != nil || got != k {
		t.Fatalf("upper case: %v %v", got, err)
	}
	for _, bad := range []string{"", "00", s[:31], s + "0", "zz" + s[2:], " " + s[1:]} {
		if got, err := ParseKey(bad); !errors.Is(err, ErrBadKey) || got != (Key{}) {
			t.Errorf("ParseKey(%q) = %v, %v", bad, got, err)
		}
	}
}
