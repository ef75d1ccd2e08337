package sdp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
)

// MID is a message identifier (Annex A4's numbering).
type MID uint8

// Message identifiers.
const (
	MIDHello           MID = 0x00
	MIDHelloAck        MID = 0x01
	MIDDisConn         MID = 0x02
	MIDAbortConn       MID = 0x03
	MIDSendSM          MID = 0x04
	MIDRdmaWrCompl     MID = 0x05
	MIDRdmaRdCompl     MID = 0x06
	MIDModeChange      MID = 0x07
	MIDSrcAvailCancel  MID = 0x08
	MIDSinkAvailCancel MID = 0x09
	MIDSinkCancelAck   MID = 0x0A
	MIDChRcvBuf        MID = 0x0B
	MIDChRcvBufAck     MID = 0x0C
	MIDSuspComm        MID = 0x0D
	MIDSuspCommAck     MID = 0x0E
	MIDSinkAvail       MID = 0xFD
	MIDSrcAvail        MID = 0xFE
	MIDData            MID = 0xFF
)

var midNames = map[MID]string{
	MIDHello: "Hello", MIDHelloAck: "HelloAck", MIDDisConn: "DisConn", MIDAbortConn: "AbortConn",
	MIDSendSM: "SendSM", MIDRdmaWrCompl: "RdmaWrCompl", MIDRdmaRdCompl: "RdmaRdCompl",
	MIDModeChange: "ModeChange", MIDSrcAvailCancel: "SrcAvailCancel", MIDSinkAvailCancel: "SinkAvailCancel",
	MIDSinkCancelAck: "SinkCancelAck", MIDChRcvBuf: "ChRcvBuf", MIDChRcvBufAck: "ChRcvBufAck",
	MIDSuspComm: "SuspComm", MIDSuspCommAck: "SuspCommAck", MIDSinkAvail: "SinkAvail",
	MIDSrcAvail: "SrcAvail", MIDData: "Data",
}

func (m MID) String() string {
	if s, ok := midNames[m]; ok {
		return s
	}
	return fmt.Sprintf("MID(%#02x)", uint8(m))
}

// extraLen is the length of the header after the BSDH of each message
// that has one, and -1 for an identifier Annex A4 does not define.
func (m MID) extraLen() int {
	switch m {
	case MIDHello:
		return helloBodyLen
	case MIDHelloAck:
		return helloAckBodyLen
	case MIDSrcAvail:
		return 16
	case MIDSinkAvail:
		return 20
	case MIDRdmaWrCompl, MIDRdmaRdCompl, MIDChRcvBuf, MIDChRcvBufAck, MIDModeChange:
		return 4
	case MIDSuspComm:
		return 8
	case MIDDisConn, MIDAbortConn, MIDSendSM, MIDSrcAvailCancel, MIDSinkAvailCancel, MIDSinkCancelAck,
		MIDSuspCommAck, MIDData:
		return 0
	}
	return -1
}

// BSDH flags.
const (
	FlagOOBPresent = 0x01
	FlagOOBPending = 0x02
	FlagReqPipe    = 0x04
)

// BSDHLen is the length of the Base Sockets Direct Header.
const BSDHLen = 16

// BSDH is the header every message starts with.
type BSDH struct {
	MID   MID
	Flags uint8
	// Bufs is the number of receive buffers the sender has posted.
	Bufs uint16
	// Len is the whole message's length, headers included.
	Len uint32
	// MSeq numbers the sender's messages; MSeqAck is the MSeq of the
	// last message the sender received.
	MSeq, MSeqAck uint32
}

// Put writes h into b[:BSDHLen].
func (h BSDH) Put(b []byte) {
	_ = b[BSDHLen-1]
	b[0], b[1] = byte(h.MID), h.Flags
	binary.BigEndian.PutUint16(b[2:], h.Bufs)
	binary.BigEndian.PutUint32(b[4:], h.Len)
	binary.BigEndian.PutUint32(b[8:], h.MSeq)
	binary.BigEndian.PutUint32(b[12:], h.MSeqAck)
}

// ErrMalformed reports a message that does not decode.
var ErrMalformed = errors.New("sdp: malformed message")

// ParseBSDH decodes the header of msg, the whole message as received,
// and checks that its Len is the message's length and that an identifier
// with an extra header has room for it.
func ParseBSDH(msg []byte) (BSDH, error) {
	if len(msg) < BSDHLen {
		return BSDH{}, fmt.Errorf("%w: %d octets, shorter than a BSDH", ErrMalformed, len(msg))
	}
	h := BSDH{MID: MID(msg[0]), Flags: msg[1], Bufs: binary.BigEndian.Uint16(msg[2:]),
		Len: binary.BigEndian.Uint32(msg[4:]), MSeq: binary.BigEndian.Uint32(msg[8:]),
		MSeqAck: binary.BigEndian.Uint32(msg[12:])}
	if int64(h.Len) != int64(len(msg)) {
		return h, fmt.Errorf("%w: %v says %d octets, %d arrived", ErrMalformed, h.MID, h.Len, len(msg))
	}
	x := h.MID.extraLen()
	if x < 0 {
		return h, fmt.Errorf("%w: unknown message identifier %#02x", ErrMalformed, uint8(h.MID))
	}
	if len(msg) < BSDHLen+x {
		return h, fmt.Errorf("%w: %v of %d octets, its header needs %d", ErrMalformed, h.MID, len(msg), BSDHLen+x)
	}
	return h, nil
}

// Hello: 76 octets after the BSDH, 92 in all (as ib_sdp sends it in the
// connection manager's private data); HelloAck 180 after it, 196 in all.
const (
	helloBodyLen    = 76
	helloAckBodyLen = 180
	HelloLen        = BSDHLen + helloBodyLen
	HelloAckLen     = BSDHLen + helloAckBodyLen
)

// Version is the protocol version we speak: major 2, minor 2, as ib_sdp.
const Version = 0x22

// Hello opens a connection: the BSDH's Bufs are the receives the active
// side posted.
type Hello struct {
	BSDH
	Version uint8
	// IPVersion is 4 or 6; Capabilities the low four bits after it.
	IPVersion, Capabilities uint8
	MaxAdverts              uint8
	// DesRemRcvSz is the receive buffer size asked of the passive side;
	// LocalRcvSz the active side's own.
	DesRemRcvSz, LocalRcvSz uint32
	LocalPort               uint16
	Src, Dst                netip.Addr
}

// Marshal encodes h, HelloLen octets.
func (h *Hello) Marshal() []byte {
	b := make([]byte, HelloLen)
	bh := h.BSDH
	bh.MID, bh.Len = MIDHello, HelloLen
	bh.Put(b)
	p := b[BSDHLen:]
	p[0] = h.Version
	p[1] = h.IPVersion<<4 | h.Capabilities&0x0f
	p[3] = h.MaxAdverts
	binary.BigEndian.PutUint32(p[4:], h.DesRemRcvSz)
	binary.BigEndian.PutUint32(p[8:], h.LocalRcvSz)
	binary.BigEndian.PutUint16(p[12:], h.LocalPort)
	putIP(p[16:32], h.Src)
	putIP(p[32:48], h.Dst)
	return b
}

// ParseHello decodes a Hello at the start of b (private data may be padded
// after it).
func ParseHello(b []byte) (Hello, error) {
	if len(b) < HelloLen {
		return Hello{}, fmt.Errorf("%w: Hello of %d octets, want %d", ErrMalformed, len(b), HelloLen)
	}
	bh, err := ParseBSDH(b[:HelloLen])
	if err != nil {
		return Hello{}, err
	}
	if bh.MID != MIDHello {
		return Hello{}, fmt.Errorf("%w: %v where a Hello belongs", ErrMalformed, bh.MID)
	}
	p := b[BSDHLen:HelloLen]
	h := Hello{BSDH: bh, Version: p[0], IPVersion: p[1] >> 4, Capabilities: p[1] & 0x0f, MaxAdverts: p[3],
		DesRemRcvSz: binary.BigEndian.Uint32(p[4:]), LocalRcvSz: binary.BigEndian.Uint32(p[8:]),
		LocalPort: binary.BigEndian.Uint16(p[12:])}
	h.Src, h.Dst = getIP(p[16:32], h.IPVersion), getIP(p[32:48], h.IPVersion)
	return h, nil
}

// HelloAck accepts a connection: the BSDH's Bufs are the receives the
// passive side posted, ActRcvSz the size of each.
type HelloAck struct {
	BSDH
	Version    uint8
	MaxAdverts uint8
	ActRcvSz   uint32
}

// Marshal encodes h, HelloAckLen octets.
func (h *HelloAck) Marshal() []byte {
	b := make([]byte, HelloAckLen)
	bh := h.BSDH
	bh.MID, bh.Len = MIDHelloAck, HelloAckLen
	bh.Put(b)
	p := b[BSDHLen:]
	p[0] = h.Version
	p[3] = h.MaxAdverts
	binary.BigEndian.PutUint32(p[4:], h.ActRcvSz)
	return b
}

// ParseHelloAck decodes a HelloAck at the start of b.
func ParseHelloAck(b []byte) (HelloAck, error) {
	if len(b) < HelloAckLen {
		return HelloAck{}, fmt.Errorf("%w: HelloAck of %d octets, want %d", ErrMalformed, len(b), HelloAckLen)
	}
	bh, err := ParseBSDH(b[:HelloAckLen])
	if err != nil {
		return HelloAck{}, err
	}
	if bh.MID != MIDHelloAck {
		return HelloAck{}, fmt.Errorf("%w: %v where a HelloAck belongs", ErrMalformed, bh.MID)
	}
	p := b[BSDHLen:HelloAckLen]
	return HelloAck{BSDH: bh, Version: p[0], MaxAdverts: p[3], ActRcvSz: binary.BigEndian.Uint32(p[4:])}, nil
}

// putIP writes an address as 16 octets, IPv4 in the last four.
func putIP(b []byte, a netip.Addr) {
	if !a.IsValid() {
		return
	}
	if a.Is4() {
		v4 := a.As4()
		copy(b[12:], v4[:])
		return
	}
	v6 := a.As16()
	copy(b, v6[:])
}

func getIP(b []byte, version uint8) netip.Addr {
	if version == 4 {
		return netip.AddrFrom4([4]byte(b[12:16]))
	}
	return netip.AddrFrom16([16]byte(b[:16]))
}

// SrcAvail's extra header: the source's buffer, for the sink to read.
type SrcAvail struct {
	Len  uint32
	STag uint32
	VA   uint64
}

// ParseSrcAvail decodes the extra header of a SrcAvail message.
func ParseSrcAvail(msg []byte) SrcAvail {
	p := msg[BSDHLen:]
	return SrcAvail{Len: binary.BigEndian.Uint32(p), STag: binary.BigEndian.Uint32(p[4:]), VA: binary.BigEndian.Uint64(p[8:])}
}

// Put writes the extra header into b[:16].
func (s SrcAvail) Put(b []byte) {
	binary.BigEndian.PutUint32(b, s.Len)
	binary.BigEndian.PutUint32(b[4:], s.STag)
	binary.BigEndian.PutUint64(b[8:], s.VA)
}

// SinkAvail's extra header: the sink's buffer, for the source to write.
type SinkAvail struct {
	Len, STag uint32
	VA        uint64
	NonDisc   uint32
}

// ParseSinkAvail decodes the extra header of a SinkAvail message.
func ParseSinkAvail(msg []byte) SinkAvail {
	p := msg[BSDHLen:]
	return SinkAvail{Len: binary.BigEndian.Uint32(p), STag: binary.BigEndian.Uint32(p[4:]),
		VA: binary.BigEndian.Uint64(p[8:]), NonDisc: binary.BigEndian.Uint32(p[16:])}
}

// ParseLen decodes the 4-octet extra header of RdmaWrCompl, RdmaRdCompl,
// ChRcvBuf and ChRcvBufAck.
func ParseLen(msg []byte) uint32 { return binary.BigEndian.Uint32(msg[BSDHLen:]) }
