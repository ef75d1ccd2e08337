package mpa

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/softrnic/softrnic/ddp"
)

// MPA Request and Reply frames (RFC 5044 §7.1.1, RFC 6581 §6):
//
//	Key (16 octets: "MPA ID Req Frame" or "MPA ID Rep Frame")
//	|M|C|R|S| Res |     Rev       |          PD_Length            |
//	Private Data (PD_Length octets, at most 512); with S set it begins
//	with the enhanced connection data:
//	|A|B|           IRD             |C|D|           ORD             |
const (
	KeyLen         = 16
	FrameHeaderLen = 20
	// MaxPrivateData bounds PD_Length, enhanced data included.
	MaxPrivateData = 512
	// EnhancedLen is the size of the RFC 6581 IRD/ORD words.
	EnhancedLen = 4
	// MaxIRDORD is the largest 14-bit IRD or ORD. As a value it means the
	// ULP negotiates IRD/ORD itself (RFC 6581 §9.1).
	MaxIRDORD = 0x3fff

	offFlags = 16
	offRev   = 17
	offPDLen = 18
)

// Keys of the startup frames.
var (
	KeyRequest = [KeyLen]byte([]byte("MPA ID Req Frame"))
	KeyReply   = [KeyLen]byte([]byte("MPA ID Rep Frame"))
)

// Flag bits of the frame.
const (
	flagMarkers  = 0x80 // M
	flagCRC      = 0x40 // C
	flagReject   = 0x20 // R
	flagEnhanced = 0x10 // S, RFC 6581 §6

	ctlPeerToPeer = 0x8000 // A, in the IRD word
	ctlRTRSend    = 0x4000 // B, in the IRD word
	ctlRTRWrite   = 0x8000 // C, in the ORD word
	ctlRTRRead    = 0x4000 // D, in the ORD word
)

// RTR is a set of ready-to-receive indications (RFC 6581 §9.2): the
// zero-length message a peer-to-peer initiator sends first.
type RTR uint8

// RTR indications.
const (
	RTRSend  RTR = 1 << iota // zero-length Send (B)
	RTRWrite                 // zero-length RDMA Write (C)
	RTRRead                  // zero-length RDMA Read (D)
)

func (r RTR) String() string {
	if r == 0 {
		return "none"
	}
	s := ""
	for _, x := range []struct {
		bit  RTR
		name string
	}{{RTRWrite, "write"}, {RTRRead, "read"}, {RTRSend, "send"}} {
		if r&x.bit != 0 {
			if s != "" {
				s += "|"
			}
			s += x.name
		}
	}
	return s
}

// Frame is a decoded MPA Request or Reply.
type Frame struct {
	Reply bool
	// Markers (M): the sender requires markers in what it receives.
	Markers bool
	// CRC (C): the sender wants CRC; CRC is used if either frame asks.
	CRC bool
	// Reject (R): in a Reply, the responder's ULP refused the connection.
	Reject   bool
	Revision uint8
	// Enhanced (S): the private data starts with the RFC 6581 words below.
	Enhanced   bool
	IRD, ORD   uint16
	PeerToPeer bool
	RTR        RTR
	// PrivateData is the ULP's private data, after the enhanced words.
	PrivateData []byte
}

// Frame errors. Each is an invalid startup frame (Terminate cause
// ddp.LLPInvalidFrame): the connection is closed (RFC 5044 §7.1.2).
var (
	// ErrShortFrame means more octets are needed; it is not fatal.
	ErrShortFrame = errors.New("mpa: incomplete startup frame")

	ErrBadKey          = frameError("bad key")
	ErrBadRevision     = frameError("unsupported revision")
	ErrPrivateData     = frameError("private data longer than 512 octets")
	ErrEnhancedMissing = frameError("S flag set but no room for IRD/ORD")
)

type frameErr struct{ reason string }

func frameError(reason string) error { return &frameErr{reason} }

func (e *frameErr) Error() string { return "mpa: invalid startup frame: " + e.reason }

// Unwrap gives the Terminate cause.
func (e *frameErr) Unwrap() error { return ddp.LLPInvalidFrame }

// Len is the encoded size of the frame.
func (f *Frame) Len() int {
	n := FrameHeaderLen + len(f.PrivateData)
	if f.Enhanced {
		n += EnhancedLen
	}
	return n
}

// Validate checks what Append would put on the wire.
func (f *Frame) Validate() error {
	if f.Revision < 1 || f.Revision > 2 {
		return fmt.Errorf("%w: %d", ErrBadRevision, f.Revision)
	}
	if f.Enhanced && f.Revision < 2 {
		return fmt.Errorf("mpa: enhanced connection setup needs revision 2 (RFC 6581 §6)")
	}
	if f.Len()-FrameHeaderLen > MaxPrivateData {
		return fmt.Errorf("%w: %d", ErrPrivateData, f.Len()-FrameHeaderLen)
	}
	if f.IRD > MaxIRDORD || f.ORD > MaxIRDORD {
		return fmt.Errorf("mpa: IRD %d / ORD %d exceed 14 bits", f.IRD, f.ORD)
	}
	return nil
}

// Append encodes the frame after dst.
func (f *Frame) Append(dst []byte) ([]byte, error) {
	if err := f.Validate(); err != nil {
		return dst, err
	}
	if f.Reply {
		dst = append(dst, KeyReply[:]...)
	} else {
		dst = append(dst, KeyRequest[:]...)
	}
	var flags byte
	if f.Markers {
		flags |= flagMarkers
	}
	if f.CRC {
		flags |= flagCRC
	}
	if f.Reject && f.Reply {
		flags |= flagReject
	}
	if f.Enhanced {
		flags |= flagEnhanced
	}
	dst = append(dst, flags, f.Revision)
	dst = binary.BigEndian.AppendUint16(dst, uint16(f.Len()-FrameHeaderLen))
	if f.Enhanced {
		ird, ord := f.IRD, f.ORD
		if f.PeerToPeer {
			ird |= ctlPeerToPeer
			// RFC 6581 §9.2: B, C and D only with A.
			if f.RTR&RTRSend != 0 {
				ird |= ctlRTRSend
			}
			if f.RTR&RTRWrite != 0 {
				ord |= ctlRTRWrite
			}
			if f.RTR&RTRRead != 0 {
				ord |= ctlRTRRead
			}
		}
		dst = binary.BigEndian.AppendUint16(dst, ird)
		dst = binary.BigEndian.AppendUint16(dst, ord)
	}
	return append(dst, f.PrivateData...), nil
}

// FrameLen returns the length of the frame at the start of b once its header
// has arrived, or ErrShortFrame.
func FrameLen(b []byte) (int, error) {
	if len(b) < FrameHeaderLen {
		return 0, ErrShortFrame
	}
	pd := int(binary.BigEndian.Uint16(b[offPDLen:]))
	if pd > MaxPrivateData {
		return 0, fmt.Errorf("%w: PD_Length %d", ErrPrivateData, pd)
	}
	return FrameHeaderLen + pd, nil
}

// ParseFrame decodes the Request (reply false) or Reply (reply true) at the
// start of b and returns it with its length. PrivateData aliases b. With too
// few octets it returns ErrShortFrame; other errors are fatal to the
// connection and wrap ddp.LLPInvalidFrame.
func ParseFrame(b []byte, reply bool) (Frame, int, error) {
	key := KeyRequest
	if reply {
		key = KeyReply
	}
	// The key first: a peer that does not speak MPA is told apart as soon
	// as its first 16 octets arrive, whatever the rest would mean.
	if len(b) >= KeyLen && [KeyLen]byte(b[:KeyLen]) != key {
		return Frame{}, 0, ErrBadKey
	}
	n, err := FrameLen(b)
	if err != nil {
		return Frame{}, 0, err
	}
	if len(b) < n {
		return Frame{}, 0, ErrShortFrame
	}
	flags := b[offFlags]
	f := Frame{
		Reply:    reply,
		Markers:  flags&flagMarkers != 0,
		CRC:      flags&flagCRC != 0,
		Reject:   reply && flags&flagReject != 0, // not checked in a Request
		Revision: b[offRev],
	}
	if f.Revision < 1 || f.Revision > 2 {
		return Frame{}, 0, fmt.Errorf("%w: %d", ErrBadRevision, f.Revision)
	}
	pd := b[FrameHeaderLen:n]
	// RFC 6581 §6: S only means something from revision 2 on.
	if flags&flagEnhanced != 0 && f.Revision >= 2 {
		if len(pd) < EnhancedLen {
			return Frame{}, 0, ErrEnhancedMissing
		}
		ird := binary.BigEndian.Uint16(pd)
		ord := binary.BigEndian.Uint16(pd[2:])
		f.Enhanced = true
		f.IRD = ird & MaxIRDORD
		f.ORD = ord & MaxIRDORD
		// §9.2: without A, B, C and D are ignored.
		if ird&ctlPeerToPeer != 0 {
			f.PeerToPeer = true
			if ird&ctlRTRSend != 0 {
				f.RTR |= RTRSend
			}
			if ord&ctlRTRWrite != 0 {
				f.RTR |= RTRWrite
			}
			if ord&ctlRTRRead != 0 {
				f.RTR |= RTRRead
			}
		}
		pd = pd[EnhancedLen:]
	}
	if len(pd) > 0 {
		f.PrivateData = pd
	}
	return f, n, nil
}
