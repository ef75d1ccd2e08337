package ddp

import "encoding/binary"

// Sizes of the RFC 7306 bodies that follow the untagged DDP header.
const (
	AtomicRequestLen  = 52 // RFC 7306 §5.2.1
	AtomicResponseLen = 12 // RFC 7306 §5.2.2 (its figure; the prose's "32" is wrong)
	ImmediateDataLen  = 8  // RFC 7306 §6.2
)

// AtomicOp is the AOpCode of an Atomic Request (RFC 7306 §10.2).
type AtomicOp uint8

// Atomic operations. 0x1 is reserved.
const (
	AtomicFetchAdd AtomicOp = 0x0
	AtomicCmpSwap  AtomicOp = 0x2
)

func (a AtomicOp) String() string {
	switch a {
	case AtomicFetchAdd:
		return "FetchAdd"
	case AtomicCmpSwap:
		return "CmpSwap"
	}
	return "reserved atomic op"
}

const (
	offAOpCode     = 3
	maskAOpCode    = 0x0f
	offRequestID   = 4
	offRemoteSTag  = 8
	offRemoteTO    = 12
	offAddSwapData = 20
	offAddSwapMask = 28
	offCompareData = 36
	offCompareMask = 44

	offOrigRequestID = 0
	offOrigValue     = 4
)

// AtomicRequest is a view over the body of an Atomic Request (queue 1):
//
//	Reserved (28) | AOpCode (4) | Request Identifier (32) | Remote STag (32) |
//	Remote Tagged Offset (64) | Add or Swap Data (64) | Add or Swap Mask (64) |
//	Compare Data (64) | Compare Mask (64)
type AtomicRequest []byte

// AtomicRequestFields are the fields of an Atomic Request body. For FetchAdd
// the sender puts 0 in CompareData and all ones in CompareMask (§5.2.1).
type AtomicRequestFields struct {
	Op          AtomicOp
	RequestID   uint32
	RemoteSTag  uint32
	RemoteTO    uint64
	AddSwapData uint64
	AddSwapMask uint64
	CompareData uint64
	CompareMask uint64
}

// IsValid reports whether the view holds a whole body.
func (a AtomicRequest) IsValid() bool { return len(a) >= AtomicRequestLen }

// Op returns the AOpCode.
func (a AtomicRequest) Op() AtomicOp { return AtomicOp(a[offAOpCode] & maskAOpCode) }

// Reserved returns the 28 reserved bits before the AOpCode.
func (a AtomicRequest) Reserved() uint32 {
	return binary.BigEndian.Uint32(a) >> 4
}

// Fields decodes the whole body.
func (a AtomicRequest) Fields() AtomicRequestFields {
	be := binary.BigEndian
	return AtomicRequestFields{
		Op:          a.Op(),
		RequestID:   be.Uint32(a[offRequestID:]),
		RemoteSTag:  be.Uint32(a[offRemoteSTag:]),
		RemoteTO:    be.Uint64(a[offRemoteTO:]),
		AddSwapData: be.Uint64(a[offAddSwapData:]),
		AddSwapMask: be.Uint64(a[offAddSwapMask:]),
		CompareData: be.Uint64(a[offCompareData:]),
		CompareMask: be.Uint64(a[offCompareMask:]),
	}
}

// Encode writes f into the first AtomicRequestLen bytes.
func (a AtomicRequest) Encode(f *AtomicRequestFields) {
	be := binary.BigEndian
	be.PutUint32(a, uint32(f.Op&maskAOpCode))
	be.PutUint32(a[offRequestID:], f.RequestID)
	be.PutUint32(a[offRemoteSTag:], f.RemoteSTag)
	be.PutUint64(a[offRemoteTO:], f.RemoteTO)
	be.PutUint64(a[offAddSwapData:], f.AddSwapData)
	be.PutUint64(a[offAddSwapMask:], f.AddSwapMask)
	be.PutUint64(a[offCompareData:], f.CompareData)
	be.PutUint64(a[offCompareMask:], f.CompareMask)
}

// AtomicResponse is a view over the body of an Atomic Response (queue 3):
// Original Request Identifier (32) | Original Remote Data Value (64).
type AtomicResponse []byte

// IsValid reports whether the view holds a whole body.
func (a AtomicResponse) IsValid() bool { return len(a) >= AtomicResponseLen }

// RequestID echoes the Request Identifier of the request answered.
func (a AtomicResponse) RequestID() uint32 { return binary.BigEndian.Uint32(a[offOrigRequestID:]) }

// Value is the target's value before the operation.
func (a AtomicResponse) Value() uint64 { return binary.BigEndian.Uint64(a[offOrigValue:]) }

// Encode writes the body.
func (a AtomicResponse) Encode(requestID uint32, value uint64) {
	binary.BigEndian.PutUint32(a[offOrigRequestID:], requestID)
	binary.BigEndian.PutUint64(a[offOrigValue:], value)
}

// ImmediateData is a view over the 8-byte body of an Immediate Data message
// (RFC 7306 §6.2). The bytes are the consumer's, carried as they are.
type ImmediateData []byte

// IsValid reports whether the view holds a whole body.
func (d ImmediateData) IsValid() bool { return len(d) >= ImmediateDataLen }

// Data returns the eight bytes.
func (d ImmediateData) Data() [ImmediateDataLen]byte {
	return [ImmediateDataLen]byte(d[:ImmediateDataLen])
}
