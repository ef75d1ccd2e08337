package shm

import "encoding/binary"

// Entry sizes.
const (
	SQESize = 128
	RQESize = 128
	EVESize = 64
	// RingSGE is the most SGEs a ring entry carries, send or receive
	// (four: what DAT consumers such as dapltest expect of an EP).
	RingSGE = 4
	RQSGE   = 4
)

var ne = binary.NativeEndian

// SGE is one local buffer: Length octets at Addr (the client's virtual
// address) of the region LKey.
type SGE struct {
	LKey   uint32
	Length uint32
	Addr   uint64
}

// SQE is a send-queue entry (op an SQOp, flags WRFlags):
//
//	0 op | 1 flags | 2 nsge | 4 invalidate STag | 8 id | 16 remote STag |
//	24 remote TO | 32 compare/add | 40 swap | 48 immediate[8] | 64 sge[4]
type SQE struct {
	Op             SQOp
	Flags          WRFlags
	NSGE           uint8
	InvalidateSTag uint32
	ID             uint64
	RemoteSTag     uint32
	RemoteTO       uint64
	Compare        uint64 // CmpSwap compare, FetchAdd addend
	Swap           uint64
	Immediate      [8]byte
	SGL            [RingSGE]SGE
}

// Encode writes e into a ring slot.
func (e *SQE) Encode(b []byte) {
	b[0], b[1], b[2], b[3] = uint8(e.Op), uint8(e.Flags), e.NSGE, 0
	ne.PutUint32(b[4:], e.InvalidateSTag)
	ne.PutUint64(b[8:], e.ID)
	ne.PutUint32(b[16:], e.RemoteSTag)
	ne.PutUint32(b[20:], 0)
	ne.PutUint64(b[24:], e.RemoteTO)
	ne.PutUint64(b[32:], e.Compare)
	ne.PutUint64(b[40:], e.Swap)
	copy(b[48:56], e.Immediate[:])
	for i, s := range e.SGL {
		putSGE(b[64+16*i:], s)
	}
}

// DecodeSQE copies a slot out of shared memory, then decodes it; the result
// still needs validating.
func DecodeSQE(slot []byte) SQE {
	var c [SQESize]byte
	copy(c[:], slot)
	e := SQE{Op: SQOp(c[0]), Flags: WRFlags(c[1]), NSGE: c[2],
		InvalidateSTag: ne.Uint32(c[4:]), ID: ne.Uint64(c[8:]), RemoteSTag: ne.Uint32(c[16:]),
		RemoteTO: ne.Uint64(c[24:]), Compare: ne.Uint64(c[32:]), Swap: ne.Uint64(c[40:])}
	copy(e.Immediate[:], c[48:56])
	for i := range e.SGL {
		e.SGL[i] = getSGE(c[64+16*i:])
	}
	return e
}

// RQE is a receive-queue entry: 0 id | 8 nsge | 16 sge[4] | 80 unused.
type RQE struct {
	ID   uint64
	NSGE uint8
	SGL  [RQSGE]SGE
}

// Encode writes e into a ring slot.
func (e *RQE) Encode(b []byte) {
	ne.PutUint64(b, e.ID)
	b[8] = e.NSGE
	for i, s := range e.SGL {
		putSGE(b[16+16*i:], s)
	}
}

// DecodeRQE copies and decodes a slot.
func DecodeRQE(slot []byte) RQE {
	var c [RQESize]byte
	copy(c[:], slot)
	e := RQE{ID: ne.Uint64(c[:]), NSGE: c[8]}
	for i := range e.SGL {
		e.SGL[i] = getSGE(c[16+16*i:])
	}
	return e
}

// Event kinds of an EVE.
const (
	EventDTO        = 1 // a work completion
	EventConnection = 2 // a connection event of an EP
	EventCR         = 3 // a connection request arrived
	EventOverflow   = 4 // the daemon could not deliver: the EVD overflowed
)

// EVE is an event entry (opcode a DTOOpcode, flags EVEFlags):
//
//	0 kind | 1 status | 2 opcode | 3 flags | 4 EP | 8 id | 16 byte length |
//	20 invalidated STag | 24 immediate[8] | 32 handle | 36 event |
//	40 terminate cause (PackCause)
type EVE struct {
	Kind        uint8
	Status      uint8
	Opcode      DTOOpcode
	Flags       EVEFlags
	EP          uint32
	ID          uint64
	ByteLen     uint32
	Invalidated uint32
	Immediate   [8]byte
	Handle      uint32
	Event       uint32
	Cause       uint32
}

// Encode writes e into a ring slot.
func (e *EVE) Encode(b []byte) {
	b[0], b[1], b[2], b[3] = e.Kind, e.Status, uint8(e.Opcode), uint8(e.Flags)
	ne.PutUint32(b[4:], e.EP)
	ne.PutUint64(b[8:], e.ID)
	ne.PutUint32(b[16:], e.ByteLen)
	ne.PutUint32(b[20:], e.Invalidated)
	copy(b[24:32], e.Immediate[:])
	ne.PutUint32(b[32:], e.Handle)
	ne.PutUint32(b[36:], e.Event)
	ne.PutUint32(b[40:], e.Cause)
}

// DecodeEVE copies and decodes a slot.
func DecodeEVE(slot []byte) EVE {
	var c [EVESize]byte
	copy(c[:], slot)
	e := EVE{Kind: c[0], Status: c[1], Opcode: DTOOpcode(c[2]), Flags: EVEFlags(c[3]), EP: ne.Uint32(c[4:]), ID: ne.Uint64(c[8:]),
		ByteLen: ne.Uint32(c[16:]), Invalidated: ne.Uint32(c[20:]), Handle: ne.Uint32(c[32:]),
		Event: ne.Uint32(c[36:]), Cause: ne.Uint32(c[40:])}
	copy(e.Immediate[:], c[24:32])
	return e
}

func putSGE(b []byte, s SGE) {
	ne.PutUint32(b, s.LKey)
	ne.PutUint32(b[4:], s.Length)
	ne.PutUint64(b[8:], s.Addr)
}

func getSGE(b []byte) SGE {
	return SGE{LKey: ne.Uint32(b), Length: ne.Uint32(b[4:]), Addr: ne.Uint64(b[8:])}
}
