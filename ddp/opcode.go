package ddp

import "fmt"

// Opcode is the 4-bit RDMAP opcode (RFC 5040 §4.2, RFC 7306 §10.1).
type Opcode uint8

// RDMAP opcodes.
const (
	OpWrite            Opcode = 0x0
	OpReadRequest      Opcode = 0x1
	OpReadResponse     Opcode = 0x2
	OpSend             Opcode = 0x3
	OpSendInvalidate   Opcode = 0x4
	OpSendSE           Opcode = 0x5
	OpSendSEInvalidate Opcode = 0x6
	OpTerminate        Opcode = 0x7
	// RFC 7306 §10.1.
	OpImmediateData   Opcode = 0x8
	OpImmediateDataSE Opcode = 0x9
	OpAtomicRequest   Opcode = 0xa
	OpAtomicResponse  Opcode = 0xb
)

// Untagged queue numbers that RDMAP uses (RFC 5040 §5.1, RFC 7306 §4.1).
const (
	QNSend           = 0 // Send variants and Immediate Data
	QNReadRequest    = 1 // RDMA Read Request and Atomic Request
	QNTerminate      = 2
	QNAtomicResponse = 3
)

// OpcodeInfo is what the wire format fixes for one opcode.
type OpcodeInfo struct {
	Name string
	// Tagged: the message goes in tagged DDP segments; otherwise untagged on QN.
	Tagged bool
	QN     uint32
	// BodyLen is the fixed RDMAP body after the DDP header (Read Request,
	// atomics, immediate data); 0 for messages that carry ULP payload or,
	// for Terminate, a variable body.
	BodyLen int
	// Payload: the message carries ULP payload after the headers.
	Payload bool
	// Solicited: the message requests a solicited event.
	Solicited bool
	// Invalidate: the untagged header carries an STag to invalidate.
	Invalidate bool
	// Defined: the opcode exists; the others are reserved and a receiver
	// answers them with RDMAP remote operation error "unexpected opcode".
	Defined bool
}

// HeaderLen is the DDP header length of the opcode's segments.
func (i *OpcodeInfo) HeaderLen() int {
	if i.Tagged {
		return TaggedHeaderLen
	}
	return UntaggedHeaderLen
}

// Opcodes is the table indexed by opcode. The queue pair engine keeps its
// receive handlers in a table of the same shape.
var Opcodes = [16]OpcodeInfo{
	OpWrite:            {Name: "RDMA Write", Tagged: true, Payload: true, Defined: true},
	OpReadRequest:      {Name: "RDMA Read Request", QN: QNReadRequest, BodyLen: ReadRequestLen, Defined: true},
	OpReadResponse:     {Name: "RDMA Read Response", Tagged: true, Payload: true, Defined: true},
	OpSend:             {Name: "Send", QN: QNSend, Payload: true, Defined: true},
	OpSendInvalidate:   {Name: "Send with Invalidate", QN: QNSend, Payload: true, Invalidate: true, Defined: true},
	OpSendSE:           {Name: "Send with Solicited Event", QN: QNSend, Payload: true, Solicited: true, Defined: true},
	OpSendSEInvalidate: {Name: "Send with Solicited Event and Invalidate", QN: QNSend, Payload: true, Solicited: true, Invalidate: true, Defined: true},
	OpTerminate:        {Name: "Terminate", QN: QNTerminate, Defined: true},
	OpImmediateData:    {Name: "Immediate Data", QN: QNSend, BodyLen: ImmediateDataLen, Defined: true},
	OpImmediateDataSE:  {Name: "Immediate Data with Solicited Event", QN: QNSend, BodyLen: ImmediateDataLen, Solicited: true, Defined: true},
	OpAtomicRequest:    {Name: "Atomic Request", QN: QNReadRequest, BodyLen: AtomicRequestLen, Defined: true},
	OpAtomicResponse:   {Name: "Atomic Response", QN: QNAtomicResponse, BodyLen: AtomicResponseLen, Defined: true},
	0xc:                {Name: "reserved opcode 0xc"},
	0xd:                {Name: "reserved opcode 0xd"},
	0xe:                {Name: "reserved opcode 0xe"},
	0xf:                {Name: "experimental opcode 0xf"}, // RFC 6580
}

// Info returns the table entry of the opcode.
func (o Opcode) Info() *OpcodeInfo { return &Opcodes[o&maskOpcode] }

func (o Opcode) String() string {
	if o > maskOpcode {
		return fmt.Sprintf("opcode(%d)", uint8(o))
	}
	return Opcodes[o].Name
}
