package ddp

import "encoding/binary"

// ReadRequestLen is the size of the RDMA Read Request body that follows its
// untagged header on queue 1 (RFC 5040 §4.4).
const ReadRequestLen = 28

const (
	offSinkSTag = 0
	offSinkTO   = 4
	offReadSize = 12
	offSrcSTag  = 16
	offSrcTO    = 20
)

// ReadRequest is a view over the body of an RDMA Read Request:
//
//	Data Sink STag (32) | Data Sink Tagged Offset (64) |
//	RDMA Read Message Size (32) | Data Source STag (32) | Data Source Tagged Offset (64)
type ReadRequest []byte

// ReadRequestFields are the fields of a Read Request body.
type ReadRequestFields struct {
	SinkSTag uint32
	SinkTO   uint64
	Size     uint32
	SrcSTag  uint32
	SrcTO    uint64
}

// IsValid reports whether the view holds a whole body.
func (r ReadRequest) IsValid() bool { return len(r) >= ReadRequestLen }

// SinkSTag is the requester's buffer the Read Response writes into.
func (r ReadRequest) SinkSTag() uint32 { return binary.BigEndian.Uint32(r[offSinkSTag:]) }

// SinkTO is the tagged offset in the sink buffer.
func (r ReadRequest) SinkTO() uint64 { return binary.BigEndian.Uint64(r[offSinkTO:]) }

// Size is the number of bytes to read.
func (r ReadRequest) Size() uint32 { return binary.BigEndian.Uint32(r[offReadSize:]) }

// SrcSTag is the responder's buffer to read from.
func (r ReadRequest) SrcSTag() uint32 { return binary.BigEndian.Uint32(r[offSrcSTag:]) }

// SrcTO is the tagged offset in the source buffer.
func (r ReadRequest) SrcTO() uint64 { return binary.BigEndian.Uint64(r[offSrcTO:]) }

// Fields decodes the whole body.
func (r ReadRequest) Fields() ReadRequestFields {
	return ReadRequestFields{SinkSTag: r.SinkSTag(), SinkTO: r.SinkTO(), Size: r.Size(), SrcSTag: r.SrcSTag(), SrcTO: r.SrcTO()}
}

// Encode writes f into the first ReadRequestLen bytes.
func (r ReadRequest) Encode(f *ReadRequestFields) {
	binary.BigEndian.PutUint32(r[offSinkSTag:], f.SinkSTag)
	binary.BigEndian.PutUint64(r[offSinkTO:], f.SinkTO)
	binary.BigEndian.PutUint32(r[offReadSize:], f.Size)
	binary.BigEndian.PutUint32(r[offSrcSTag:], f.SrcSTag)
	binary.BigEndian.PutUint64(r[offSrcTO:], f.SrcTO)
}
