// Package mpa implements Marker PDU Aligned framing (RFC 5044) with the
// enhanced connection setup of RFC 6581: FPDUs with CRC32c and markers, the
// MPA Request, Reply and Reject frames, their negotiation, and a resumable
// stream parser. It knows nothing of queue pairs.
//
// An FPDU on the wire:
//
//	ULPDU_Length (16) | ULPDU | PAD (0-3) | CRC (32)
//
// with, when markers are on for a direction, a 4-byte marker every 512
// octets of that direction's stream, counted from the first FPDU.
package mpa

import (
	"encoding/binary"
	"hash/crc32"
)

// Sizes of the FPDU framing.
const (
	HeaderLen = 2 // ULPDU_Length
	CRCLen    = 4
	MarkerLen = 4
	// MarkerInterval is the marker period in octets of the TCP stream
	// (RFC 5044 §4.3).
	MarkerInterval = 512
	// MaxULPDU is the largest ULPDU the 16-bit length field can carry.
	MaxULPDU = 0xffff
	// MinMULPDU is the floor of the MULPDU (RFC 5044 §4.5).
	MinMULPDU = 128
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// CRC32c returns the CRC32c of b as RFC 5044 §4.4 computes it (the iSCSI
// digest of RFC 3720). On the wire it goes least significant byte first:
// see PutCRC.
func CRC32c(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

func updateCRC(crc uint32, b []byte) uint32 { return crc32.Update(crc, castagnoli, b) }

// PutCRC writes crc in wire order. RFC 3720 §B.4: the CRC of 32 zero bytes,
// 0x8a9136aa, appears on the wire as aa 36 91 8a; RFC 5044's FPDU examples
// (§4.3 figures) agree.
func PutCRC(b []byte, crc uint32) { binary.LittleEndian.PutUint32(b, crc) }

// WireCRC reads a CRC field in wire order.
func WireCRC(b []byte) uint32 { return binary.LittleEndian.Uint32(b) }

// PadLen is the number of PAD octets after an ULPDU of n octets, so that
// ULPDU_Length, ULPDU and PAD fill a multiple of four (RFC 5044 §4.1).
func PadLen(n int) int { return (4 - (HeaderLen+n)&3) & 3 }

// FPDULen is the size of an FPDU without markers.
func FPDULen(n int) int { return HeaderLen + n + PadLen(n) + CRCLen }

// MULPDU is the largest ULPDU that fits one TCP segment of emss octets
// (RFC 5044 §4.5), never less than MinMULPDU.
func MULPDU(emss int, markers bool) int {
	m := emss - (6 + emss%4)
	if markers {
		m -= 4 * ((emss + MarkerInterval - 1) / MarkerInterval)
	}
	return max(m, MinMULPDU)
}

// Framer builds the FPDUs of one direction of a connection. It tracks the
// position in the FPDU stream, which decides where markers go. The zero
// value frames without CRC or markers.
type Framer struct {
	crc     bool
	markers bool
	// pos is the offset of the next octet from the start of the FPDU
	// stream (the first marker, or the first FPDU). Only pos mod 512
	// matters, and 2^32 is a multiple of 512, so it may wrap.
	pos uint32
}

// NewFramer returns a Framer for a direction with the negotiated CRC and
// marker settings, positioned at the start of the FPDU stream.
func NewFramer(crc, markers bool) *Framer { return &Framer{crc: crc, markers: markers} }

// Pos is the number of octets framed so far, modulo 2^32.
func (f *Framer) Pos() uint32 { return f.pos }

// WireLen is the number of stream octets the next FPDU takes for an ULPDU of
// n octets, markers included.
func (f *Framer) WireLen(n int) int {
	body := FPDULen(n)
	if !f.markers {
		return body
	}
	p, total := f.pos, 0
	if p%MarkerInterval == 0 {
		p, total = p+MarkerLen, MarkerLen
	}
	for body > 0 {
		if p%MarkerInterval == 0 {
			p += MarkerLen
			total += MarkerLen
		}
		k := min(body, int(MarkerInterval-p%MarkerInterval))
		p += uint32(k)
		body -= k
		total += k
	}
	return total
}

var zeros [4]byte

// Append appends to dst the FPDU that carries the ULPDU hdr followed by
// payload (either may be empty), markers and CRC included, and advances the
// stream position. The ULPDU must not exceed MaxULPDU; the caller sizes it
// to the MULPDU.
func (f *Framer) Append(dst, hdr, payload []byte) []byte {
	n := len(hdr) + len(payload)
	if n > MaxULPDU {
		panic("mpa: ULPDU longer than 65535 octets")
	}
	if !f.markers {
		start := len(dst)
		dst = binary.BigEndian.AppendUint16(dst, uint16(n))
		dst = append(dst, hdr...)
		dst = append(dst, payload...)
		dst = append(dst, zeros[:PadLen(n)]...)
		dst = f.appendCRC(dst, start)
		f.pos += uint32(len(dst) - start)
		return dst
	}

	// RFC 5044 §4.3: a marker that falls between FPDUs belongs to the
	// following one, has FPDUPTR 0 and is covered by its CRC (§4.4).
	start := len(dst)
	if f.pos%MarkerInterval == 0 {
		dst = appendMarker(dst, 0)
		f.pos += MarkerLen
	}
	fpdu := f.pos
	var lenField [HeaderLen]byte
	binary.BigEndian.PutUint16(lenField[:], uint16(n))
	dst = f.put(dst, lenField[:], fpdu)
	dst = f.put(dst, hdr, fpdu)
	dst = f.put(dst, payload, fpdu)
	dst = f.put(dst, zeros[:PadLen(n)], fpdu)
	// A marker right after the PAD precedes the CRC field and is covered
	// by this FPDU's CRC (§4.4 rule 1).
	if f.pos%MarkerInterval == 0 {
		dst = appendMarker(dst, f.pos-fpdu)
		f.pos += MarkerLen
	}
	dst = f.appendCRC(dst, start)
	f.pos += CRCLen
	return dst
}

// appendCRC appends the CRC of dst[start:], or zeros when CRC is off (the
// field is present either way, RFC 5044 §4.1).
func (f *Framer) appendCRC(dst []byte, start int) []byte {
	var c [CRCLen]byte
	if f.crc {
		PutCRC(c[:], CRC32c(dst[start:]))
	}
	return append(dst, c[:]...)
}

// put appends b, inserting markers that point back to the FPDU header at
// stream position fpdu.
func (f *Framer) put(dst, b []byte, fpdu uint32) []byte {
	for len(b) > 0 {
		if f.pos%MarkerInterval == 0 {
			dst = appendMarker(dst, f.pos-fpdu)
			f.pos += MarkerLen
		}
		k := min(len(b), int(MarkerInterval-f.pos%MarkerInterval))
		dst = append(dst, b[:k]...)
		f.pos += uint32(k)
		b = b[k:]
	}
	return dst
}

// appendMarker appends a marker: 16 reserved zero bits and the FPDUPTR, the
// distance back from the marker to the ULPDU_Length field of its FPDU
// (RFC 5044 §4.2).
func appendMarker(dst []byte, fpduptr uint32) []byte {
	return append(dst, 0, 0, byte(fpduptr>>8), byte(fpduptr))
}
