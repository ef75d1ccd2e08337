package header

import (
	"encoding/binary"
	"net/netip"
)

// TCP header sizes.
const (
	// TCPMinLen is the length of a header without options (RFC 9293 §3.1).
	TCPMinLen = 20
	// TCPMaxLen is the longest header Data Offset can announce: 15 words.
	TCPMaxLen = 60
	// TCPMaxOptionsLen is the room for options in the longest header.
	TCPMaxOptionsLen = TCPMaxLen - TCPMinLen
)

// TCP control bits, in the octet Flags returns (RFC 9293 §3.1; ECE and CWR
// from RFC 3168 §6.1).
const (
	TCPFlagFIN = 0x01
	TCPFlagSYN = 0x02
	TCPFlagRST = 0x04
	TCPFlagPSH = 0x08
	TCPFlagACK = 0x10
	TCPFlagURG = 0x20
	TCPFlagECE = 0x40
	TCPFlagCWR = 0x80
)

// Offsets inside a TCP header (RFC 9293 §3.1):
//
//	 0                   1                   2                   3
//	 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|          Source Port          |       Destination Port        |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                        Sequence Number                        |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                    Acknowledgment Number                      |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|  Data |       |C|E|U|A|P|R|S|F|                               |
//	| Offset| Rsrvd |W|C|R|C|S|S|Y|I|            Window             |
//	|       |       |R|E|G|K|H|T|N|N|                               |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|           Checksum            |         Urgent Pointer        |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
const (
	tcpSrcPort  = 0
	tcpDstPort  = 2
	tcpSeq      = 4
	tcpAck      = 8
	tcpDataOff  = 12
	tcpFlags    = 13
	tcpWindow   = 14
	tcpChecksum = 16
	tcpUrgent   = 18
)

// TCP is a view over a TCP segment, header and payload; the slice ends where
// the segment does. Call IsValid before any accessor.
type TCP []byte

// TCPFields are the fields of the fixed TCP header.
type TCPFields struct {
	SrcPort, DstPort uint16
	Seq, Ack         uint32
	Flags            uint8
	Window           uint16
	Urgent           uint16
	// OptionsLen is the length of the options that follow the fixed header,
	// a multiple of 4 no greater than TCPMaxOptionsLen. Encode only counts
	// them in Data Offset; EncodeTCPOptions writes them.
	OptionsLen int
}

// IsValid reports whether the view holds a whole header, options included,
// when n octets of the segment (normally len(t)) were received: RFC 9293
// §3.1 makes Data Offset at least 5 words, and the header must fit.
func (t TCP) IsValid(n int) bool {
	if len(t) < TCPMinLen {
		return false
	}
	off := t.DataOffset()
	return off >= TCPMinLen && off <= n && off <= len(t)
}

// SrcPort returns the source port.
func (t TCP) SrcPort() uint16 { return binary.BigEndian.Uint16(t[tcpSrcPort:]) }

// DstPort returns the destination port.
func (t TCP) DstPort() uint16 { return binary.BigEndian.Uint16(t[tcpDstPort:]) }

// Seq returns the sequence number.
func (t TCP) Seq() uint32 { return binary.BigEndian.Uint32(t[tcpSeq:]) }

// Ack returns the acknowledgment number, meaningful when ACK is set.
func (t TCP) Ack() uint32 { return binary.BigEndian.Uint32(t[tcpAck:]) }

// DataOffset returns the header length in octets, options included.
func (t TCP) DataOffset() int { return int(t[tcpDataOff]>>4) * 4 }

// Flags returns the control bits (TCPFlagFIN ... TCPFlagCWR).
func (t TCP) Flags() uint8 { return t[tcpFlags] }

// Window returns the window field, before any window scaling.
func (t TCP) Window() uint16 { return binary.BigEndian.Uint16(t[tcpWindow:]) }

// Checksum returns the checksum field.
func (t TCP) Checksum() uint16 { return binary.BigEndian.Uint16(t[tcpChecksum:]) }

// UrgentPointer returns the urgent pointer, meaningful when URG is set.
func (t TCP) UrgentPointer() uint16 { return binary.BigEndian.Uint16(t[tcpUrgent:]) }

// Options returns the options, between the fixed header and Data Offset.
// Parse them with ParseTCPOptions.
func (t TCP) Options() []byte { return t[TCPMinLen:t.DataOffset()] }

// Payload returns the data after the header.
func (t TCP) Payload() []byte { return t[t.DataOffset():] }

// IsChecksumValid reports whether the checksum over the pseudo-header, the
// header and the payload (the whole view) is right (RFC 9293 §3.1). src and
// dst are the addresses of the IP header the segment came in.
func (t TCP) IsChecksumValid(src, dst netip.Addr) bool {
	return Checksum(t, PseudoHeaderChecksum(IPProtocolTCP, src, dst, uint16(len(t)))) == 0xffff
}

// SetChecksum computes the checksum over the pseudo-header, the header and
// the payload (the whole view) and stores it (RFC 9293 §3.1).
func (t TCP) SetChecksum(src, dst netip.Addr) {
	binary.BigEndian.PutUint16(t[tcpChecksum:], 0)
	s := Checksum(t, PseudoHeaderChecksum(IPProtocolTCP, src, dst, uint16(len(t))))
	binary.BigEndian.PutUint16(t[tcpChecksum:], ^s)
}

// Encode writes f into the first TCPMinLen bytes with a zero checksum: set
// it with SetChecksum once options and payload are in place. The reserved
// bits are zero (RFC 9293 §3.1). It panics if f.OptionsLen is not a multiple
// of 4 in [0, TCPMaxOptionsLen], a bug in the caller.
func (t TCP) Encode(f *TCPFields) {
	if f.OptionsLen&3 != 0 || uint(f.OptionsLen) > TCPMaxOptionsLen {
		panic("header: TCP options length not a multiple of 4 in [0, 40]")
	}
	_ = t[TCPMinLen-1]
	binary.BigEndian.PutUint16(t[tcpSrcPort:], f.SrcPort)
	binary.BigEndian.PutUint16(t[tcpDstPort:], f.DstPort)
	binary.BigEndian.PutUint32(t[tcpSeq:], f.Seq)
	binary.BigEndian.PutUint32(t[tcpAck:], f.Ack)
	t[tcpDataOff] = uint8((TCPMinLen+f.OptionsLen)/4) << 4
	t[tcpFlags] = f.Flags
	binary.BigEndian.PutUint16(t[tcpWindow:], f.Window)
	binary.BigEndian.PutUint16(t[tcpChecksum:], 0)
	binary.BigEndian.PutUint16(t[tcpUrgent:], f.Urgent)
}
