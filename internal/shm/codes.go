package shm

import (
	"fmt"

	"github.com/softrnic/softrnic/ddp"
)

// The codes that ring entries carry. They are the ring ABI's own, defined
// here once: the daemon converts them to and from its engine's (qp,
// completion) explicitly, and validates what a client wrote; a client
// writes and reads only these.

// SQOp is the operation of a send-queue entry (SQE.Op).
type SQOp uint8

// Send-queue operations.
const (
	SQSend            SQOp = 0
	SQSendInvalidate  SQOp = 1 // a Send that invalidates SQE.InvalidateSTag at the peer
	SQWrite           SQOp = 2
	SQRead            SQOp = 3 // into SGL[0] only
	SQFetchAdd        SQOp = 4 // adds SQE.Compare; the original lands in SGL[0]
	SQCmpSwap         SQOp = 5 // SQE.Compare, SQE.Swap; the original lands in SGL[0]
	SQLocalInvalidate SQOp = 6
	SQImmediate       SQOp = 7 // RFC 7306 Immediate Data (SQE.Immediate)
	// NumSQOps is one past the last operation: an SQE whose op is not
	// below it is invalid.
	NumSQOps SQOp = 8
)

var sqOpNames = [NumSQOps]string{"send", "send-invalidate", "write", "read", "fetch-add", "cmp-swap", "local-invalidate", "immediate"}

func (o SQOp) String() string {
	if o < NumSQOps {
		return sqOpNames[o]
	}
	return fmt.Sprintf("op(%d)", uint8(o))
}

// WRFlags are the flags of a send-queue entry (SQE.Flags).
type WRFlags uint8

// Work-request flags.
const (
	// WRSignaled asks for a completion on success (failures always
	// complete).
	WRSignaled WRFlags = 1
	// WRSolicited sets the solicited-event bit of a Send.
	WRSolicited WRFlags = 2
	// WRFence makes the request wait for earlier Reads and atomics.
	WRFence WRFlags = 4
	// WRFlagsValid are the defined flags: an SQE with any other bit set
	// is invalid.
	WRFlagsValid = WRSignaled | WRSolicited | WRFence
)

// DTOOpcode says what a DTO event (EventDTO) completed (EVE.Opcode).
type DTOOpcode uint8

// DTO opcodes.
const (
	DTOSend            DTOOpcode = 0 // a Send, with or without invalidate
	DTOWrite           DTOOpcode = 1
	DTORead            DTOOpcode = 2
	DTOFetchAdd        DTOOpcode = 3
	DTOCmpSwap         DTOOpcode = 4
	DTOLocalInvalidate DTOOpcode = 5
	DTOImmediate       DTOOpcode = 6 // an Immediate Data message sent
	DTORecv            DTOOpcode = 7
	DTORecvImmediate   DTOOpcode = 8 // an Immediate Data message received
	// NumDTOOpcodes is one past the last opcode.
	NumDTOOpcodes DTOOpcode = 9
)

var dtoOpcodeNames = [NumDTOOpcodes]string{"send", "write", "read", "fetch-add", "cmp-swap", "local-invalidate", "immediate", "recv", "recv-immediate"}

func (o DTOOpcode) String() string {
	if o < NumDTOOpcodes {
		return dtoOpcodeNames[o]
	}
	return fmt.Sprintf("opcode(%d)", uint8(o))
}

// EVEFlags are the flags of a DTO event (EVE.Flags).
type EVEFlags uint8

// EVE flags.
const (
	// EVESolicited: the received message asked for a solicited event.
	EVESolicited EVEFlags = 1
	// EVEInvalidated: the message invalidated EVE.Invalidated.
	EVEInvalidated EVEFlags = 2
)

// CauseValid marks an EVE.Cause that carries a Terminate cause; without it
// the cause is unknown (zero).
const CauseValid = 1 << 24

// PackCause is the EVE.Cause of a Terminate cause:
// valid<<24 | layer<<16 | type<<8 | code.
func PackCause(te ddp.TerminateError) uint32 {
	return CauseValid | uint32(te.Layer)<<16 | uint32(te.Type)<<8 | uint32(te.Code)
}

// UnpackCause is PackCause's inverse; ok is false if c carries no cause.
func UnpackCause(c uint32) (te ddp.TerminateError, ok bool) {
	if c&CauseValid == 0 {
		return ddp.TerminateError{}, false
	}
	return ddp.TerminateError{Layer: ddp.Layer(c >> 16), Type: uint8(c >> 8), Code: uint8(c)}, true
}
