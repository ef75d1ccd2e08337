package header

import "encoding/binary"

// EthernetLen is the length of an Ethernet II header without an 802.1Q tag.
const EthernetLen = 14

// EtherType values (IEEE 802 numbers, as registered with IANA).
const (
	EtherTypeIPv4 = 0x0800
	EtherTypeARP  = 0x0806
	EtherTypeIPv6 = 0x86dd
)

// Offsets inside an Ethernet header.
const (
	ethDst  = 0
	ethSrc  = 6
	ethType = 12
)

// Ethernet is a view over an Ethernet II frame, from the destination address
// on (no preamble, no frame check sequence). Call IsValid before any
// accessor.
type Ethernet []byte

// EthernetFields are the fields of an Ethernet header.
type EthernetFields struct {
	Dst, Src [6]byte
	Type     uint16
}

// IsValid reports whether the view holds a whole header.
func (e Ethernet) IsValid() bool { return len(e) >= EthernetLen }

// Dst returns the destination MAC address.
func (e Ethernet) Dst() [6]byte { return [6]byte(e[ethDst:]) }

// Src returns the source MAC address.
func (e Ethernet) Src() [6]byte { return [6]byte(e[ethSrc:]) }

// Type returns the EtherType of the payload.
func (e Ethernet) Type() uint16 { return binary.BigEndian.Uint16(e[ethType:]) }

// Payload returns what follows the header, padding included: the network
// header says how much of it is data.
func (e Ethernet) Payload() []byte { return e[EthernetLen:] }

// Encode writes f into the first EthernetLen bytes.
func (e Ethernet) Encode(f *EthernetFields) {
	_ = e[EthernetLen-1]
	copy(e[ethDst:], f.Dst[:])
	copy(e[ethSrc:], f.Src[:])
	binary.BigEndian.PutUint16(e[ethType:], f.Type)
}
