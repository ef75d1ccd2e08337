package daemon

import (
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/softrnic/softrnic/internal/shm"
	"github.com/softrnic/softrnic/xdpnet"
	"golang.org/x/sys/unix"
)

// The data path between a client's rings and the RNIC runs where the work
// is, never through the session's loop:
//
//   - xdp datapath: an EP's rings and a DTO EVD are sources of their QP's
//     poller (ringSource, evdSource), polled on its CPU;
//   - kernel datapath: an EP's rings have a goroutine of their own woken by
//     the EP's doorbell (ringLoop), which posts into the QP, whose
//     connection sends from that same goroutine; a DTO EVD is pumped by
//     whichever goroutine made its completions (the QP's Completed hook:
//     the connection's receive goroutine, a ringLoop, a consumer's call).
//
// Each EP's rings have one consumer at a time, under ringMu: their owner
// (source or loop), the QP's BeforeReceive taking receives ahead of data
// that arrived, or the session while they are handed over. What needs an
// event (a refused work request, a corrupt ring) or room (a full event
// ring) the owner hands to the session (session.handOff), which gives it
// back once seen to.

// sourcePoller is what a ring or EVD source needs of its xdpnet.Poller
// once added.
type sourcePoller interface {
	Wake()
	RemoveSource(xdpnet.Source) error
}

// ringSource is an EP's send and receive rings as a source of its QP's
// poller: work requests go into the engine on the poller's CPU, without
// the session (the design's "SQ doorbell → qp" in the poller). A post
// while the poller spins costs no wake-up at all; the rings' need-wakeup
// flags are up only while it sleeps, and the EP's doorbell is then the
// poller's own (xdpnet.Poller.Doorbell). ringMu makes the poller and the
// session one consumer; the poller only tries it. What needs an event (a
// refused work request, a corrupt ring) the poller leaves in the ring and
// hands to the session, which otherwise leaves the rings alone.
type ringSource struct {
	s  *session
	e  *ep
	pl sourcePoller
	// seenSQ and seenRQ are the producer indices up to which Poll found
	// the rings empty or took what it could; loop-owned.
	seenSQ, seenRQ uint32
}

func (r *ringSource) Poll() bool {
	e := r.e
	sq, rq := e.sq.Produced(), e.rq.Produced()
	if sq == e.sq.Consumed() && rq == e.rq.Consumed() || e.handOff.Load() {
		// Nothing, or the session's for now: it wakes the poller when
		// it gives the rings back.
		r.seenSQ, r.seenRQ = sq, rq
		return false
	}
	if !e.ringMu.TryLock() {
		// The session is draining (a hand-over or a control
		// operation, briefly): try again next turn, and do not sleep
		// meanwhile (seen stays behind).
		return false
	}
	r.seenSQ, r.seenRQ = sq, rq
	// Back-pressure leaves requests for completions to make room, which
	// this loop makes: it retries on every turn.
	progress, _ := r.s.takeRings(e)
	return progress
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

func (r *ringSource) Sleeping() bool {
	r.e.sq.SetFlags(shm.NeedWakeup)
	r.e.rq.SetFlags(shm.NeedWakeup)
	return r.e.sq.Produced() != r.seenSQ || r.e.rq.Produced() != r.seenRQ
}

func (r *ringSource) Awake() {
	r.e.sq.SetFlags(0)
	r.e.rq.SetFlags(0)
}

// evdSource is a DTO EVD as a source of its CQ's poller: completions go
// from the CQ into the EVD's ring, and the waiting client is signalled, on
// the CPU that made them, without the session. The poller arms the CQ
// before it sleeps, so that completions made elsewhere (a flush on
// disconnect) wake it. A full ring, a backlog of the session's events or
// a corrupt ring hands the EVD to the session (handOff) until it has
// forwarded everything: the client's doorbell for room is the session's.
type evdSource struct {
	s  *session
	e  *evd
	pl sourcePoller
	// retry: the ring lock was busy at Poll; loop-owned.
	retry bool
}

func (r *evdSource) Poll() bool {
	e := r.e
	r.retry = false
	if e.handOff.Load() || e.cq.Len() == 0 {
		return false
	}
	if !e.ringMu.TryLock() {
		r.retry = true
		return false
	}
	var moved, full bool
	var err error
	if len(e.backlog) > 0 {
		full = true // the session's events go first
	} else {
		moved, full, err = e.forwardLocked(r.s.epOf)
	}
	if full || err != nil {
		e.handOff.Store(true)
	}
	e.ringMu.Unlock()
	if moved && e.ring.SwapFlags(0) == shm.Armed {
		_ = shm.Signal(e.notify)
	}
	if full || err != nil {
		r.s.handOff(e) // handOff is set above, under the ring lock
	}
	return moved
}

func (r *evdSource) Sleeping() bool {
	if !r.e.handOff.Load() {
		r.e.cq.Arm(false)
	}
	return r.retry
}

func (r *evdSource) Awake() {}

// ringLoop is an EP's rings on the kernel datapath: a goroutine of the
// EP's own, asleep on the EP's doorbell (an eventfd the client signals
// when the rings' need-wakeup flag is up), moves work requests into the
// QP, whose connection sends them from this goroutine while its socket
// takes them (rnic's kernelConn), and forwards the completions that makes
// (the QP's Completed hook). A post costs one wake-up of this goroutine,
// none while it is awake.
type ringLoop struct {
	s  *session
	e  *ep
	db *os.File // the doorbell; the client holds a duplicate
	// asleep: the loop waits on db (the need-wakeup flags are up).
	asleep  atomic.Bool
	stopped atomic.Bool
	// polling: the QP's receive goroutine polls the rings, their flags
	// down (poll); owned by that goroutine.
	polling  bool
	stopOnce sync.Once
	done     chan struct{}
}

// startRingLoop gives e's rings a loop and returns its doorbell for the
// client.
func (s *session) startRingLoop(e *ep) (*os.File, error) {
	db, err := shm.NewEventfd()
	if err != nil {
		return nil, err
	}
	client, err := dupFile(db)
	if err != nil {
		db.Close()
		return nil, err
	}
	r := &ringLoop{s: s, e: e, db: db, done: make(chan struct{})}
	e.loop = r
	go r.run()
	return client, nil
}

func (r *ringLoop) run() {
	defer close(r.done)
	e := r.e
	var busyUntil time.Time // after work, the loop looks on a while
	for {
		sq, rq := e.sq.Produced(), e.rq.Produced()
		if (sq != e.sq.Consumed() || rq != e.rq.Consumed()) && !e.handOff.Load() && r.take() {
			busyUntil = time.Now().Add(ringSpin)
			continue
		}
		if !busyUntil.IsZero() && time.Now().Before(busyUntil) && !r.stopped.Load() {
			_, _, _ = unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
			continue
		}
		busyUntil = time.Time{}
		// Nothing to take, or nothing the QP takes now (back-pressure:
		// Completed wakes the loop when completions make room), or
		// the session's: sleep, unless a post raced in.
		r.asleep.Store(true)
		e.sq.SetFlags(shm.NeedWakeup)
		e.rq.SetFlags(shm.NeedWakeup)
		// Requests left for want of room are tried once more now that
		// asleep is up: completions that made room before it was could
		// not wake the loop (completed), and nothing else would.
		if e.sq.Produced() == sq && e.rq.Produced() == rq && !r.retryLeft() {
			if err := shm.Wait(r.db); err != nil {
				return // stop closed the doorbell
			}
		}
		e.sq.SetFlags(0)
		e.rq.SetFlags(0)
		r.asleep.Store(false)
	}
}

// ringSpin is how long a ring loop that took work keeps looking before it
// sleeps: a client that posts in bursts (a bandwidth test, a storage
// target's queue) finds it awake and rings no doorbell.
const ringSpin = 20 * time.Microsecond

// retryLeft takes requests left in the rings, if any, and reports progress.
func (r *ringLoop) retryLeft() bool {
	e := r.e
	pending := e.sq.Produced() != e.sq.Consumed() || e.rq.Produced() != e.rq.Consumed()
	return pending && !e.handOff.Load() && r.take()
}

// take moves what it can from the rings into the QP, receives first, and
// reports progress; what needs an event goes to the session.
func (r *ringLoop) take() bool {
	r.e.ringMu.Lock()
	progress, left := r.s.takeRings(r.e)
	return progress && !left
}

// poll is the QP's Poll hook, on its receive goroutine: it takes what the
// client posted since, and reports whether there was any. The ring lock
// taken means the loop or the session is at it already. While it polls,
// the need-wakeup flags of a sleeping loop are down, so that a post it
// takes costs the client no doorbell and the loop no wake-up; pollDone
// raises them again and takes what came in between.
func (r *ringLoop) poll() bool {
	e := r.e
	if r.stopped.Load() || e.handOff.Load() {
		return false
	}
	if !r.polling && r.asleep.Load() {
		r.polling = true
		e.sq.SetFlags(0)
		e.rq.SetFlags(0)
	}
	if e.sq.Produced() == e.sq.Consumed() && e.rq.Produced() == e.rq.Consumed() {
		return false
	}
	if !e.ringMu.TryLock() {
		return true
	}
	r.s.takeRings(e) // releases the lock
	return true
}

// pollDone ends a run of polls (see poll).
func (r *ringLoop) pollDone() {
	if !r.polling {
		return
	}
	r.polling = false
	e := r.e
	if r.asleep.Load() {
		e.sq.SetFlags(shm.NeedWakeup)
		e.rq.SetFlags(shm.NeedWakeup)
	}
	if (e.sq.Produced() != e.sq.Consumed() || e.rq.Produced() != e.rq.Consumed()) && !r.stopped.Load() && !e.handOff.Load() {
		r.take()
	}
}

// wake wakes the loop if it sleeps.
func (r *ringLoop) wake() {
	if r.asleep.Load() && !r.stopped.Load() {
		_ = shm.Signal(r.db)
	}
}

// stop ends the loop; once it returns the loop touches the rings no more.
func (r *ringLoop) stop() {
	r.stopOnce.Do(func() {
		r.stopped.Store(true)
		r.db.Close()
		<-r.done
	})
}

// completed is the Completed hook of an EP's QP on the kernel datapath,
// run by the goroutine that made completions once it released the QP: it
// forwards them to the EVDs' rings, and wakes the ring loop if requests
// wait in the rings for room the completions made.
func (s *session) completed(e *ep, recv, req *evd) {
	req.pump(s)
	if recv != req {
		recv.pump(s)
	}
	if r := e.loop; r != nil && (e.sq.Produced() != e.sq.Consumed() || e.rq.Produced() != e.rq.Consumed()) {
		r.wake()
	}
}

// pump forwards an EVD's completions into its ring from the goroutine that
// made them, with no lock held, unless the session holds the EVD. Of
// goroutines pumping one EVD at once, one forwards and the others leave
// their completions to it (again): none is left in the CQ unforwarded.
func (e *evd) pump(s *session) {
	for {
		if e.cq.Len() == 0 || e.handOff.Load() {
			return
		}
		e.again.Store(true)
		if !e.ringMu.TryLock() {
			return // the holder goes round again
		}
		e.again.Store(false)
		if e.freed {
			e.ringMu.Unlock()
			return
		}
		var moved, full bool
		var err error
		if len(e.backlog) > 0 {
			full = true // the session's events go first
		} else {
			moved, full, err = e.forwardLocked(s.epOf)
		}
		e.ringMu.Unlock()
		if moved && e.ring.SwapFlags(0) == shm.Armed {
			_ = shm.Signal(e.notify)
		}
		if full || err != nil {
			s.handOver(&e.handOff, e)
			return
		}
		// Round again while a pump left completions to this one, or
		// more than a batch waits (the loop's top returns once none).
	}
}
