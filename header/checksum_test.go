package header

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"
)

// refChecksum is RFC 1071 read literally: 16-bit big-endian words summed
// into 32 bits, the carries folded at the end.
func refChecksum(b []byte, initial uint16) uint16 {
	s := uint32(initial)
	for ; len(b) >= 2; b = b[2:] {
		s += uint32(binary.BigEndian.Uint16(b))
	}
	if len(b) == 1 {
		s += uint32(b[0]) << 8
	}
	for s > 0xffff {
		s = s>>16 + s&0xffff
	}
	return uint16(s)
}

func TestChecksumRFC1071Example(t *testing.T) {
	// RFC 1071 §3: the words 0001 f203 f4f5 f6f7 sum to ddf2.
	b := []byte{0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7}
	if got := Checksum(b, 0); got != 0xddf2 {
		t.Fatalf("Checksum = %#04x, want 0xddf2", got)
	}
	// §2(B): swapping the octets of every word swaps the sum.
	if got := Checksum([]byte{0x01, 0x00, 0x03, 0xf2, 0xf5, 0xf4, 0xf7, 0xf6}, 0); got != 0xf2dd {
		t.Fatalf("swapped Checksum = %#04x, want 0xf2dd", got)
	}
}

func TestChecksumMatchesReference(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	buf := make([]byte, 9100)
	for i := range buf {
		buf[i] = byte(r.Uint32())
	}
	ones := make([]byte, 9000)
	for i := range ones {
		ones[i] = 0xff
	}
	for n := range 300 {
		for _, off := range []int{0, 1, 3, 7} { // unaligned starts too
			b := buf[off : off+n]
			init := uint16(r.Uint32())
			if got, want := Checksum(b, init), refChecksum(b, init); got != want {
				t.Fatalf("len %d off %d init %#x: got %#04x, want %#04x", n, off, init, got, want)
			}
		}
	}
	for _, n := range []int{1460, 8999, 9000} {
		for _, b := range [][]byte{buf[:n], ones[:n]} {
			for _, init := range []uint16{0, 0xffff, 0x8001} {
				if got, want := Checksum(b, init), refChecksum(b, init); got != want {
					t.Fatalf("len %d init %#x: got %#04x, want %#04x", n, init, got, want)
				}
			}
		}
	}
}

func TestChecksumCombine(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	b := make([]byte, 1500)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	whole := Checksum(b, 0)
	for _, cut := range []int{0, 2, 20, 54, 1000, 1500} {
		if got := ChecksumCombine(Checksum(b[:cut], 0), Checksum(b[cut:], 0)); got != whole {
			t.Errorf("cut at %d: %#04x, want %#04x", cut, got, whole)
		}
	}
	if got := ChecksumCombine(0xffff, 0x0001); got != 0x0001 {
		t.Errorf("ChecksumCombine(0xffff, 1) = %#04x, want 1 (end-around carry)", got)
	}
}

func TestPseudoHeaderChecksum(t *testing.T) {
	for _, tc := range []struct {
		src, dst string
		pseudo   []byte // the pseudo-header as laid out by the RFC
	}{
		// RFC 9293 §3.1: src, dst, zero, PTCL, TCP length.
		{"192.0.2.1", "198.51.100.7", []byte{192, 0, 2, 1, 198, 51, 100, 7, 0, 6, 0x05, 0xdc}},
		// RFC 8200 §8.1: src, dst, 32-bit upper-layer length, 3 zeros, next header.
		{"2001:db8::1", "2001:db8::ff:2", []byte{
			0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1,
			0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0, 2,
			0, 0, 0x05, 0xdc, 0, 0, 0, 6}},
	} {
		got := PseudoHeaderChecksum(IPProtocolTCP, netip.MustParseAddr(tc.src), netip.MustParseAddr(tc.dst), 1500)
		if want := refChecksum(tc.pseudo, 0); got != want {
			t.Errorf("%s -> %s: %#04x, want %#04x", tc.src, tc.dst, got, want)
		}
	}
}

func BenchmarkChecksum(b *testing.B) {
	for _, n := range []int{64, 1460, 9000} {
		buf := make([]byte, n)
		for i := range buf {
			buf[i] = byte(i * 7)
		}
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			b.SetBytes(int64(n))
			var s uint16
			for b.Loop() {
				s = Checksum(buf, s)
			}
		})
	}
}
