package shm

import (
	"testing"

	"github.com/softrnic/softrnic/ddp"
)

// The codes are ring ABI: their values never change. (The daemon's and the
// client's conversions to the engine's codes are tested where they live.)
func TestCodesABI(t *testing.T) {
	ops := []SQOp{SQSend, SQSendInvalidate, SQWrite, SQRead, SQFetchAdd, SQCmpSwap, SQLocalInvalidate, SQImmediate}
	if len(ops) != int(NumSQOps) {
		t.Fatalf("%d send ops listed, NumSQOps %d", len(ops), NumSQOps)
	}
	for i, o := range ops {
		if int(o) != i {
			t.Errorf("%v = %d, want %d", o, o, i)
		}
	}
	dtos := []DTOOpcode{DTOSend, DTOWrite, DTORead, DTOFetchAdd, DTOCmpSwap, DTOLocalInvalidate, DTOImmediate, DTORecv, DTORecvImmediate}
	if len(dtos) != int(NumDTOOpcodes) {
		t.Fatalf("%d DTO opcodes listed, NumDTOOpcodes %d", len(dtos), NumDTOOpcodes)
	}
	for i, o := range dtos {
		if int(o) != i {
			t.Errorf("%v = %d, want %d", o, o, i)
		}
	}
	if WRSignaled != 1 || WRSolicited != 2 || WRFence != 4 || WRFlagsValid != 7 || EVESolicited != 1 || EVEInvalidated != 2 {
		t.Errorf("flags moved: %#x %#x %#x %#x %#x %#x", WRSignaled, WRSolicited, WRFence, WRFlagsValid, EVESolicited, EVEInvalidated)
	}
	if got := PackCause(ddp.TerminateError{Layer: ddp.LayerDDP, Type: 0x2, Code: 0x03}); got != 0x01010203 {
		t.Errorf("packed cause %#x, want 0x01010203", got)
	}
	var sq [SQESize]byte
	(&SQE{Op: SQWrite, Flags: WRSignaled | WRFence}).Encode(sq[:])
	var ev [EVESize]byte
	(&EVE{Opcode: DTORecvImmediate, Flags: EVESolicited | EVEInvalidated}).Encode(ev[:])
	if sq[0] != 2 || sq[1] != 5 || ev[2] != 8 || ev[3] != 3 {
		t.Errorf("entry bytes: SQE op %d flags %d, EVE opcode %d flags %d", sq[0], sq[1], ev[2], ev[3])
	}
	if NumSQOps.String() != "op(8)" || SQCmpSwap.String() != "cmp-swap" || DTORecvImmediate.String() != "recv-immediate" {
		t.Errorf("names: %v %v %v", NumSQOps, SQCmpSwap, DTORecvImmediate)
	}
}

// Every cause survives the ring; no cause reads as none.
func TestCauseRoundTrip(t *testing.T) {
	if te, ok := UnpackCause(0); ok {
		t.Fatalf("zero unpacks to %v", te)
	}
	if te, ok := UnpackCause(0x00ffffff); ok {
		t.Fatalf("a cause without CauseValid unpacks to %v", te)
	}
	for layer := 0; layer < 16; layer++ {
		for typ := 0; typ < 256; typ++ {
			for code := 0; code < 256; code++ {
				te := ddp.TerminateError{Layer: ddp.Layer(layer), Type: uint8(typ), Code: uint8(code)}
				c := PackCause(te)
				if got, ok := UnpackCause(c); !ok || got != te {
					t.Fatalf("%v packed %#x unpacks to %v %v", te, c, got, ok)
				}
			}
		}
	}
	// Through an EVE and its bytes, too.
	te := ddp.RDMAPAccessRights
	var slot [EVESize]byte
	e := EVE{Kind: EventDTO, Cause: PackCause(te)}
	e.Encode(slot[:])
	if got, ok := UnpackCause(DecodeEVE(slot[:]).Cause); !ok || got != te {
		t.Fatalf("through the ring: %v %v", got, ok)
	}
}
