package header

import (
	"encoding/binary"
	"math/bits"
	"net/netip"
)

// Checksum returns the 16-bit one's-complement sum of b, as 16-bit
// big-endian words, added to initial (RFC 1071 §1). A trailing odd octet is
// the high half of a word padded with zero. The sum is not complemented:
// the checksum field of a header is ^Checksum(...), and a received header is
// intact when the sum over it, checksum field included, is 0xffff.
//
// The sum is byte-order independent (RFC 1071 §2(B)), so b is read as
// little-endian 64-bit words (plain loads on common machines), added with
// end-around carry in one 64-bit accumulator (§2(C)), folded to 16
// bits and swapped once.
func Checksum(b []byte, initial uint16) uint16 {
	s := uint64(bits.ReverseBytes16(initial))
	var c uint64
	for len(b) >= 64 { // one chain of add-with-carry, unrolled
		s, c = bits.Add64(s, binary.LittleEndian.Uint64(b), c)
		s, c = bits.Add64(s, binary.LittleEndian.Uint64(b[8:]), c)
		s, c = bits.Add64(s, binary.LittleEndian.Uint64(b[16:]), c)
		s, c = bits.Add64(s, binary.LittleEndian.Uint64(b[24:]), c)
		s, c = bits.Add64(s, binary.LittleEndian.Uint64(b[32:]), c)
		s, c = bits.Add64(s, binary.LittleEndian.Uint64(b[40:]), c)
		s, c = bits.Add64(s, binary.LittleEndian.Uint64(b[48:]), c)
		s, c = bits.Add64(s, binary.LittleEndian.Uint64(b[56:]), c)
		b = b[64:]
	}
	for len(b) >= 8 {
		s, c = bits.Add64(s, binary.LittleEndian.Uint64(b), c)
		b = b[8:]
	}
	// Fold to 33 bits so the tail below cannot overflow.
	s = s>>32 + s&0xffffffff + c
	if len(b) >= 4 {
		s += uint64(binary.LittleEndian.Uint32(b))
		b = b[4:]
	}
	if len(b) >= 2 {
		s += uint64(binary.LittleEndian.Uint16(b))
		b = b[2:]
	}
	if len(b) == 1 {
		s += uint64(b[0]) // the high octet of a big-endian word
	}
	return bits.ReverseBytes16(fold(s))
}

// fold reduces a one's-complement accumulator to 16 bits.
func fold(s uint64) uint16 {
	s = s>>32 + s&0xffffffff
	s = s>>16 + s&0xffff
	s = s>>16 + s&0xffff
	s = s>>16 + s&0xffff
	return uint16(s)
}

// ChecksumCombine returns the one's-complement sum of two partial sums. The
// sum of a buffer split at an even offset is the combination of the sums of
// its halves.
func ChecksumCombine(a, b uint16) uint16 {
	s := uint32(a) + uint32(b)
	return uint16(s + s>>16)
}

// PseudoHeaderChecksum returns the uncomplemented sum of the pseudo-header
// that TCP and UDP prefix to their checksum: for IPv4 (RFC 9293 §3.1) the two
// addresses, a zero octet, the protocol and the segment length; for IPv6
// (RFC 8200 §8.1) the two addresses, the upper-layer packet length and the
// next header. src and dst must be of the same family; length is the length
// of the transport header and its payload. Feed the result to Checksum as
// its initial value.
func PseudoHeaderChecksum(proto uint8, src, dst netip.Addr, length uint16) uint16 {
	var s uint16
	if src.Is4() {
		a, b := src.As4(), dst.As4()
		s = Checksum(a[:], 0)
		s = Checksum(b[:], s)
	} else {
		a, b := src.As16(), dst.As16()
		s = Checksum(a[:], 0)
		s = Checksum(b[:], s)
	}
	// The zero octet and the protocol make one word, the length another; the
	// IPv6 form has the same two values, as a 32-bit length and a word of
	// zeros before next header, so the sums agree.
	return ChecksumCombine(s, ChecksumCombine(uint16(proto), length))
}
