package daemon

import (
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/ctl"
	"github.com/softrnic/softrnic/internal/shm"
)

// A session's shared memory is one region (shm.Heap) carved into the
// rings of its EPs and EVDs: a client with ten thousand EPs costs the
// daemon one memfd, not ten thousand, and an idle EP's rings take a few
// hundred octets of it. The client finds a ring's place in the replies.
const (
	// regionSize is the virtual size of a session's region; only what
	// its rings touch takes memory.
	regionSize = 1 << 30
	// minBlock is the smallest ring block: a header and one entry.
	minBlock = 512
	// readyEntries is a ready queue's depth: every EP of a session fits,
	// each at most once (shm.Ring.MarkQueued), so it never overflows.
	readyEntries = maxObjects
	// readyBatch bounds the EPs one turn takes off a queue, so that a
	// client that pushes slots as fast as it can cannot hold the owner.
	readyBatch = 256
)

// readyQueue is where the owner of a session's EP rings learns which of
// them have work, for the EPs of one completion vector: on the xdp
// datapath a source of that vector's poller, on the kernel datapath a
// goroutine of its own asleep on the queue's doorbell. A post to rings
// whose need-wakeup flag is up puts the EP's slot on the queue (the
// client: shm.Ring.MarkQueued), so a turn costs what the EPs with work
// cost, however many EPs are idle. The EPs an owner must look at again
// without the client queuing them (the session gave their rings back,
// completions made room for what back-pressure left) are kicked.
type readyQueue struct {
	s      *session
	vector int
	off    uint32
	ring   *shm.Ring // the consumer's view
	// pl is the poller whose source the queue is (xdp datapath); db the
	// doorbell its loop sleeps on (kernel datapath; the client holds
	// duplicates).
	pl sourcePoller
	db *os.File

	kickMu  sync.Mutex
	kicked  []*ep
	nkicked atomic.Int32

	// retry are the EPs whose rings a turn could not take (the ring
	// lock was busy, back-pressure on the xdp datapath), work the
	// scratch of a turn; owner-only, as is each EP's retrying flag.
	retry, work []*ep
	// corrupt: the client broke the queue, handed to the session to end
	// it; owner-only.
	corrupt bool

	// The kernel datapath's loop: asleep while it waits on db.
	asleep   atomic.Bool
	stopped  atomic.Bool
	stopOnce sync.Once
	done     chan struct{}
}

// slotTable finds an EP by the slot a client put on a ready queue,
// without a lock: owners look up slots while the session adds and
// removes EPs.
type slotTable struct {
	chunks [maxObjects / 256]atomic.Pointer[[256]atomic.Pointer[ep]]
}

func (t *slotTable) get(slot uint32) *ep {
	if slot >= maxObjects {
		return nil
	}
	c := t.chunks[slot/256].Load()
	if c == nil {
		return nil
	}
	return c[slot%256].Load()
}

// set stores e (nil to clear) at slot; s.mu held.
func (t *slotTable) set(slot uint32, e *ep) {
	c := t.chunks[slot/256].Load()
	if c == nil {
		c = new([256]atomic.Pointer[ep])
		t.chunks[slot/256].Store(c)
	}
	c[slot%256].Store(e)
}

// newSlot gives e a slot; s.mu held.
func (s *session) newSlot(e *ep) (uint32, error) {
	var slot uint32
	if n := len(s.freeSlots); n > 0 {
		slot = s.freeSlots[n-1]
		s.freeSlots = s.freeSlots[:n-1]
	} else {
		if s.nslots == maxObjects {
			return 0, fail(ctl.InsufficientResources, "%d EPs with rings in this session", maxObjects)
		}
		slot = s.nslots
		s.nslots++
	}
	s.slots.set(slot, e)
	return slot, nil
}

// freeSlot forgets slot; s.mu held.
func (s *session) freeSlot(slot uint32) {
	s.slots.set(slot, nil)
	s.freeSlots = append(s.freeSlots, slot)
}

// allocRing carves a block for a ring of entries entries of size octets
// from the session's region; s.mu held.
func (s *session) allocRing(entries uint32, size int) (off uint32, r *shm.Ring, err error) {
	n := shm.RingSize(entries, size)
	off, ok := s.heap.Alloc(n)
	if !ok {
		return 0, nil, fail(ctl.InsufficientResources, "the session's shared region (%d MiB) is full: %d MiB in rings", regionSize>>20, s.heap.Used()>>20)
	}
	r, _ = shm.NewRing(s.heap.Mem(off, n), entries, size)
	return off, r, nil
}

// freeRing returns a ring's block; s.mu held. At the session's end the
// region goes whole instead: the client, which may still be reading its
// rings to find the daemon gone, keeps their last state in its mapping,
// where punching the blocks out would zero the indices under it.
func (s *session) freeRing(off uint32, entries uint32, size int) {
	if s.closing {
		return
	}
	s.heap.Free(off, shm.RingSize(entries, size))
}

// queueFor returns the ready queue of a vector, making it the first time;
// s.mu held.
func (s *session) queueFor(vector int) (*readyQueue, error) {
	for len(s.queues) <= vector {
		s.queues = append(s.queues, nil)
	}
	if q := s.queues[vector]; q != nil {
		return q, nil
	}
	off, ring, err := s.allocRing(readyEntries, shm.ReadyEntrySize)
	if err != nil {
		return nil, err
	}
	q := &readyQueue{s: s, vector: vector, off: off, ring: ring}
	if pl := s.srv.dev.Poller(vector); pl != nil {
		q.pl = pl
		if err := pl.AddSource(q); err != nil {
			s.freeRing(off, readyEntries, shm.ReadyEntrySize)
			return nil, resources("ready queue source", err)
		}
	} else {
		if q.db, err = shm.NewEventfd(); err != nil {
			s.freeRing(off, readyEntries, shm.ReadyEntrySize)
			return nil, resources("ring loop doorbell", err)
		}
		q.done = make(chan struct{})
		go q.run()
	}
	s.queues[vector] = q
	return q, nil
}

// doorbell is a new descriptor of what the client writes when it put an
// EP on the queue and found its need-wakeup flag up.
func (q *readyQueue) doorbell() (*os.File, error) {
	if q.pl != nil {
		return q.pl.Doorbell()
	}
	return dupFile(q.db)
}

// stop ends the queue's owner: once it returns, the queue's EPs are
// touched by it no more. The session's end; s.mu not held.
func (q *readyQueue) stop() {
	q.stopOnce.Do(func() {
		q.stopped.Store(true)
		if q.pl != nil {
			_ = q.pl.RemoveSource(q)
			return
		}
		q.db.Close()
		<-q.done
	})
}

// kick has the owner look at e's rings on its next turn, whether or not
// the client queued e. Any goroutine.
func (q *readyQueue) kick(e *ep) {
	q.kickMu.Lock()
	q.kicked = append(q.kicked, e)
	q.nkicked.Add(1)
	q.kickMu.Unlock()
	switch {
	case q.pl != nil:
		q.pl.Wake()
	case q.asleep.Load() && !q.stopped.Load():
		_ = shm.Signal(q.db)
	}
}

// turn takes the rings of the EPs that have work: those retried from the
// last turn, those kicked, and those the client queued. lock: wait for a
// ring lock the session or a receive goroutine holds (the kernel
// datapath's loop), else leave the EP for the next turn (a poller, which
// must not block). It reports progress.
func (q *readyQueue) turn(lock bool) bool {
	work := q.work[:0]
	for _, e := range q.retry {
		e.retrying = false
		work = append(work, e)
	}
	q.retry = q.retry[:0]
	if q.nkicked.Load() > 0 {
		q.kickMu.Lock()
		work = append(work, q.kicked...)
		clear(q.kicked)
		q.kicked = q.kicked[:0]
		q.nkicked.Store(0)
		q.kickMu.Unlock()
	}
	for n := 0; n < readyBatch && !q.corrupt; n++ {
		slot, ok, err := q.ring.Pop()
		if err != nil {
			// The client corrupted the queue: the session ends it.
			q.corrupt = true
			q.s.handOff(q)
			break
		}
		if !ok {
			break
		}
		if e := q.s.slots.get(slot); e != nil {
			work = append(work, e)
		}
	}
	progress := false
	for _, e := range work {
		progress = q.take(e, lock) || progress
	}
	clear(work)
	q.work = work[:0]
	return progress
}

// take moves what e's rings hold into its QP, if they are still this
// queue's and not the session's.
func (q *readyQueue) take(e *ep, lock bool) bool {
	if lock {
		e.ringMu.Lock()
	} else if !e.ringMu.TryLock() {
		q.again(e)
		return false
	}
	if e.queue != q || e.sq == nil || e.detached {
		e.ringMu.Unlock() // freed or reconfigured since it was queued
		return false
	}
	// Off the queue before looking: a post from now on queues e again.
	e.sq.ClearQueued()
	if e.handOff.Load() || !e.pending() {
		e.ringMu.Unlock() // the session's for now: it kicks e when done
		return false
	}
	progress, left := q.s.takeRings(e)
	// What back-pressure left waits for completions to make room: the
	// kernel datapath's Completed hook kicks e then; a poller, which
	// makes its QPs' completions itself, looks again next turn.
	if !left && q.pl != nil && e.pending() {
		q.again(e)
	}
	return progress
}

// again has the owner look at e next turn, once however often asked.
func (q *readyQueue) again(e *ep) {
	if !e.retrying {
		e.retrying = true
		q.retry = append(q.retry, e)
	}
}

// pending reports whether e's rings hold requests; read beside the
// client, which only adds.
func (e *ep) pending() bool {
	return e.sq.Produced() != e.sq.Consumed() || e.rq.Produced() != e.rq.Consumed()
}

// The queue as a source of its poller (xdp datapath).

func (q *readyQueue) Poll() bool { return q.turn(false) }

func (q *readyQueue) Sleeping() bool {
	q.ring.SetFlags(shm.NeedWakeup)
	return q.ring.Produced() != q.ring.Consumed() || q.nkicked.Load() > 0
}

func (q *readyQueue) Awake() { q.ring.SetFlags(0) }

// run is the queue's loop on the kernel datapath: it takes the rings of
// the EPs that have work into their QPs, whose connections send what was
// posted from this goroutine while their sockets take it (rnic's
// kernelConn). After work it looks on a while (ringSpin), so that a
// client posting in bursts rings no doorbell; then it sleeps on the
// doorbell with the queue's need-wakeup flag up.
func (q *readyQueue) run() {
	defer close(q.done)
	var busyUntil time.Time
	for {
		if q.turn(true) {
			busyUntil = time.Now().Add(ringSpin)
			continue
		}
		if q.stopped.Load() {
			return
		}
		if !busyUntil.IsZero() && time.Now().Before(busyUntil) {
			_, _, _ = unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
			continue
		}
		busyUntil = time.Time{}
		q.asleep.Store(true)
		q.ring.SetFlags(shm.NeedWakeup)
		if q.ring.Produced() == q.ring.Consumed() && q.nkicked.Load() == 0 {
			if err := shm.Wait(q.db); err != nil {
				return // stop closed the doorbell
			}
		}
		q.ring.SetFlags(0)
		q.asleep.Store(false)
	}
}

// ringSpin is how long a ring loop that took work keeps looking before it
// sleeps: a client that posts in bursts (a bandwidth test, a storage
// target's queue) finds it awake and rings no doorbell.
const ringSpin = 20 * time.Microsecond

// pollRings is the QP's Poll hook on the kernel datapath, on its receive
// goroutine: it takes what the client posted since, and reports whether
// there was any. While it polls, the EP's need-wakeup flags are down, so
// that a post it takes costs the client no ready-queue entry and no
// doorbell; pollDone raises them again and takes what came in between.
// The ring lock taken means the loop or the session is at it already.
func (s *session) pollRings(e *ep) bool {
	if e.handOff.Load() {
		return false
	}
	if !e.polling {
		e.polling = true
		e.sq.SetFlags(0)
		e.rq.SetFlags(0)
	}
	if !e.pending() {
		return false
	}
	if !e.ringMu.TryLock() {
		return true
	}
	if e.detached {
		e.ringMu.Unlock()
		return false
	}
	s.takeRings(e) // releases the lock
	return true
}

// pollDone ends a run of polls (see pollRings).
func (s *session) pollDone(e *ep) {
	if !e.polling {
		return
	}
	e.polling = false
	e.sq.SetFlags(shm.NeedWakeup)
	e.rq.SetFlags(shm.NeedWakeup)
	if !e.pending() || e.handOff.Load() {
		return
	}
	if e.ringMu.TryLock() {
		if e.detached {
			e.ringMu.Unlock()
			return
		}
		s.takeRings(e)
		return
	}
	e.queue.kick(e) // whoever holds the lock may have looked already
}

// takeRings moves what it can from e's rings into its QP, receives first,
// with e.ringMu held, which it releases; what needs an event (left) goes
// to the session.
func (s *session) takeRings(e *ep) (progress, left bool) {
	progress, left = s.takeRQ(e, false)
	if !left {
		var sent bool
		sent, left = s.takeSQ(e, false)
		progress = progress || sent
	}
	e.ringMu.Unlock()
	if left {
		s.handOver(&e.handOff, e)
	}
	return progress, left
}
