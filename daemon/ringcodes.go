package daemon

import (
	"github.com/softrnic/softrnic/completion"
	"github.com/softrnic/softrnic/internal/shm"
	"github.com/softrnic/softrnic/qp"
)

// The rings carry shm's codes, the engine takes qp's and makes
// completion's: the conversions between them are these tables, written out
// rather than assumed equal (ringcodes_test.go holds them to the names).

// sendOps maps a send-ring operation to the engine's; toSendWR checks the
// index (shm.NumSQOps) first.
var sendOps = [shm.NumSQOps]qp.SendOp{
	shm.SQSend:            qp.OpSend,
	shm.SQSendInvalidate:  qp.OpSendInvalidate,
	shm.SQWrite:           qp.OpWrite,
	shm.SQRead:            qp.OpRead,
	shm.SQFetchAdd:        qp.OpFetchAdd,
	shm.SQCmpSwap:         qp.OpCmpSwap,
	shm.SQLocalInvalidate: qp.OpLocalInvalidate,
	shm.SQImmediate:       qp.OpImmediate,
}

// wrFlags maps each work-request flag a client may set to the engine's;
// toSendWR refuses the others (qp.Inline is not the client's to ask).
var wrFlags = [...]struct {
	ring shm.WRFlags
	qp   qp.Flags
}{
	{shm.WRSignaled, qp.Signaled},
	{shm.WRSolicited, qp.Solicited},
	{shm.WRFence, qp.Fence},
}

// toQPFlags converts validated ring flags (within shm.WRFlagsValid).
func toQPFlags(f shm.WRFlags) qp.Flags {
	var out qp.Flags
	for _, m := range wrFlags {
		if f&m.ring != 0 {
			out |= m.qp
		}
	}
	return out
}

// dtoOpcodes maps the engine's completion opcodes to the event ring's.
var dtoOpcodes = [...]shm.DTOOpcode{
	completion.OpSend:            shm.DTOSend,
	completion.OpWrite:           shm.DTOWrite,
	completion.OpRead:            shm.DTORead,
	completion.OpFetchAdd:        shm.DTOFetchAdd,
	completion.OpCmpSwap:         shm.DTOCmpSwap,
	completion.OpLocalInvalidate: shm.DTOLocalInvalidate,
	completion.OpImmediate:       shm.DTOImmediate,
	completion.OpRecv:            shm.DTORecv,
	completion.OpRecvImmediate:   shm.DTORecvImmediate,
}

// toDTOOpcode converts a completion's opcode for the event ring. The engine
// makes only the opcodes in the table (the test holds it to that); one
// outside it goes through as its number, which the client shows as such.
func toDTOOpcode(o completion.Opcode) shm.DTOOpcode {
	if int(o) < len(dtoOpcodes) {
		return dtoOpcodes[o]
	}
	return shm.DTOOpcode(o)
}
