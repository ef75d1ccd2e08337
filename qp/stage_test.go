package qp

import (
	"errors"
	"testing"

	"github.com/softrnic/softrnic/completion"
	"github.com/softrnic/softrnic/ddp"
)

// countingMem counts the copies into the process.
type countingMem struct {
	ProcessMemory
	writes int
	fail   error // WriteAt fails with it when set
}

func (c *countingMem) WriteAt(src []byte, addr uint64) error {
	c.writes++
	if c.fail != nil {
		return c.fail
	}
	return c.ProcessMemory.WriteAt(src, addr)
}

// A 64 KiB Write and a 64 KiB Send into process memory, in FPDUs of a
// segment each, reach the process in a copy each (not one per FPDU), in
// place, before the Send's completion.
func TestProcessPlacementGathered(t *testing.T) {
	pm := &countingMem{ProcessMemory: procSelf(t)}
	a, b := newPair(t, pairOpts{crc: true, emss: 1460})
	hostA := make([]byte, 3<<16)
	fill(hostA, 21)
	src := a.mem.regProc(t, pdA, procSelf(t), hostA, 0)
	hostT := make([]byte, 2<<16)
	target := b.mem.regProc(t, pdB, pm, hostT, LocalWrite|RemoteWrite)
	must(t, b.q.PostRecv(&RecvWR{ID: 7, SGL: []SGE{{LKey: target.STag, Addr: target.Base + 1<<16, Length: 1 << 16}}}))
	must(t, a.q.PostSend(&SendWR{ID: 1, Op: OpWrite, SGL: []SGE{{LKey: src.STag, Addr: src.Base, Length: 1 << 16}},
		RemoteSTag: target.STag, RemoteTO: target.Base}))
	must(t, a.q.PostSend(&SendWR{ID: 2, Op: OpSend, Flags: Signaled, SGL: []SGE{{LKey: src.STag, Addr: src.Base + 1<<16, Length: 1 << 16}}}))
	newLink(a, b, 1460).pump()
	rc := poll(b.rcq)
	if len(rc) != 1 || rc[0].ID != 7 || rc[0].Status != completion.Success || rc[0].ByteLen != 1<<16 {
		t.Fatalf("recv completions %+v", rc)
	}
	mustEqual(t, "written", hostT[:1<<16], hostA[:1<<16])
	mustEqual(t, "sent", hostT[1<<16:], hostA[1<<16:2<<16])
	// 64 KiB a copy: one for the Write, one for the Send.
	if pm.writes != 2 {
		t.Fatalf("%d copies into the process for a 64 KiB Write and a 64 KiB Send, want 2", pm.writes)
	}
}

// A copy that fails when the message ends fails it as a placement did:
// the receive completes with a local protection error and the QP sends a
// Terminate; and a connection that ends in the middle of a message lets
// its region go (the stage held it).
func TestProcessPlacementGatheredFails(t *testing.T) {
	t.Run("copy fails", func(t *testing.T) {
		pm := &countingMem{ProcessMemory: procSelf(t), fail: errors.New("gone")}
		a, b := newPair(t, pairOpts{crc: true, emss: 1460})
		hostT := make([]byte, 1<<16)
		target := b.mem.regProc(t, pdB, pm, hostT, LocalWrite|RemoteWrite)
		must(t, b.q.PostRecv(&RecvWR{ID: 7, SGL: []SGE{{LKey: target.STag, Addr: target.Base, Length: 1 << 16}}}))
		must(t, a.q.PostSend(&SendWR{ID: 2, Op: OpSend, Flags: Signaled | Inline, InlineData: make([]byte, 100)}))
		newLink(a, b, 1460).pump()
		rc := poll(b.rcq)
		if len(rc) == 0 || rc[0].ID != 7 || rc[0].Status != completion.LocalProtectionError {
			t.Fatalf("recv completions %+v, want 7 with a local protection error", rc)
		}
		if b.q.State() == RTS {
			t.Fatal("the QP goes on after a placement failed")
		}
	})
	t.Run("ends mid-message", func(t *testing.T) {
		pm := &countingMem{ProcessMemory: procSelf(t)}
		a, b := newPair(t, pairOpts{crc: true, emss: 1460})
		hostA := make([]byte, 1<<16)
		src := a.mem.regProc(t, pdA, procSelf(t), hostA, 0)
		hostT := make([]byte, 1<<16)
		target := b.mem.regProc(t, pdB, pm, hostT, LocalWrite|RemoteWrite)
		must(t, a.q.PostSend(&SendWR{ID: 1, Op: OpWrite, SGL: []SGE{{LKey: src.STag, Addr: src.Base, Length: 1 << 16}},
			RemoteSTag: target.STag, RemoteTO: target.Base}))
		buf := make([]byte, 256<<10)
		n := a.q.Transmit(buf)
		b.q.Receive(buf[:n/2])
		if err := target.Deregister(); !errors.Is(err, ErrBusy) {
			t.Fatalf("deregister in the middle of the Write: %v, want ErrBusy", err)
		}
		b.q.LLPClosed(errors.New("reset"))
		if err := target.Deregister(); err != nil {
			t.Fatalf("deregister after the connection ended mid-message: %v", err)
		}
		if pm.writes != 0 {
			t.Fatalf("%d copies of a Write that never ended, want 0", pm.writes)
		}
	})
}

// Gathered octets of a message whose copy fails when another message
// ends (a hostile peer's non-Last Write segment, then a Send) fail as that
// message's: the Write has no request, so the Send's receive is not
// completed with a protection error of the Write's memory; the QP
// terminates. (Taken from the current segment, the failure completed the
// Send's receive, and the RTR's empty Read Response, which has no request
// in the ORQ, would have dereferenced an empty slot.)
func TestProcessPlacementFailureIsTheMessages(t *testing.T) {
	h := newHostile(t, 1)
	pm := &countingMem{ProcessMemory: procSelf(t), fail: errors.New("gone")}
	hostT := make([]byte, 4096)
	target := h.b.mem.regProc(t, pdB, pm, hostT, LocalWrite|RemoteWrite)
	w := make([]byte, ddp.TaggedHeaderLen, ddp.TaggedHeaderLen+100)
	ddp.Tagged(w).Encode(&ddp.TaggedFields{Last: false, Opcode: ddp.OpWrite, STag: target.STag, TO: target.Base})
	w = append(w, make([]byte, 100)...)
	h.send(w, untaggedSeg(ddp.OpSend, 0, 1, 0, true, []byte("hello")))
	if got := h.terminate().Cause(); got != ddp.DDPLocalCatastrophic {
		t.Fatalf("Terminate %v, want DDP local catastrophic error", got)
	}
	for _, c := range poll(h.b.rcq) {
		if c.Status == completion.LocalProtectionError {
			t.Fatalf("the Send's receive failed for the Write's memory: %+v", c)
		}
	}
	if pm.writes != 1 {
		t.Fatalf("%d copies, want the one that failed", pm.writes)
	}
}
