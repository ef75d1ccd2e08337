package daemon

import (
	"testing"

	"github.com/softrnic/softrnic/completion"
	"github.com/softrnic/softrnic/internal/shm"
)

// A pump forwards every completion waiting, not one batch of them: a
// receive goroutine that made hundreds at once (a burst of small Sends)
// leaves none in the CQ, where nothing would come back for them.
func TestPumpForwardsMoreThanABatch(t *testing.T) {
	const n = 5*batch + 3
	s, e := newTestEVD(t, 1024, 1024, nil)
	for i := range n {
		must(t, e.cq.Push(completion.Completion{ID: uint64(i), Opcode: completion.OpRecv}))
	}
	e.pump(s)
	if left := e.cq.Len(); left != 0 {
		t.Fatalf("%d of %d completions left in the CQ", left, n)
	}
	client := clientView(t, s, e.ring, e.off, shm.EVESize)
	for i := range n {
		slot, err := client.Peek()
		if err != nil || slot == nil {
			t.Fatalf("event %d missing: %v", i, err)
		}
		if eve := shm.DecodeEVE(slot); eve.ID != uint64(i) {
			t.Fatalf("event %d has ID %d", i, eve.ID)
		}
		client.Release()
	}
}

// A receive the QP refuses when its receive goroutine takes the ring
// (BeforeReceive) goes to the session, which reports it and gives the
// rings back: the EP is not left handed over with nobody to see to it.
func TestRefusedQueuedReceiveIsReported(t *testing.T) {
	rt := newRingTest(t)
	slot, err := rt.rq.Reserve()
	if err != nil || slot == nil {
		t.Fatalf("receive ring: %v", err)
	}
	(&shm.RQE{ID: 5, NSGE: shm.RQSGE + 1}).Encode(slot) // more SGEs than an entry holds
	rt.rq.Commit()
	rt.s.takeQueuedRecvs(rt.e, false)
	if !rt.e.handOff.Load() {
		t.Fatal("a refused receive was not handed to the session")
	}
	rt.s.step()
	if rt.e.handOff.Load() || !drained(rt.e.rq) {
		t.Fatal("the session did not see to the handed-over ring")
	}
	events := rt.events
	slot, err = events.Peek()
	if err != nil || slot == nil {
		t.Fatalf("no event for the refused receive: %v", err)
	}
	if eve := shm.DecodeEVE(slot); eve.ID != 5 || eve.Opcode != shm.DTORecv {
		t.Fatalf("event %+v", eve)
	}
}
