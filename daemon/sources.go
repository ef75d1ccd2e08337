package daemon

import (
	"os"

	"github.com/softrnic/softrnic/internal/shm"
	"github.com/softrnic/softrnic/xdpnet"
)

// The data path between a client's rings and the RNIC runs where the work
// is, never through the session's loop:
//
//   - xdp datapath: the ready queue of an EP's completion vector and a DTO
//     EVD are sources of that vector's poller (readyQueue, evdSource),
//     polled on its CPU;
//   - kernel datapath: the ready queue has a goroutine of its own woken by
//     the queue's doorbell (readyQueue.run), which posts into the QPs,
//     whose connections send from that same goroutine; a DTO EVD is
//     pumped by whichever goroutine made its completions (the QP's
//     Completed hook: the connection's receive goroutine, a ring loop, a
//     consumer's call).
//
// Each EP's rings have one consumer at a time, under ringMu: the owner of
// its ready queue, the QP's BeforeReceive taking receives ahead of data
// that arrived (and on the kernel datapath its Poll hook), or the session
// while they are handed over. What needs an event (a refused work
// request, a corrupt ring) or room (a full event ring) the owner hands to
// the session (session.handOff), which gives it back once seen to.

// sourcePoller is what a ready queue or EVD source needs of its
// xdpnet.Poller once added.
type sourcePoller interface {
	Wake()
	RemoveSource(xdpnet.Source) error
	Doorbell() (*os.File, error)
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

// completed is the Completed hook of an EP's QP on the kernel datapath,
// run by the goroutine that made completions once it released the QP: it
// forwards them to the EVDs' rings, and wakes the ring loop if requests
// wait in the rings for room the completions made.
func (s *session) completed(e *ep, recv, req *evd) {
	req.pump(s)
	if recv != req {
		recv.pump(s)
	}
	if e.pending() {
		e.queue.kick(e)
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
