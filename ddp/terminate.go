package ddp

import (
	"encoding/binary"
	"fmt"
)

// Layer is the layer a Terminate blames (RFC 5040 §4.8, Figure 9).
type Layer uint8

// Layers.
const (
	LayerRDMAP Layer = 0x0
	LayerDDP   Layer = 0x1
	LayerLLP   Layer = 0x2 // MPA, or the TCP below it
)

func (l Layer) String() string {
	switch l {
	case LayerRDMAP:
		return "RDMAP"
	case LayerDDP:
		return "DDP"
	case LayerLLP:
		return "LLP"
	}
	return fmt.Sprintf("layer(%#x)", uint8(l))
}

// TerminateError is the Layer, Error Type and Error Code that a Terminate
// message reports. Peer protocol errors travel as this value, never as a
// panic. The named values below cover every error RFC 5040 §4.8, RFC 5041
// §7.2, RFC 5044 §8 and RFC 6581 §8 define.
type TerminateError struct {
	Layer Layer
	Type  uint8 // 4 bits
	Code  uint8
}

// RDMAP errors (RFC 5040 §4.8).
var (
	RDMAPLocalCatastrophic       = TerminateError{LayerRDMAP, 0x0, 0x00}
	RDMAPInvalidSTag             = TerminateError{LayerRDMAP, 0x1, 0x00}
	RDMAPBaseOrBounds            = TerminateError{LayerRDMAP, 0x1, 0x01}
	RDMAPAccessRights            = TerminateError{LayerRDMAP, 0x1, 0x02}
	RDMAPSTagNotAssociated       = TerminateError{LayerRDMAP, 0x1, 0x03}
	RDMAPTOWrap                  = TerminateError{LayerRDMAP, 0x1, 0x04}
	RDMAPProtectionCannotInv     = TerminateError{LayerRDMAP, 0x1, 0x09}
	RDMAPProtectionUnspecified   = TerminateError{LayerRDMAP, 0x1, 0xff}
	RDMAPInvalidVersion          = TerminateError{LayerRDMAP, 0x2, 0x05}
	RDMAPUnexpectedOpcode        = TerminateError{LayerRDMAP, 0x2, 0x06}
	RDMAPCatastrophicLocalStream = TerminateError{LayerRDMAP, 0x2, 0x07}
	RDMAPCatastrophicGlobal      = TerminateError{LayerRDMAP, 0x2, 0x08}
	RDMAPOperationCannotInv      = TerminateError{LayerRDMAP, 0x2, 0x09}
	RDMAPOperationUnspecified    = TerminateError{LayerRDMAP, 0x2, 0xff}
)

// DDP errors (RFC 5041 §7.2).
var (
	DDPLocalCatastrophic  = TerminateError{LayerDDP, 0x0, 0x00}
	DDPTaggedInvalidSTag  = TerminateError{LayerDDP, 0x1, 0x00}
	DDPTaggedBaseOrBounds = TerminateError{LayerDDP, 0x1, 0x01}
	DDPTaggedNotAssoc     = TerminateError{LayerDDP, 0x1, 0x02}
	DDPTaggedTOWrap       = TerminateError{LayerDDP, 0x1, 0x03}
	DDPTaggedBadVersion   = TerminateError{LayerDDP, 0x1, 0x04}
	DDPUntaggedInvalidQN  = TerminateError{LayerDDP, 0x2, 0x01}
	DDPUntaggedNoBuffer   = TerminateError{LayerDDP, 0x2, 0x02}
	DDPUntaggedMSNRange   = TerminateError{LayerDDP, 0x2, 0x03}
	DDPUntaggedInvalidMO  = TerminateError{LayerDDP, 0x2, 0x04}
	DDPUntaggedTooLong    = TerminateError{LayerDDP, 0x2, 0x05}
	DDPUntaggedBadVersion = TerminateError{LayerDDP, 0x2, 0x06}
)

// LLP (MPA) errors: Layer LLP, Error Type 0 "MPA" (RFC 5044 §8, RFC 6581 §8).
var (
	LLPConnectionLost    = TerminateError{LayerLLP, 0x0, 0x01}
	LLPCRC               = TerminateError{LayerLLP, 0x0, 0x02}
	LLPMarker            = TerminateError{LayerLLP, 0x0, 0x03}
	LLPInvalidFrame      = TerminateError{LayerLLP, 0x0, 0x04}
	LLPLocalCatastrophic = TerminateError{LayerLLP, 0x0, 0x05}
	LLPInsufficientIRD   = TerminateError{LayerLLP, 0x0, 0x06}
	LLPNoMatchingRTR     = TerminateError{LayerLLP, 0x0, 0x07}
)

// TerminateErrors lists every named error, for tests and tools.
var TerminateErrors = []TerminateError{
	RDMAPLocalCatastrophic, RDMAPInvalidSTag, RDMAPBaseOrBounds, RDMAPAccessRights,
	RDMAPSTagNotAssociated, RDMAPTOWrap, RDMAPProtectionCannotInv, RDMAPProtectionUnspecified,
	RDMAPInvalidVersion, RDMAPUnexpectedOpcode, RDMAPCatastrophicLocalStream,
	RDMAPCatastrophicGlobal, RDMAPOperationCannotInv, RDMAPOperationUnspecified,
	DDPLocalCatastrophic, DDPTaggedInvalidSTag, DDPTaggedBaseOrBounds, DDPTaggedNotAssoc,
	DDPTaggedTOWrap, DDPTaggedBadVersion, DDPUntaggedInvalidQN, DDPUntaggedNoBuffer,
	DDPUntaggedMSNRange, DDPUntaggedInvalidMO, DDPUntaggedTooLong, DDPUntaggedBadVersion,
	LLPConnectionLost, LLPCRC, LLPMarker, LLPInvalidFrame, LLPLocalCatastrophic,
	LLPInsufficientIRD, LLPNoMatchingRTR,
}

var terminateNames = map[TerminateError]string{
	RDMAPLocalCatastrophic:       "RDMAP local catastrophic error",
	RDMAPInvalidSTag:             "RDMAP remote protection: invalid STag",
	RDMAPBaseOrBounds:            "RDMAP remote protection: base or bounds violation",
	RDMAPAccessRights:            "RDMAP remote protection: access rights violation",
	RDMAPSTagNotAssociated:       "RDMAP remote protection: STag not associated with RDMAP stream",
	RDMAPTOWrap:                  "RDMAP remote protection: TO wrap",
	RDMAPProtectionCannotInv:     "RDMAP remote protection: STag cannot be invalidated",
	RDMAPProtectionUnspecified:   "RDMAP remote protection: unspecified error",
	RDMAPInvalidVersion:          "RDMAP remote operation: invalid RDMAP version",
	RDMAPUnexpectedOpcode:        "RDMAP remote operation: unexpected opcode",
	RDMAPCatastrophicLocalStream: "RDMAP remote operation: catastrophic error, localized to RDMAP stream",
	RDMAPCatastrophicGlobal:      "RDMAP remote operation: catastrophic error, global",
	RDMAPOperationCannotInv:      "RDMAP remote operation: STag cannot be invalidated",
	RDMAPOperationUnspecified:    "RDMAP remote operation: unspecified error",
	DDPLocalCatastrophic:         "DDP local catastrophic error",
	DDPTaggedInvalidSTag:         "DDP tagged buffer: invalid STag",
	DDPTaggedBaseOrBounds:        "DDP tagged buffer: base or bounds violation",
	DDPTaggedNotAssoc:            "DDP tagged buffer: STag not associated with DDP stream",
	DDPTaggedTOWrap:              "DDP tagged buffer: TO wrap",
	DDPTaggedBadVersion:          "DDP tagged buffer: invalid DDP version",
	DDPUntaggedInvalidQN:         "DDP untagged buffer: invalid QN",
	DDPUntaggedNoBuffer:          "DDP untagged buffer: invalid MSN, no buffer available",
	DDPUntaggedMSNRange:          "DDP untagged buffer: invalid MSN, MSN range is not valid",
	DDPUntaggedInvalidMO:         "DDP untagged buffer: invalid MO",
	DDPUntaggedTooLong:           "DDP untagged buffer: DDP message too long for available buffer",
	DDPUntaggedBadVersion:        "DDP untagged buffer: invalid DDP version",
	LLPConnectionLost:            "MPA: TCP connection closed, terminated or lost",
	LLPCRC:                       "MPA: CRC error",
	LLPMarker:                    "MPA: marker and ULPDU length disagree",
	LLPInvalidFrame:              "MPA: invalid Request or Reply frame",
	LLPLocalCatastrophic:         "MPA: local catastrophic error",
	LLPInsufficientIRD:           "MPA: insufficient IRD resources",
	LLPNoMatchingRTR:             "MPA: no matching RTR option",
}

func (e TerminateError) Error() string {
	if n, ok := terminateNames[e]; ok {
		return n
	}
	if e.Layer == LayerRDMAP && e.Type == 0 {
		// RFC 5040 §4.8: any code is acceptable with a local catastrophic error.
		return fmt.Sprintf("RDMAP local catastrophic error (code %#02x)", e.Code)
	}
	return fmt.Sprintf("%v error type %#x code %#02x", e.Layer, e.Type, e.Code)
}

// Terminate body layout (RFC 5040 §4.8):
//
//	 0                   1                   2                   3
//	 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	| Layer | EType | Error Code    |M|D|R|      Reserved           |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|  DDP Segment Length (if D)    | Terminated DDP header (if D)  ~
//	~ Terminated RDMAP header (if R: a 28-byte Read Request body)   ~
//
// The M bit says the DDP Segment Length is valid. siw on x86 encodes this
// word in a different bit order (a bitfield bug); this follows the RFC and
// Wireshark.
const (
	TerminateControlLen = 4
	termFlagM           = 0x80
	termFlagD           = 0x40
	termFlagR           = 0x20
	termMaskReserved    = 0x1fff
	termSegLenLen       = 2
)

// Terminate is a view over the body of a Terminate message, after its
// untagged DDP header (QN 2).
type Terminate []byte

// TerminateFields describe a Terminate body. DDPHeader, when set, is the DDP
// header of the segment that failed (14 or 18 bytes, by its T bit) and is
// sent with the D bit; RDMAPHeader, when set, is the Read Request body that
// failed (28 bytes) and is sent with the R bit.
type TerminateFields struct {
	Error TerminateError
	// SegmentLenValid sets M: SegmentLen is the length of the failed DDP
	// segment as DDP received it.
	SegmentLenValid bool
	SegmentLen      uint16
	DDPHeader       []byte
	RDMAPHeader     []byte
}

// Len is the encoded size of the body.
func (f *TerminateFields) Len() int {
	n := TerminateControlLen
	if f.DDPHeader != nil {
		n += termSegLenLen + len(f.DDPHeader)
	}
	return n + len(f.RDMAPHeader)
}

// Encode writes the body and returns its length. The view must hold f.Len()
// bytes; the DDP header must be a whole tagged or untagged header and the
// RDMAP header a whole Read Request body, or Encode panics: those come from
// our own code, not from the peer.
func (t Terminate) Encode(f *TerminateFields) int {
	if f.DDPHeader != nil && (!Header(f.DDPHeader).IsValid() || len(f.DDPHeader) != Header(f.DDPHeader).Len()) {
		panic("ddp: Terminate with a malformed DDP header")
	}
	if f.RDMAPHeader != nil && len(f.RDMAPHeader) != ReadRequestLen {
		panic("ddp: Terminate with a malformed RDMAP header")
	}
	t[0] = byte(f.Error.Layer)<<4 | f.Error.Type&0x0f
	t[1] = f.Error.Code
	var flags byte
	if f.SegmentLenValid {
		flags |= termFlagM
	}
	if f.DDPHeader != nil {
		flags |= termFlagD
	}
	if f.RDMAPHeader != nil {
		flags |= termFlagR
	}
	t[2] = flags
	t[3] = 0
	n := TerminateControlLen
	if f.DDPHeader != nil {
		var segLen uint16
		if f.SegmentLenValid {
			segLen = f.SegmentLen
		}
		binary.BigEndian.PutUint16(t[n:], segLen)
		n += termSegLenLen
		n += copy(t[n:], f.DDPHeader)
	}
	n += copy(t[n:], f.RDMAPHeader)
	return n
}

// IsValid reports whether the view holds the control word and every header
// its D and R bits announce.
func (t Terminate) IsValid() bool {
	if len(t) < TerminateControlLen {
		return false
	}
	n := TerminateControlLen
	if t.HasDDPHeader() {
		if len(t) < n+termSegLenLen+ControlLen {
			return false
		}
		h := Header(t[n+termSegLenLen:])
		if !h.IsValid() {
			return false
		}
		n += termSegLenLen + h.Len()
	}
	if t.HasRDMAPHeader() {
		n += ReadRequestLen
	}
	return len(t) >= n
}

// Cause returns the layer, type and code.
func (t Terminate) Cause() TerminateError {
	return TerminateError{Layer: Layer(t[0] >> 4), Type: t[0] & 0x0f, Code: t[1]}
}

// SegmentLenValid reports the M bit.
func (t Terminate) SegmentLenValid() bool { return t[2]&termFlagM != 0 }

// HasDDPHeader reports the D bit.
func (t Terminate) HasDDPHeader() bool { return t[2]&termFlagD != 0 }

// HasRDMAPHeader reports the R bit.
func (t Terminate) HasRDMAPHeader() bool { return t[2]&termFlagR != 0 }

// Reserved returns the 13 reserved bits.
func (t Terminate) Reserved() uint16 { return binary.BigEndian.Uint16(t[2:]) & termMaskReserved }

// SegmentLen returns the DDP Segment Length; meaningful only with M and D.
func (t Terminate) SegmentLen() uint16 {
	if !t.HasDDPHeader() {
		return 0
	}
	return binary.BigEndian.Uint16(t[TerminateControlLen:])
}

// DDPHeader returns the terminated DDP header, or nil without the D bit.
func (t Terminate) DDPHeader() Header {
	if !t.HasDDPHeader() {
		return nil
	}
	h := Header(t[TerminateControlLen+termSegLenLen:])
	return h[:h.Len()]
}

// RDMAPHeader returns the terminated Read Request body, or nil without R.
func (t Terminate) RDMAPHeader() ReadRequest {
	if !t.HasRDMAPHeader() {
		return nil
	}
	n := TerminateControlLen
	if t.HasDDPHeader() {
		n += termSegLenLen + t.DDPHeader().Len()
	}
	return ReadRequest(t[n : n+ReadRequestLen])
}
