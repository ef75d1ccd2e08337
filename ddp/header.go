// Package ddp holds the wire formats of DDP (RFC 5041) and RDMAP (RFC 5040,
// RFC 7306): typed views over byte slices with offset constants, accessors, an
// Encode and an IsValid to call before anything else is trusted. It keeps no
// state; the queue pair engine does.
//
// Every DDP segment starts with a 16-bit control field shared by DDP and RDMAP:
//
//	 0                   1
//	 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|T|L| Resrv | DV| RV|R|  Opcode |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//
// T tagged, L last, DV the DDP version, then the RDMAP byte (RFC 5040 §4.2,
// carried in DDP's RsvdULP): RV the RDMAP version, a reserved bit pair and
// the opcode. A tagged header continues with STag and TO (14 bytes in all), an
// untagged one with a 32-bit RsvdULP (the Invalidate STag of RDMAP), QN, MSN
// and MO (18 bytes).
package ddp

import "encoding/binary"

// Header sizes and versions.
const (
	ControlLen        = 2
	TaggedHeaderLen   = 14 // RFC 5041 §4.2
	UntaggedHeaderLen = 18 // RFC 5041 §4.3

	// DDPVersion is the only DDP version (RFC 5041 §4.1: DV = 01b).
	DDPVersion = 1
	// RDMAPVersion is the only RDMAP version (RFC 5040 §4.2: RV = 01b).
	RDMAPVersion = 1
)

// Bits of the DDP control byte (RFC 5041 §4.1).
const (
	flagTagged  = 0x80
	flagLast    = 0x40
	maskDDPRsvd = 0x3c
	maskDV      = 0x03
	maskRV      = 0xc0
	shiftRV     = 6
	maskRDMARsv = 0x30
	maskOpcode  = 0x0f
)

// Offsets inside the headers.
const (
	offSTag = 2
	offTO   = 6

	offInvSTag = 2
	offQN      = 6
	offMSN     = 10
	offMO      = 14
)

// Header is a view over the start of a DDP segment: the control field common
// to tagged and untagged segments. Call IsValid before any accessor.
type Header []byte

// IsValid reports whether the view holds the whole header its T bit announces.
func (h Header) IsValid() bool {
	if len(h) < ControlLen {
		return false
	}
	return len(h) >= h.Len()
}

// Tagged reports the T bit.
func (h Header) Tagged() bool { return h[0]&flagTagged != 0 }

// Last reports the L bit: the segment ends its DDP message.
func (h Header) Last() bool { return h[0]&flagLast != 0 }

// DDPVersion returns the DV field.
func (h Header) DDPVersion() uint8 { return h[0] & maskDV }

// DDPReserved returns the reserved bits of the DDP control byte, which
// senders set to zero and receivers do not check (RFC 5041 §4.1).
func (h Header) DDPReserved() uint8 { return (h[0] & maskDDPRsvd) >> 2 }

// RDMAPVersion returns the RV field.
func (h Header) RDMAPVersion() uint8 { return h[1] >> shiftRV }

// Opcode returns the RDMAP opcode.
func (h Header) Opcode() Opcode { return Opcode(h[1] & maskOpcode) }

// Len is the header length the T bit announces.
func (h Header) Len() int {
	if h.Tagged() {
		return TaggedHeaderLen
	}
	return UntaggedHeaderLen
}

// Payload returns what follows the DDP header (for RDMAP messages with a
// body, the body comes first). The view must be valid.
func (h Header) Payload() []byte { return h[h.Len():] }

// TaggedView returns the header as a tagged view; the T bit must be set.
func (h Header) TaggedView() Tagged { return Tagged(h) }

// UntaggedView returns the header as an untagged view; the T bit must be clear.
func (h Header) UntaggedView() Untagged { return Untagged(h) }

func encodeControl(b []byte, tagged, last bool, op Opcode) {
	c := byte(DDPVersion)
	if tagged {
		c |= flagTagged
	}
	if last {
		c |= flagLast
	}
	b[0] = c
	b[1] = RDMAPVersion<<shiftRV | byte(op)&maskOpcode
}

// Tagged is a view over a tagged DDP header (RFC 5041 §4.2).
type Tagged []byte

// TaggedFields are the fields of a tagged header.
type TaggedFields struct {
	Last   bool
	Opcode Opcode
	STag   uint32
	TO     uint64
}

// IsValid reports whether the view is long enough and tagged.
func (t Tagged) IsValid() bool { return len(t) >= TaggedHeaderLen && t[0]&flagTagged != 0 }

// STag returns the Steering Tag of the target buffer.
func (t Tagged) STag() uint32 { return binary.BigEndian.Uint32(t[offSTag:]) }

// TO returns the Tagged Offset of the first payload byte.
func (t Tagged) TO() uint64 { return binary.BigEndian.Uint64(t[offTO:]) }

// Header returns the common control view.
func (t Tagged) Header() Header { return Header(t) }

// Encode writes f into the first TaggedHeaderLen bytes.
func (t Tagged) Encode(f *TaggedFields) {
	encodeControl(t, true, f.Last, f.Opcode)
	binary.BigEndian.PutUint32(t[offSTag:], f.STag)
	binary.BigEndian.PutUint64(t[offTO:], f.TO)
}

// Untagged is a view over an untagged DDP header (RFC 5041 §4.3) carrying an
// RDMAP message.
type Untagged []byte

// UntaggedFields are the fields of an untagged header.
type UntaggedFields struct {
	Last   bool
	Opcode Opcode
	// InvalidateSTag is the STag to invalidate, for Send with Invalidate
	// (RFC 5040 §4.3); zero otherwise.
	InvalidateSTag uint32
	QN             uint32
	MSN            MSN
	MO             uint32
}

// IsValid reports whether the view is long enough and untagged.
func (u Untagged) IsValid() bool { return len(u) >= UntaggedHeaderLen && u[0]&flagTagged == 0 }

// InvalidateSTag returns the RsvdULP word that RDMAP uses for the STag of
// Send with Invalidate.
func (u Untagged) InvalidateSTag() uint32 { return binary.BigEndian.Uint32(u[offInvSTag:]) }

// QN returns the queue number.
func (u Untagged) QN() uint32 { return binary.BigEndian.Uint32(u[offQN:]) }

// MSN returns the message sequence number.
func (u Untagged) MSN() MSN { return MSN(binary.BigEndian.Uint32(u[offMSN:])) }

// MO returns the message offset of the first payload byte.
func (u Untagged) MO() uint32 { return binary.BigEndian.Uint32(u[offMO:]) }

// Header returns the common control view.
func (u Untagged) Header() Header { return Header(u) }

// Encode writes f into the first UntaggedHeaderLen bytes.
func (u Untagged) Encode(f *UntaggedFields) {
	encodeControl(u, false, f.Last, f.Opcode)
	binary.BigEndian.PutUint32(u[offInvSTag:], f.InvalidateSTag)
	binary.BigEndian.PutUint32(u[offQN:], f.QN)
	binary.BigEndian.PutUint32(u[offMSN:], uint32(f.MSN))
	binary.BigEndian.PutUint32(u[offMO:], f.MO)
}

// MSN is a DDP message sequence number. It wraps at 2^32 (RFC 5041 §5.3),
// so it is compared in a window, never with < directly.
type MSN uint32

// LessThan reports whether m comes before o, modulo 2^32.
func (m MSN) LessThan(o MSN) bool { return int32(m-o) < 0 }

// InWindow reports whether m lies in [first, first+size), modulo 2^32.
func (m MSN) InWindow(first MSN, size uint32) bool { return uint32(m-first) < size }
