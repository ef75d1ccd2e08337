package daemon

import (
	"errors"
	"fmt"
	"testing"

	"github.com/softrnic/softrnic/completion"
	"github.com/softrnic/softrnic/internal/shm"
	"github.com/softrnic/softrnic/qp"
)

// Every send-ring operation reaches the engine as the operation of the
// same name, every engine operation has a ring code, and codes past the
// last are refused: the ring's codes and qp's cannot drift apart unseen.
func TestSendOpsMatchQP(t *testing.T) {
	want := []struct {
		ring shm.SQOp
		qp   qp.SendOp
	}{
		{shm.SQSend, qp.OpSend},
		{shm.SQSendInvalidate, qp.OpSendInvalidate},
		{shm.SQWrite, qp.OpWrite},
		{shm.SQRead, qp.OpRead},
		{shm.SQFetchAdd, qp.OpFetchAdd},
		{shm.SQCmpSwap, qp.OpCmpSwap},
		{shm.SQLocalInvalidate, qp.OpLocalInvalidate},
		{shm.SQImmediate, qp.OpImmediate},
	}
	if len(want) != int(shm.NumSQOps) {
		t.Fatalf("%d pairs for %d ring operations", len(want), shm.NumSQOps)
	}
	var scratch [shm.RingSGE]qp.SGE
	seen := map[qp.SendOp]shm.SQOp{}
	for _, w := range want {
		wr, err := toSendWR(&shm.SQE{Op: w.ring}, scratch[:])
		if err != nil || wr.Op != w.qp || wr.Op.String() != w.ring.String() {
			t.Errorf("ring %v: engine %v, %v; want %v", w.ring, wr.Op, err, w.qp)
		}
		if o, dup := seen[wr.Op]; dup {
			t.Errorf("ring %v and %v both become %v", o, w.ring, wr.Op)
		}
		seen[wr.Op] = w.ring
	}
	// The engine's operations are the contiguous named ones: one past
	// the ring's last has no name in qp either.
	if s := qp.SendOp(shm.NumSQOps).String(); s != fmt.Sprintf("op(%d)", shm.NumSQOps) {
		t.Errorf("qp has operation %q that the send ring cannot carry", s)
	}
	for op := int(shm.NumSQOps); op < 256; op++ {
		if _, err := toSendWR(&shm.SQE{Op: shm.SQOp(op)}, scratch[:]); !errors.Is(err, qp.ErrInvalidWR) {
			t.Fatalf("op %d: %v", op, err)
		}
	}
}

// Each ring flag becomes the engine's flag, alone and together; any other
// bit is refused.
func TestWRFlagsMatchQP(t *testing.T) {
	want := map[shm.WRFlags]qp.Flags{shm.WRSignaled: qp.Signaled, shm.WRSolicited: qp.Solicited, shm.WRFence: qp.Fence}
	var scratch [shm.RingSGE]qp.SGE
	for f := 0; f < 256; f++ {
		rf := shm.WRFlags(f)
		wr, err := toSendWR(&shm.SQE{Flags: rf}, scratch[:])
		if rf&^shm.WRFlagsValid != 0 {
			if !errors.Is(err, qp.ErrInvalidWR) {
				t.Fatalf("flags %#x: %v", f, err)
			}
			continue
		}
		var q qp.Flags
		for r, e := range want {
			if rf&r != 0 {
				q |= e
			}
		}
		if err != nil || wr.Flags != q {
			t.Errorf("flags %#x: engine %#x, %v; want %#x", f, wr.Flags, err, q)
		}
	}
}

// Every completion opcode the engine makes reaches the event ring as the
// DTO opcode of the same name, and no two share one.
func TestDTOOpcodesMatchCompletion(t *testing.T) {
	n := 0
	seen := map[shm.DTOOpcode]completion.Opcode{}
	for o := completion.Opcode(0); o.String() != fmt.Sprintf("opcode(%d)", o); o++ {
		d := toDTOOpcode(o)
		if d >= shm.NumDTOOpcodes || d.String() != o.String() {
			t.Errorf("completion %v becomes ring %v", o, d)
		}
		if p, dup := seen[d]; dup {
			t.Errorf("completion %v and %v both become %v", p, o, d)
		}
		seen[d] = o
		n++
	}
	if n != int(shm.NumDTOOpcodes) {
		t.Errorf("the engine has %d completion opcodes, the ring %d", n, shm.NumDTOOpcodes)
	}
}
