package daemon

import (
	"fmt"
	"net"
	"os"
	"testing"
	"time"

	"github.com/softrnic/softrnic/completion"
	"github.com/softrnic/softrnic/internal/shm"
	"github.com/softrnic/softrnic/rnic"
	"github.com/softrnic/softrnic/xdpnet"
	"golang.org/x/sys/unix"
)

// ringTest is a session with one EP whose rings are on a ready queue
// that is a poller's source (driven by hand here), an EVD for its events,
// and the client's producer views of the rings and the queue.
type ringTest struct {
	s      *session
	e      *ep
	ev     *evd
	q      *readyQueue
	pl     *fakePoller
	sq, rq *shm.Ring // the client's side
	ready  *shm.Ring
	events *shm.Ring
}

// newTestSession is a session with a region of size octets, no server.
func newTestSession(t testing.TB, size int) *session {
	t.Helper()
	region, err := shm.NewMemfd("session-test", size)
	must(t, err)
	t.Cleanup(func() { region.Close() })
	heap, err := shm.NewHeap(region.Mem, minBlock)
	must(t, err)
	return &session{objects: map[uint32]any{}, wake: make(chan struct{}, 1), region: region, heap: heap}
}

// clientView is the client's view of a ring the session carved.
func clientView(t testing.TB, s *session, r *shm.Ring, off uint32, size int) *shm.Ring {
	t.Helper()
	v, err := shm.NewRing(s.heap.Mem(off, shm.RingSize(r.Entries(), size)), r.Entries(), size)
	must(t, err)
	return v
}

// newTestQueue is a ready queue of s whose owner is pl (nil: a kernel
// datapath loop, not started).
func newTestQueue(t testing.TB, s *session, pl sourcePoller) (q *readyQueue, client *shm.Ring) {
	t.Helper()
	off, ring, err := s.allocRing(readyEntries, shm.ReadyEntrySize)
	must(t, err)
	q = &readyQueue{s: s, off: off, ring: ring, pl: pl}
	s.queues = append(s.queues, q)
	return q, clientView(t, s, ring, off, shm.ReadyEntrySize)
}

// newTestEP gives s an EP with a QP of dev and rings of 8 on q.
func newTestEP(t testing.TB, s *session, dev *rnic.Device, q *readyQueue, ev *evd) (e *ep, sq, rq *shm.Ring) {
	t.Helper()
	pd, err := dev.AllocPD()
	must(t, err)
	cq, err := dev.CreateCQ(64, 0)
	must(t, err)
	qp, err := dev.CreateQP(pd, rnic.QPAttr{SQDepth: 8, RQDepth: 8, SendCQ: cq, RecvCQ: cq})
	must(t, err)
	e = &ep{qp: qp, recv: ev, req: ev, queue: q}
	sqOff, sqr, err := s.allocRing(8, shm.SQESize)
	must(t, err)
	rqOff, rqr, err := s.allocRing(8, shm.RQESize)
	must(t, err)
	e.sq, e.rq, e.sqOff, e.rqOff = sqr, rqr, sqOff, rqOff
	e.sq.SetFlags(shm.NeedWakeup)
	e.rq.SetFlags(shm.NeedWakeup)
	e.h, err = s.add(e)
	must(t, err)
	e.slot, err = s.newSlot(e)
	must(t, err)
	return e, clientView(t, s, sqr, sqOff, shm.SQESize), clientView(t, s, rqr, rqOff, shm.RQESize)
}

func newRingTest(t testing.TB) *ringTest {
	t.Helper()
	dev := rnic.Open()
	t.Cleanup(func() { dev.Close() })
	s := newTestSession(t, 64<<20)
	rt := &ringTest{s: s, pl: &fakePoller{}}
	off, ring, err := s.allocRing(16, shm.EVESize)
	must(t, err)
	rt.ev = &evd{off: off, ring: ring}
	rt.ev.h, err = s.add(rt.ev)
	must(t, err)
	rt.events = clientView(t, s, ring, off, shm.EVESize)
	rt.q, rt.ready = newTestQueue(t, s, rt.pl)
	rt.e, rt.sq, rt.rq = newTestEP(t, s, dev, rt.q, rt.ev)
	return rt
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// post does what the client does after it committed an entry to r, one
// of an EP's rings: it puts the EP on the ready queue if the flags say
// so, and reports whether the doorbell would ring.
func post(t *testing.T, r, sq, ready *shm.Ring, slot uint32) (doorbell bool) {
	t.Helper()
	if r.Flags()&shm.NeedWakeup == 0 || !sq.MarkQueued() {
		return false
	}
	if ok, err := ready.Push(slot); !ok || err != nil {
		t.Fatalf("ready queue: %v %v", ok, err)
	}
	return ready.Flags()&shm.NeedWakeup != 0
}

func (rt *ringTest) postRecv(t *testing.T, id uint64) (doorbell bool) {
	t.Helper()
	slot, err := rt.rq.Reserve()
	if err != nil || slot == nil {
		t.Fatalf("receive ring: %v", err)
	}
	(&shm.RQE{ID: id}).Encode(slot)
	rt.rq.Commit()
	return post(t, rt.rq, rt.sq, rt.ready, rt.e.slot)
}

func (rt *ringTest) postSend(t *testing.T, e shm.SQE) (doorbell bool) {
	t.Helper()
	slot, err := rt.sq.Reserve()
	if err != nil || slot == nil {
		t.Fatalf("send ring: %v", err)
	}
	e.Encode(slot)
	rt.sq.Commit()
	return post(t, rt.sq, rt.sq, rt.ready, rt.e.slot)
}

func drained(r *shm.Ring) bool { return r.Produced() == r.Consumed() }

// The poller takes what the engine accepts from the rings of the EPs on
// its ready queue and owns the queue's need-wakeup flag; what needs an
// event it leaves in the ring and hands to the session, whose step
// otherwise leaves the rings alone.
func TestReadyQueue(t *testing.T) {
	rt := newRingTest(t)
	q, s := rt.q, rt.s

	// Idle: nothing to take, the flag goes up for a sleep, down after.
	if q.Poll() || q.Sleeping() {
		t.Fatal("an idle queue reported work")
	}
	if rt.ready.Flags() != shm.NeedWakeup {
		t.Fatalf("queue flags while the poller sleeps: %d", rt.ready.Flags())
	}
	// A receive posted as the poller goes to sleep rings the doorbell
	// and keeps it awake, and the poller takes it, without the session.
	if !rt.postRecv(t, 1) {
		t.Fatal("a post to a sleeping poller's queue rang no doorbell")
	}
	if !q.Sleeping() {
		t.Fatal("a queued EP does not keep the poller awake")
	}
	q.Awake()
	if rt.ready.Flags() != 0 {
		t.Fatal("the queue's flag stays up after the poller woke")
	}
	if !q.Poll() || !drained(rt.e.rq) {
		t.Fatal("the poller did not take a valid receive")
	}
	if q.Sleeping() {
		t.Fatal("taken work keeps the poller awake")
	}
	q.Awake()

	// Awake, a post queues the EP but rings nothing; queued once
	// however many posts.
	if rt.postRecv(t, 2) || rt.postRecv(t, 3) {
		t.Fatal("a post to an awake poller rang the doorbell")
	}
	if n := rt.ready.Produced() - rt.ready.Consumed(); n != 1 {
		t.Fatalf("the EP is on the queue %d times", n)
	}
	// The session's step leaves the rings to the poller.
	s.step()
	if drained(rt.e.rq) {
		t.Fatal("the session drained a queued EP's ring unasked")
	}
	if !q.Poll() || !drained(rt.e.rq) {
		t.Fatal("the poller did not take the second receives")
	}

	// A request the engine refuses stays in the ring for the session,
	// which reports it and gives the rings back with a kick.
	rt.postSend(t, shm.SQE{ID: 9, Op: shm.NumSQOps})
	if q.Poll() {
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
	wakes := rt.pl.wakes
	s.step()
	if !drained(rt.e.sq) || rt.e.handOff.Load() {
		t.Fatal("the session did not drain the handed-over ring")
	}
	if rt.pl.wakes == wakes || q.nkicked.Load() != 1 {
		t.Fatal("the session gave the rings back without a kick")
	}
	slot, err := rt.events.Peek()
	if err != nil || slot == nil {
		t.Fatalf("no event for the refused request: %v", err)
	}
	if eve := shm.DecodeEVE(slot); eve.ID != 9 || completion.Status(eve.Status) != completion.LocalQPOperationError {
		t.Fatalf("event %+v", eve)
	}
	q.Poll()

	// A busy ring lock (the session draining) has the poller try again
	// next turn, though the client queued the EP once.
	rt.postRecv(t, 4)
	rt.e.ringMu.Lock()
	if q.Poll() {
		t.Fatal("the poller took a ring whose lock was held")
	}
	rt.e.ringMu.Unlock()
	if !q.Poll() || !drained(rt.e.rq) {
		t.Fatal("the poller did not take the receive once the lock was free")
	}
}

// A turn costs what the queued EPs cost: the rings of EPs nobody queued
// are not looked at, however many, and a slot whose EP went is skipped.
func TestReadyQueueLooksOnlyAtQueuedEPs(t *testing.T) {
	rt := newRingTest(t)
	dev := rnic.Open()
	t.Cleanup(func() { dev.Close() })
	var idle []*ep
	for range 100 {
		e, _, rq := newTestEP(t, rt.s, dev, rt.q, rt.ev)
		// Entries the client committed but did not queue: invisible.
		slot, _ := rq.Reserve()
		(&shm.RQE{ID: 1}).Encode(slot)
		rq.Commit()
		idle = append(idle, e)
	}
	rt.postRecv(t, 1)
	if !rt.q.Poll() || !drained(rt.e.rq) {
		t.Fatal("the queued EP was not taken")
	}
	for _, e := range idle {
		if drained(e.rq) {
			t.Fatal("the poller looked at an EP nobody queued")
		}
	}
	// A slot queued for an EP since freed, and one never given.
	rt.s.freeSlot(idle[0].slot)
	for _, slot := range []uint32{idle[0].slot, maxObjects - 1, maxObjects + 7} {
		if ok, err := rt.ready.Push(slot); !ok || err != nil {
			t.Fatal(ok, err)
		}
	}
	if rt.q.Poll() || drained(idle[0].rq) {
		t.Fatal("the poller took the rings of a freed slot")
	}
}

// A client that corrupts its ready queue loses its session.
func TestCorruptReadyQueueEndsTheSession(t *testing.T) {
	rt := newRingTest(t)
	rt.s.srv = &Server{log: quiet()}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	must(t, err)
	unix.Close(fds[1])
	fc, err := net.FileConn(os.NewFile(uintptr(fds[0]), "session"))
	must(t, err)
	rt.s.conn = fc.(*net.UnixConn)
	t.Cleanup(func() { rt.s.conn.Close() })
	mem := rt.s.heap.Mem(rt.q.off, shm.HeaderSize)
	mem[0] = 0xff // the producer index, far past the consumer's
	mem[1] = 0xff
	mem[2] = 0xff
	rt.q.Poll()
	rt.q.Poll()
	if !rt.q.corrupt {
		t.Fatal("the queue's corruption went unseen")
	}
	rt.s.step()
	if !rt.s.closing {
		t.Fatal("the session survived a corrupt ready queue")
	}
}

// On the kernel datapath the queue's loop sleeps on its doorbell with the
// flag up and takes what a post that rang it queued.
func TestReadyQueueLoop(t *testing.T) {
	rt := newRingTest(t)
	q := rt.q
	q.pl = nil
	db, err := shm.NewEventfd()
	must(t, err)
	q.db, q.done = db, make(chan struct{})
	go q.run()
	t.Cleanup(q.stop)
	deadline := time.Now().Add(10 * time.Second)
	for rt.ready.Flags() != shm.NeedWakeup {
		if time.Now().After(deadline) {
			t.Fatal("the loop never slept")
		}
		time.Sleep(time.Millisecond)
	}
	for id := uint64(1); id <= 3; id++ {
		if rt.postRecv(t, id) {
			must(t, shm.Signal(q.db))
		}
		for !drained(rt.e.rq) {
			if time.Now().After(deadline) {
				t.Fatalf("receive %d was never taken", id)
			}
			time.Sleep(100 * time.Microsecond)
		}
	}
}

// fakePoller counts wake-ups.
type fakePoller struct{ wakes int }

func (f *fakePoller) Doorbell() (*os.File, error) { return shm.NewEventfd() }

func (f *fakePoller) Wake()                            { f.wakes++ }
func (f *fakePoller) RemoveSource(xdpnet.Source) error { return nil }

// The poller forwards completions into a polled EVD's ring and signals an
// armed client; a full ring hands the EVD to the session, which forwards
// once there is room and then gives it back.
func TestEVDSource(t *testing.T) {
	s, e := newTestEVD(t, 4, 16, func(e *evd) func(*completion.CQ) { return func(*completion.CQ) { e.src.pl.Wake() } })
	notify := e.notify
	pl := &fakePoller{}
	src := &evdSource{s: s, e: e, pl: pl}
	e.src = src
	s.owners.Store(uint32(5), uint32(77))
	client := clientView(t, s, e.ring, e.off, shm.EVESize)
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
	s := newTestSession(t, 1<<20)
	notify, err := shm.NewEventfd()
	must(t, err)
	t.Cleanup(func() { notify.Close() })
	e := &evd{notify: notify}
	e.off, e.ring, err = s.allocRing(entries, shm.EVESize)
	must(t, err)
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

// BenchmarkIdleTurn is what a poller's idle turn costs the ready queue
// of a session (a look at the queue, and the need-wakeup flag raised for
// a sleep and lowered after), with 0 and 10,000 idle EPs on it: the same,
// since idle EPs are never looked at.
func BenchmarkIdleTurn(b *testing.B) {
	for _, idle := range []int{0, 10000} {
		b.Run(fmt.Sprintf("idle=%d", idle), func(b *testing.B) {
			rt := newRingTest(b)
			dev := rnic.Open()
			defer dev.Close()
			for range idle {
				newTestEP(b, rt.s, dev, rt.q, rt.ev)
			}
			b.ResetTimer()
			for range b.N {
				if rt.q.Poll() || rt.q.Sleeping() {
					b.Fatal("an idle queue reported work")
				}
				rt.q.Awake()
			}
		})
	}
}
