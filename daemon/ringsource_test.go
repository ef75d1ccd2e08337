package daemon

import (
	"errors"
	"testing"

	"github.com/softrnic/softrnic/completion"
	"github.com/softrnic/softrnic/internal/shm"
	"github.com/softrnic/softrnic/rnic"
	"github.com/softrnic/softrnic/xdpnet"
)

// ringTest is a session with one EP whose rings are a poller's source
// (the source is driven by hand here), an EVD for its events, and the
// client's producer views of the rings.
type ringTest struct {
	s      *session
	e      *ep
	ev     *evd
	src    *ringSource
	sq, rq *shm.Ring // the client's side
}

func newRingTest(t *testing.T) *ringTest {
	t.Helper()
	dev := rnic.Open()
	t.Cleanup(func() { dev.Close() })
	pd, err := dev.AllocPD()
	must(t, err)
	cq, err := dev.CreateCQ(64, 0)
	must(t, err)
	q, err := dev.CreateQP(pd, rnic.QPAttr{SQDepth: 8, RQDepth: 8, SendCQ: cq, RecvCQ: cq})
	must(t, err)
	sqSize := shm.RingSize(8, shm.SQESize)
	mem, err := shm.NewMemfd("ring-test", sqSize+shm.RingSize(8, shm.RQESize))
	must(t, err)
	t.Cleanup(func() { mem.Close() })
	evMem, err := shm.NewMemfd("evd-test", shm.RingSize(16, shm.EVESize))
	must(t, err)
	t.Cleanup(func() { evMem.Close() })
	rt := &ringTest{s: &session{objects: map[uint32]any{}, wake: make(chan struct{}, 1)}}
	rt.ev = &evd{mem: evMem}
	rt.ev.ring, _ = shm.NewRing(evMem.Mem, 16, shm.EVESize)
	rt.e = &ep{qp: q, recv: rt.ev, req: rt.ev}
	rt.e.sq, _ = shm.NewRing(mem.Mem[:sqSize], 8, shm.SQESize)
	rt.e.rq, _ = shm.NewRing(mem.Mem[sqSize:], 8, shm.RQESize)
	rt.sq, _ = shm.NewRing(mem.Mem[:sqSize], 8, shm.SQESize)
	rt.rq, _ = shm.NewRing(mem.Mem[sqSize:], 8, shm.RQESize)
	rt.src = &ringSource{s: rt.s, e: rt.e, pl: &fakePoller{}}
	rt.e.src = rt.src
	var err2 error
	rt.e.h, err = rt.s.add(rt.e)
	rt.ev.h, err2 = rt.s.add(rt.ev)
	must(t, errors.Join(err, err2))
	return rt
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func (rt *ringTest) postRecv(t *testing.T, id uint64) {
	slot, err := rt.rq.Reserve()
	if err != nil || slot == nil {
		t.Fatalf("receive ring: %v", err)
	}
	(&shm.RQE{ID: id}).Encode(slot)
	rt.rq.Commit()
}

func (rt *ringTest) postSend(t *testing.T, e shm.SQE) {
	slot, err := rt.sq.Reserve()
	if err != nil || slot == nil {
		t.Fatalf("send ring: %v", err)
	}
	e.Encode(slot)
	rt.sq.Commit()
}

func drained(r *shm.Ring) bool { return r.Produced() == r.Consumed() }

// The poller takes what the engine accepts from a polled EP's rings and
// owns their need-wakeup flags; what needs an event it leaves in the ring
// and hands to the session, whose step otherwise leaves the rings alone.
func TestRingSource(t *testing.T) {
	rt := newRingTest(t)
	src, s := rt.src, rt.s

	// Idle: nothing to take, the flags go up for a sleep, down after.
	if src.Poll() || src.Sleeping() {
		t.Fatal("idle rings reported work")
	}
	if rt.sq.Flags() != shm.NeedWakeup || rt.rq.Flags() != shm.NeedWakeup {
		t.Fatalf("flags while the poller sleeps: %d %d", rt.sq.Flags(), rt.rq.Flags())
	}
	src.Awake()
	if rt.sq.Flags() != 0 || rt.rq.Flags() != 0 {
		t.Fatal("flags stay up after the poller woke")
	}

	// A receive posted as the poller goes to sleep keeps it awake, and
	// the poller takes it, without the session.
	rt.postRecv(t, 1)
	if !src.Sleeping() {
		t.Fatal("a post since Poll looked does not keep the poller awake")
	}
	src.Awake()
	if !src.Poll() || !drained(rt.e.rq) {
		t.Fatal("the poller did not take a valid receive")
	}
	if src.Sleeping() {
		t.Fatal("taken work keeps the poller awake")
	}
	src.Awake()

	// The session's step leaves a polled EP's rings to the poller.
	rt.postRecv(t, 2)
	s.step()
	if drained(rt.e.rq) {
		t.Fatal("the session drained a polled EP's ring unasked")
	}
	if !src.Poll() || !drained(rt.e.rq) {
		t.Fatal("the poller did not take the second receive")
	}

	// A request the engine refuses stays in the ring for the session,
	// which reports it.
	rt.postSend(t, shm.SQE{ID: 9, Op: shm.NumSQOps})
	if src.Poll() {
		t.Fatal("the poller took a refused request")
	}
	if drained(rt.e.sq) || !rt.e.handOff.Load() {
		t.Fatal("a refused request was not handed to the session")
	}
	select {
	case <-s.wake:
	default:
		t.Fatal("the session was not kicked")
	}
	s.step()
	if !drained(rt.e.sq) || rt.e.handOff.Load() {
		t.Fatal("the session did not drain the handed-over ring")
	}
	events, _ := shm.NewRing(rt.ev.mem.Mem, 16, shm.EVESize) // the client's side
	slot, err := events.Peek()
	if err != nil || slot == nil {
		t.Fatalf("no event for the refused request: %v", err)
	}
	if eve := shm.DecodeEVE(slot); eve.ID != 9 || completion.Status(eve.Status) != completion.LocalQPOperationError {
		t.Fatalf("event %+v", eve)
	}

	// A busy ring lock (the session draining) keeps the poller trying,
	// awake.
	rt.postRecv(t, 3)
	rt.e.ringMu.Lock()
	if src.Poll() || !src.Sleeping() {
		t.Fatal("a held ring lock let the poller sleep")
	}
	rt.e.ringMu.Unlock()
	src.Awake()
	if !src.Poll() || !drained(rt.e.rq) {
		t.Fatal("the poller did not take the receive once the lock was free")
	}
}

// fakePoller counts wake-ups.
type fakePoller struct{ wakes int }

func (f *fakePoller) Wake()                            { f.wakes++ }
func (f *fakePoller) RemoveSource(xdpnet.Source) error { return nil }

// The poller forwards completions into a polled EVD's ring and signals an
// armed client; a full ring hands the EVD to the session, which forwards
// once there is room and then gives it back.
func TestEVDSource(t *testing.T) {
	s, e := newTestEVD(t, 4, 16, func(e *evd) func(*completion.CQ) { return func(*completion.CQ) { e.src.pl.Wake() } })
	notify, mem := e.notify, e.mem
	pl := &fakePoller{}
	src := &evdSource{s: s, e: e, pl: pl}
	e.src = src
	s.owners.Store(uint32(5), uint32(77))
	client, _ := shm.NewRing(mem.Mem, 4, shm.EVESize)
	take := func() shm.EVE {
		t.Helper()
		slot, err := client.Peek()
		if err != nil || slot == nil {
			t.Fatalf("no event: %v", err)
		}
		eve := shm.DecodeEVE(slot)
		client.Release()
		return eve
	}
	push := func(id uint64) {
		t.Helper()
		must(t, e.cq.Push(completion.Completion{ID: id, QPN: 5, Opcode: completion.OpSend}))
	}

	// Sleeping arms the CQ: a completion made elsewhere wakes the poller.
	if src.Poll() || src.Sleeping() {
		t.Fatal("an empty CQ reported work")
	}
	push(1)
	if pl.wakes != 1 {
		t.Fatalf("%d wake-ups for a completion on an armed CQ", pl.wakes)
	}
	client.SetFlags(shm.Armed) // the client waits
	if !src.Poll() {
		t.Fatal("the poller forwarded nothing")
	}
	if eve := take(); eve.ID != 1 || eve.EP != 77 {
		t.Fatalf("event %+v", eve)
	}
	if client.Flags() != 0 {
		t.Fatal("the armed client was not signalled")
	}
	must(t, shm.Wait(notify))

	// Five completions, four slots: the rest waits, and the session has
	// the EVD until it forwarded it.
	for id := uint64(10); id < 15; id++ {
		push(id)
	}
	src.Poll()
	if !e.handOff.Load() {
		t.Fatal("a full ring was not handed to the session")
	}
	if src.Poll() {
		t.Fatal("the poller forwarded a handed-over EVD")
	}
	select {
	case <-s.wake:
	default:
		t.Fatal("the session was not kicked")
	}
	for id := uint64(10); id < 14; id++ {
		if eve := take(); eve.ID != id {
			t.Fatalf("event %d, want %d", eve.ID, id)
		}
	}
	wakes := pl.wakes
	s.step()
	if e.handOff.Load() || pl.wakes != wakes+1 {
		t.Fatal("the session did not give the EVD back to a woken poller")
	}
	if eve := take(); eve.ID != 14 {
		t.Fatalf("event %d, want 14", eve.ID)
	}
}

// newTestEVD is a session with one DTO EVD of entries ring slots and a CQ
// of depth, whose CQ handler handler makes (nil: none).
func newTestEVD(t *testing.T, entries uint32, depth int, handler func(*evd) func(*completion.CQ)) (*session, *evd) {
	t.Helper()
	s := &session{objects: map[uint32]any{}, wake: make(chan struct{}, 1)}
	mem, err := shm.NewMemfd("evd-test", shm.RingSize(entries, shm.EVESize))
	must(t, err)
	t.Cleanup(func() { mem.Close() })
	notify, err := shm.NewEventfd()
	must(t, err)
	t.Cleanup(func() { notify.Close() })
	e := &evd{mem: mem, notify: notify}
	e.ring, _ = shm.NewRing(mem.Mem, entries, shm.EVESize)
	opts := completion.Options{Depth: depth}
	if handler != nil {
		opts.Handler = handler(e)
	}
	e.cq, err = completion.New(opts)
	must(t, err)
	e.h, err = s.add(e)
	must(t, err)
	return s, e
}
