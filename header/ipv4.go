package header

import (
	"encoding/binary"
	"net/netip"
)

// IPv4 header sizes and protocol numbers.
const (
	// IPv4MinLen is the length of a header without options (RFC 791 §3.1).
	IPv4MinLen = 20
	// IPv4MaxLen is the longest header IHL can announce: 15 words.
	IPv4MaxLen = 60
	// IPv4Version is the version field of every IPv4 header.
	IPv4Version = 4
	// IPProtocolTCP is TCP's number in the IPv4 Protocol and IPv6 Next
	// Header fields (IANA "Assigned Internet Protocol Numbers").
	IPProtocolTCP = 6
)

// Offsets and bits inside an IPv4 header (RFC 791 §3.1):
//
//	 0                   1                   2                   3
//	 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|Version|  IHL  |Type of Service|          Total Length         |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|         Identification        |Flags|      Fragment Offset    |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|  Time to Live |    Protocol   |         Header Checksum       |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                       Source Address                          |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                    Destination Address                        |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
const (
	ip4VersIHL   = 0
	ip4TOS       = 1
	ip4TotalLen  = 2
	ip4ID        = 4
	ip4FlagsFrag = 6
	ip4TTL       = 8
	ip4Protocol  = 9
	ip4Checksum  = 10
	ip4Src       = 12
	ip4Dst       = 16

	ip4FlagDF     = 0x4000
	ip4FlagMF     = 0x2000
	ip4FragOffset = 0x1fff
)

// IPv4 is a view over an IPv4 packet. Call IsValid before any accessor.
type IPv4 []byte

// IPv4Fields are the fields of an IPv4 header without options.
type IPv4Fields struct {
	TOS          uint8
	TotalLen     uint16 // header and payload
	ID           uint16
	DontFragment bool
	TTL          uint8
	Protocol     uint8
	Src, Dst     netip.Addr // IPv4 addresses
}

// IsValid reports whether the view holds a well-formed header and all of the
// datagram its Total Length announces, when n octets of it (normally
// len(b)) were received. Padding past Total Length, as Ethernet adds to
// short frames, is allowed. The header checksum is checked separately by
// IsChecksumValid.
func (b IPv4) IsValid(n int) bool {
	if len(b) < IPv4MinLen {
		return false
	}
	// RFC 791 §3.1: Version is 4; IHL counts 32-bit words and is at least 5;
	// Total Length covers header and data.
	hl, tl := b.HeaderLen(), b.TotalLen()
	return b[ip4VersIHL]>>4 == IPv4Version && hl >= IPv4MinLen &&
		hl <= tl && tl <= n && tl <= len(b)
}

// Version returns the version field.
func (b IPv4) Version() uint8 { return b[ip4VersIHL] >> 4 }

// HeaderLen returns the header length in octets, options included.
func (b IPv4) HeaderLen() int { return int(b[ip4VersIHL]&0x0f) * 4 }

// TOS returns the Type of Service octet (DSCP and ECN, RFC 2474, RFC 3168).
func (b IPv4) TOS() uint8 { return b[ip4TOS] }

// TotalLen returns the length of the datagram, header and data, in octets.
func (b IPv4) TotalLen() int { return int(binary.BigEndian.Uint16(b[ip4TotalLen:])) }

// ID returns the Identification field.
func (b IPv4) ID() uint16 { return binary.BigEndian.Uint16(b[ip4ID:]) }

// DontFragment reports the DF flag.
func (b IPv4) DontFragment() bool { return binary.BigEndian.Uint16(b[ip4FlagsFrag:])&ip4FlagDF != 0 }

// MoreFragments reports the MF flag.
func (b IPv4) MoreFragments() bool { return binary.BigEndian.Uint16(b[ip4FlagsFrag:])&ip4FlagMF != 0 }

// FragmentOffset returns the offset of the fragment's data in the original
// datagram, in octets (the field counts units of 8 octets).
func (b IPv4) FragmentOffset() uint16 {
	return (binary.BigEndian.Uint16(b[ip4FlagsFrag:]) & ip4FragOffset) * 8
}

// IsFragment reports whether the datagram is a fragment rather than whole:
// MF set or a non-zero offset.
func (b IPv4) IsFragment() bool {
	return binary.BigEndian.Uint16(b[ip4FlagsFrag:])&(ip4FlagMF|ip4FragOffset) != 0
}

// TTL returns the Time to Live.
func (b IPv4) TTL() uint8 { return b[ip4TTL] }

// Protocol returns the protocol of the payload, such as IPProtocolTCP.
func (b IPv4) Protocol() uint8 { return b[ip4Protocol] }

// Checksum returns the header checksum field.
func (b IPv4) Checksum() uint16 { return binary.BigEndian.Uint16(b[ip4Checksum:]) }

// Src returns the source address.
func (b IPv4) Src() netip.Addr { return netip.AddrFrom4([4]byte(b[ip4Src:])) }

// Dst returns the destination address.
func (b IPv4) Dst() netip.Addr { return netip.AddrFrom4([4]byte(b[ip4Dst:])) }

// Options returns the header options, between the fixed header and
// HeaderLen.
func (b IPv4) Options() []byte { return b[IPv4MinLen:b.HeaderLen()] }

// Payload returns the data, from the end of the header up to Total Length,
// so link-layer padding is left out.
func (b IPv4) Payload() []byte { return b[b.HeaderLen():b.TotalLen()] }

// IsChecksumValid reports whether the header checksum is right: the sum of
// the header, checksum field included, is all ones (RFC 791 §3.1, RFC 1071
// §1(3)). The view must be valid.
func (b IPv4) IsChecksumValid() bool { return Checksum(b[:b.HeaderLen()], 0) == 0xffff }

// SetChecksum computes the header checksum and stores it, after a change to
// any header field.
func (b IPv4) SetChecksum() {
	hl := b.HeaderLen()
	binary.BigEndian.PutUint16(b[ip4Checksum:], 0)
	binary.BigEndian.PutUint16(b[ip4Checksum:], ^Checksum(b[:hl], 0))
}

// Encode writes f as a header without options into the first IPv4MinLen
// bytes, checksum included. The fragment offset and MF are zero: the engine
// sends whole datagrams.
func (b IPv4) Encode(f *IPv4Fields) {
	_ = b[IPv4MinLen-1]
	b[ip4VersIHL] = IPv4Version<<4 | IPv4MinLen/4
	b[ip4TOS] = f.TOS
	binary.BigEndian.PutUint16(b[ip4TotalLen:], f.TotalLen)
	binary.BigEndian.PutUint16(b[ip4ID:], f.ID)
	var flags uint16
	if f.DontFragment {
		flags = ip4FlagDF
	}
	binary.BigEndian.PutUint16(b[ip4FlagsFrag:], flags)
	b[ip4TTL] = f.TTL
	b[ip4Protocol] = f.Protocol
	src, dst := f.Src.As4(), f.Dst.As4()
	copy(b[ip4Src:], src[:])
	copy(b[ip4Dst:], dst[:])
	b.SetChecksum()
}
