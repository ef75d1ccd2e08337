package header

import (
	"encoding/binary"
	"net/netip"
)

// IPv6 header size and version.
const (
	// IPv6Len is the length of the fixed header (RFC 8200 §3).
	IPv6Len = 40
	// IPv6Version is the version field of every IPv6 header.
	IPv6Version = 6
)

// Offsets inside an IPv6 header (RFC 8200 §3):
//
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|Version| Traffic Class |           Flow Label                  |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|         Payload Length        |  Next Header  |   Hop Limit   |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                 Source Address (128 bits)                     |
//	|               Destination Address (128 bits)                  |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
const (
	ip6VersTCFlow  = 0
	ip6PayloadLen  = 4
	ip6NextHeader  = 6
	ip6HopLimit    = 7
	ip6Src         = 8
	ip6Dst         = 24
	ip6FlowLabel   = 0x000fffff
	ip6TCShift     = 20
	ip6VersionBits = 28
)

// IPv6 is a view over an IPv6 packet. Only the fixed header is described:
// extension headers, if Next Header announces one, are the caller's to walk,
// and jumbograms (RFC 2675) are not supported. Call IsValid before any
// accessor.
type IPv6 []byte

// IPv6Fields are the fields of the fixed IPv6 header.
type IPv6Fields struct {
	TrafficClass uint8
	FlowLabel    uint32 // low 20 bits
	PayloadLen   uint16 // what follows the fixed header
	NextHeader   uint8
	HopLimit     uint8
	Src, Dst     netip.Addr // IPv6 addresses
}

// IsValid reports whether the view holds a version 6 header and all of the
// payload its Payload Length announces, when n octets of the packet (normally
// len(b)) were received. Padding past the payload is allowed.
func (b IPv6) IsValid(n int) bool {
	if len(b) < IPv6Len || b[ip6VersTCFlow]>>4 != IPv6Version {
		return false
	}
	end := IPv6Len + b.PayloadLen()
	return end <= n && end <= len(b)
}

// TrafficClass returns the Traffic Class octet (DSCP and ECN).
func (b IPv6) TrafficClass() uint8 {
	return uint8(binary.BigEndian.Uint32(b[ip6VersTCFlow:]) >> ip6TCShift)
}

// FlowLabel returns the 20-bit flow label.
func (b IPv6) FlowLabel() uint32 { return binary.BigEndian.Uint32(b[ip6VersTCFlow:]) & ip6FlowLabel }

// PayloadLen returns the length of what follows the fixed header, extension
// headers included, in octets.
func (b IPv6) PayloadLen() int { return int(binary.BigEndian.Uint16(b[ip6PayloadLen:])) }

// NextHeader returns the type of the header after the fixed one, such as
// IPProtocolTCP.
func (b IPv6) NextHeader() uint8 { return b[ip6NextHeader] }

// HopLimit returns the hop limit.
func (b IPv6) HopLimit() uint8 { return b[ip6HopLimit] }

// Src returns the source address.
func (b IPv6) Src() netip.Addr { return netip.AddrFrom16([16]byte(b[ip6Src:])) }

// Dst returns the destination address.
func (b IPv6) Dst() netip.Addr { return netip.AddrFrom16([16]byte(b[ip6Dst:])) }

// Payload returns what follows the fixed header, up to Payload Length.
func (b IPv6) Payload() []byte { return b[IPv6Len : IPv6Len+b.PayloadLen()] }

// Encode writes f into the first IPv6Len bytes. IPv6 has no header checksum.
func (b IPv6) Encode(f *IPv6Fields) {
	_ = b[IPv6Len-1]
	v := uint32(IPv6Version)<<ip6VersionBits | uint32(f.TrafficClass)<<ip6TCShift | f.FlowLabel&ip6FlowLabel
	binary.BigEndian.PutUint32(b[ip6VersTCFlow:], v)
	binary.BigEndian.PutUint16(b[ip6PayloadLen:], f.PayloadLen)
	b[ip6NextHeader] = f.NextHeader
	b[ip6HopLimit] = f.HopLimit
	src, dst := f.Src.As16(), f.Dst.As16()
	copy(b[ip6Src:], src[:])
	copy(b[ip6Dst:], dst[:])
}
