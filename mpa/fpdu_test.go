package mpa

import (
	"bytes"
	"encoding/hex"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/softrnic/softrnic/ddp"
)

func unhex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.Join(strings.Fields(s), ""))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// RFC 3720 §B.4: the iSCSI CRC32c examples, with the CRC bytes as printed
// there, which is the wire order.
func TestCRC32cRFC3720Vectors(t *testing.T) {
	inc, dec := make([]byte, 32), make([]byte, 32)
	for i := range inc {
		inc[i] = byte(i)
		dec[i] = byte(31 - i)
	}
	read10 := make([]byte, 48)
	for off, v := range map[int]byte{0: 0x01, 1: 0xc0, 16: 0x14, 22: 0x04, 27: 0x14, 31: 0x18, 32: 0x28, 40: 0x02} {
		read10[off] = v
	}
	cases := []struct {
		name string
		in   []byte
		wire string
	}{
		{"32 zeros", make([]byte, 32), "aa 36 91 8a"},
		{"32 ones", bytes.Repeat([]byte{0xff}, 32), "43 ab a8 62"},
		{"incrementing", inc, "4e 79 dd 46"},
		{"decrementing", dec, "5c db 3f 11"},
		{"SCSI Read (10) PDU", read10, "56 3a 96 d9"},
	}
	for _, c := range cases {
		got := make([]byte, 4)
		PutCRC(got, CRC32c(c.in))
		if want := unhex(t, c.wire); !bytes.Equal(got, want) {
			t.Errorf("%s: %x, want %x", c.name, got, want)
		}
		if WireCRC(unhex(t, c.wire)) != CRC32c(c.in) {
			t.Errorf("%s: WireCRC does not invert PutCRC", c.name)
		}
	}
}

func sendULPDU(msn uint32, data int) []byte {
	b := make([]byte, ddp.UntaggedHeaderLen+data)
	ddp.Untagged(b).Encode(&ddp.UntaggedFields{Last: true, Opcode: ddp.OpSend, MSN: ddp.MSN(msn)})
	return b
}

// RFC 5044 Figure 5: the first FPDU of a stream with markers and CRC, a Send
// of 24 zero octets. The marker at octet 0 has FPDUPTR 0 and is in the CRC.
var rfc5044Figure5 = `
	00 00 00 00  00 2a  41 43  00 00 00 00  00 00 00 00  00 00 00 01  00 00 00 00
	000000000000000000000000000000000000000000000000
	52 23 99 83`

// RFC 5044 Figure 6: the second FPDU of a stream whose first FPDU was 492
// octets, so a marker (FPDUPTR 0x14) falls inside its DDP payload.
var rfc5044Figure6 = `
	00 2a  41 43  00 00 00 00  00 00 00 00  00 00 00 02  00 00 00 00
	00 00 00 14
	000000000000000000000000000000000000000000000000
	84 92 58 98`

func TestRFC5044Figures(t *testing.T) {
	fig5, fig6 := unhex(t, rfc5044Figure5), unhex(t, rfc5044Figure6)

	f := NewFramer(true, true)
	got := f.Append(nil, sendULPDU(1, 0), make([]byte, 24))
	if !bytes.Equal(got, fig5) {
		t.Fatalf("Figure 5:\n got %x\nwant %x", got, fig5)
	}

	// A first FPDU of 492 octets: marker, length, 482-octet ULPDU, CRC.
	f = NewFramer(true, true)
	first := f.Append(nil, sendULPDU(1, 482-ddp.UntaggedHeaderLen), nil)
	if len(first) != 492 || f.Pos() != 0x1ec {
		t.Fatalf("first FPDU %d octets, position %#x", len(first), f.Pos())
	}
	if f.WireLen(42) != len(fig6) {
		t.Errorf("WireLen(42) = %d, want %d", f.WireLen(42), len(fig6))
	}
	second := f.Append(nil, sendULPDU(2, 0), make([]byte, 24))
	if !bytes.Equal(second, fig6) {
		t.Fatalf("Figure 6:\n got %x\nwant %x", second, fig6)
	}

	// Both parse back, whole and a byte at a time.
	stream := append(first, second...)
	for _, chunk := range []int{len(stream), 1, 3, 7} {
		a := NewAssembler(true, true)
		var out [][]byte
		var err error
		for b := stream; len(b) > 0; {
			k := min(chunk, len(b))
			if out, err = a.Feed(b[:k], out); err != nil {
				t.Fatalf("chunk %d: %v", chunk, err)
			}
			b = b[k:]
		}
		if len(out) != 2 || !bytes.Equal(out[1], append(sendULPDU(2, 0), make([]byte, 24)...)) {
			t.Fatalf("chunk %d: parsed %d ULPDUs", chunk, len(out))
		}
	}
}

func TestPadAndSizes(t *testing.T) {
	for n, want := range map[int]int{0: 2, 1: 1, 2: 0, 3: 3, 42: 0, 43: 3} {
		if PadLen(n) != want {
			t.Errorf("PadLen(%d) = %d, want %d", n, PadLen(n), want)
		}
		if FPDULen(n)%4 != 0 {
			t.Errorf("FPDULen(%d) = %d not a multiple of 4", n, FPDULen(n))
		}
	}
	cases := []struct {
		emss    int
		markers bool
		want    int
	}{
		{1460, false, 1454}, {1460, true, 1442}, {1448, false, 1442}, {1448, true, 1430},
		{3446, false, 3438}, {8948, false, 8942}, {100, false, MinMULPDU},
	}
	for _, c := range cases {
		if got := MULPDU(c.emss, c.markers); got != c.want {
			t.Errorf("MULPDU(%d, markers %v) = %d, want %d", c.emss, c.markers, got, c.want)
		}
	}
	// With markers, an FPDU of MULPDU octets fits the EMSS wherever the
	// stream stands.
	for _, emss := range []int{536, 1448, 1460, 3446, 8948} {
		m := MULPDU(emss, true)
		for pos := uint32(0); pos < MarkerInterval; pos += 4 {
			f := Framer{crc: true, markers: true, pos: pos}
			if l := f.WireLen(m); l > emss {
				t.Fatalf("emss %d pos %d: FPDU of MULPDU %d takes %d", emss, pos, m, l)
			}
		}
	}
}

// stream frames ULPDUs of the given sizes and returns the stream and them.
func stream(rng *rand.Rand, crc, markers bool, sizes []int) ([]byte, [][]byte) {
	f := NewFramer(crc, markers)
	var out []byte
	var ulpdus [][]byte
	for _, n := range sizes {
		u := make([]byte, n)
		for i := range u {
			u[i] = byte(rng.Uint32())
		}
		split := rng.IntN(n + 1)
		before := len(out)
		out = f.Append(out, u[:split], u[split:])
		if got := len(out) - before; markers && got < FPDULen(n) || !markers && got != FPDULen(n) {
			panic("FPDU length")
		}
		ulpdus = append(ulpdus, u)
	}
	return out, ulpdus
}

func feedChunks(rng *rand.Rand, a *Assembler, s []byte, maxChunk int) ([][]byte, error) {
	var out [][]byte
	var err error
	for len(s) > 0 {
		k := min(len(s), 1+rng.IntN(maxChunk))
		if out, err = a.Feed(s[:k], out); err != nil {
			return out, err
		}
		s = s[k:]
	}
	return out, nil
}

func TestRoundTripAnyChunking(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, crc := range []bool{false, true} {
		for _, markers := range []bool{false, true} {
			for iter := 0; iter < 40; iter++ {
				sizes := make([]int, 1+rng.IntN(30))
				for i := range sizes {
					switch rng.IntN(4) {
					case 0:
						sizes[i] = rng.IntN(20)
					case 1:
						sizes[i] = 500 + rng.IntN(30) // straddles markers
					default:
						sizes[i] = rng.IntN(4000)
					}
				}
				s, want := stream(rng, crc, markers, sizes)
				for _, maxChunk := range []int{1, 5, 600, len(s)} {
					got, err := feedChunks(rng, NewAssembler(crc, markers), s, maxChunk)
					if err != nil {
						t.Fatalf("crc %v markers %v chunk %d: %v", crc, markers, maxChunk, err)
					}
					if len(got) != len(want) {
						t.Fatalf("crc %v markers %v: %d ULPDUs, want %d", crc, markers, len(got), len(want))
					}
					for i := range want {
						if !bytes.Equal(got[i], want[i]) {
							t.Fatalf("crc %v markers %v chunk %d: ULPDU %d differs", crc, markers, maxChunk, i)
						}
					}
				}
			}
		}
	}
}

// The parser hands out payload as sub-slices of its input, never a copy.
func TestParserDataAliasesInput(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	s, _ := stream(rng, true, true, []int{2000})
	p := NewParser(true, true)
	for b := s; len(b) > 0; {
		n, ev, err := p.Next(b)
		if err != nil {
			t.Fatal(err)
		}
		if len(ev.Data) > 0 && &ev.Data[0] != &b[n-len(ev.Data)] && &ev.Data[0] != &b[n-len(ev.Data)-CRCLen-PadLen(ev.ULPDULen)] {
			t.Fatal("data event is not a view of the input")
		}
		b = b[n:]
	}
}

func TestCRCErrors(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for _, markers := range []bool{false, true} {
		s, _ := stream(rng, true, markers, []int{100, 1200, 7})
		// Octets of payload, pad, CRC and (with markers) a marker; a
		// flipped length octet would only make the parser wait for more.
		for _, off := range []int{6, 30, 110, 515, 700, len(s) - 1} {
			bad := bytes.Clone(s)
			bad[off] ^= 0x10
			_, err := feedChunks(rng, NewAssembler(true, markers), bad, 64)
			var se *StreamError
			if !errors.As(err, &se) {
				t.Fatalf("markers %v: flip at %d: error %v", markers, off, err)
			}
			// A marker disagreement is reported only with a good CRC.
			if !errors.Is(err, ddp.LLPCRC) {
				t.Errorf("markers %v: flip at %d: %v, want CRC error", markers, off, err)
			}
		}
	}
	// Without CRC, the same flip in payload goes through.
	s, _ := stream(rng, false, false, []int{100})
	s[50] ^= 1
	if _, err := feedChunks(rng, NewAssembler(false, false), s, 16); err != nil {
		t.Fatalf("CRC off: %v", err)
	}
}

// A marker whose FPDUPTR disagrees with the ULPDU_Length framing is a marker
// error (LLP code 3) when the CRC is good, or when CRC is off.
func TestMarkerErrors(t *testing.T) {
	for _, crc := range []bool{false, true} {
		f := NewFramer(crc, true)
		s := f.Append(nil, make([]byte, 600), nil) // marker inside at 512
		if ptr := s[514:516]; ptr[0] != 0x01 || ptr[1] != 0xfc {
			t.Fatalf("marker at 512 has FPDUPTR %x, want 01fc (512-4)", ptr)
		}
		s[515] = 0xf8
		if crc {
			// Recompute the CRC so that only the marker is wrong.
			PutCRC(s[len(s)-4:], CRC32c(s[:len(s)-4]))
		}
		p := NewParser(crc, true)
		var err error
		for b := s; len(b) > 0 && err == nil; {
			var n int
			n, _, err = p.Next(b)
			b = b[n:]
		}
		if !errors.Is(err, ddp.LLPMarker) {
			t.Fatalf("crc %v: %v, want marker error", crc, err)
		}
		if _, _, again := p.Next([]byte{0}); again != err {
			t.Fatal("parser not failed after an error")
		}
	}
	// The leading marker must be 0.
	s := NewFramer(false, true).Append(nil, make([]byte, 8), nil)
	s[3] = 4
	if _, err := NewAssembler(false, true).Feed(s, nil); !errors.Is(err, ddp.LLPMarker) {
		t.Fatalf("leading marker 4: %v", err)
	}
}

func TestZeroLengthULPDU(t *testing.T) {
	for _, markers := range []bool{false, true} {
		f := NewFramer(true, markers)
		s := f.Append(nil, nil, nil)
		s = f.Append(s, []byte("x"), nil)
		got, err := NewAssembler(true, markers).Feed(s, nil)
		if err != nil || len(got) != 2 || len(got[0]) != 0 || string(got[1]) != "x" {
			t.Fatalf("markers %v: %q %v", markers, got, err)
		}
	}
}
