package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"syscall"

	"github.com/softrnic/softrnic/ctl"
	"github.com/softrnic/softrnic/ddp"
	"github.com/softrnic/softrnic/internal/shm"
	"github.com/softrnic/softrnic/rnic"
	"github.com/softrnic/softrnic/tcp"
)

// batch bounds the work taken from one ring per step, so one busy EP does
// not starve the others.
const batch = 64

// poll is the session's loop: it applies the connection events the QPs
// and listeners queue, and sees to the EPs and EVDs their owners handed
// over (a refused work request to report, an event ring full, a corrupt
// ring); the data path itself does not pass through it (sources.go). It
// steps while there is work and sleeps until kicked. The watchdog watches
// it: busy before each round, idle while it sleeps (a loop asleep on its
// channel has nothing to do, however long).
func (s *session) poll() {
	defer s.loops.Done()
	beat := s.srv.watch.watch(fmt.Sprintf("session %d poll loop (pid %d)", s.id, s.cred.Pid))
	defer s.srv.watch.unwatch(beat)
	for {
		beat.busy()
		if s.step() {
			continue
		}
		beat.idle()
		select {
		case <-s.wake:
		case <-s.done:
			return
		}
	}
}

// doorbellLoop kicks the session when the client rings the session's
// doorbell: it took events from a ring the session asked room in.
func (s *session) doorbellLoop() {
	defer s.loops.Done()
	for {
		if err := shm.Wait(s.doorbell); err != nil {
			return
		}
		s.kick()
	}
}

// handOff gives an EP's rings or an EVD to the session until it has seen
// to them; o's handOff flag is set. Any goroutine, no lock needed.
func (s *session) handOff(o any) {
	s.evMu.Lock()
	s.handed = append(s.handed, o)
	s.evMu.Unlock()
	s.kick()
}

// handOver hands o to the session unless it holds it already (flag is
// o's handOff).
func (s *session) handOver(flag *atomic.Bool, o any) {
	if !flag.Swap(true) {
		s.handOff(o)
	}
}

// step does one round of work and reports whether there was any. It
// visits only what was handed over, never every object of the session.
func (s *session) step() bool {
	s.evMu.Lock()
	events, handed := s.pending, s.handed
	s.pending, s.handed = nil, nil
	s.evMu.Unlock()

	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return false
	}
	progress := len(events) > 0
	for i := range events {
		s.apply(&events[i])
	}
	// What the session still holds from earlier rounds (an EVD waiting
	// for room in its ring) comes round again with what is new.
	held := s.held[:0]
	for _, o := range slices.Concat(s.held, handed) {
		switch o := o.(type) {
		case *ep:
			if s.objects[o.h] != o || !o.handOff.Swap(false) || o.sq == nil || o.qp == nil {
				continue
			}
			// Receives first, all of them: a Send the client posted
			// after a receive may make the peer send to it at once.
			progress = s.drainRQ(o) || progress
			progress = s.drainSQ(o) || progress
			switch {
			case o.handOff.Load():
				if !slices.Contains(held, any(o)) {
					held = append(held, o)
				}
			default:
				o.queue.kick(o) // posts may wait beyond the batch taken
			}
		case *readyQueue:
			s.violation("ready queue", shm.ErrCorrupt)
			return true
		case *evd:
			if s.objects[o.h] != o || !o.handOff.Load() || slices.Contains(held, any(o)) {
				continue
			}
			progress = s.forward(o) || progress
			if o.handOff.Load() {
				held = append(held, o)
			}
		}
	}
	s.held = held
	for _, e := range s.produced {
		e.produced = false
		if e.ring.SwapFlags(0) == shm.Armed {
			_ = shm.Signal(e.notify)
		}
	}
	clear(s.produced)
	s.produced = s.produced[:0]
	return progress
}

// violation ends a session whose client corrupted shared state.
func (s *session) violation(what string, err error) {
	s.srv.log.Warn("client corrupted shared memory, closing session", "session", s.id, "what", what, "err", err)
	s.conn.Close()
	s.closing = true
}

// apply carries out a pending event; s.mu held.
func (s *session) apply(pe *pendingEvent) {
	switch {
	case pe.ssp != nil:
		s.applySSP(pe.ssp, pe.req, pe.sspErr)
	case pe.req != nil:
		s.applyRequest(pe.psp, pe.req)
	case pe.connectErr != nil:
		e := pe.ep
		if s.objects[e.h] != e {
			return
		}
		if pe.ib != nil {
			if e.ib != pe.ib {
				return // an expectation the EP let go of, or that was met
			}
			e.ib = nil
		}
		e.setState(ctl.EPDisconnected)
		if errors.Is(pe.connectErr, rnic.ErrResources) {
			// Ran short after the connect was answered (a local
			// port the kernel found taken): the operator must hear.
			s.srv.log.Warn("connect out of resources", "session", s.id, "ep", e.h, "err", pe.connectErr)
		}
		var rej *rnic.RejectedError
		if errors.As(pe.connectErr, &rej) {
			e.peerPD = rej.PrivateData
		}
		// digest 003 §7.6: one terminal event, receives flushed.
		e.flushing = true
		e.qp.Disconnect(false)
		s.emit(e.conn, shm.EVE{Kind: shm.EventConnection, EP: e.h, Event: connectEvent(pe.connectErr), Cause: terminateCause(pe.connectErr)})
		if e.freeing {
			s.dropEP(e)
		}
	case pe.ev != nil:
		s.applyConnEvent(pe.ep, pe.ev)
	}
}

func (s *session) applyConnEvent(e *ep, ev *rnic.ConnEvent) {
	if s.objects[e.h] != e {
		return
	}
	switch ev.Kind {
	case rnic.Established:
		if e.state == ctl.EPActivePending {
			e.peerPD = ev.PrivateData
		}
		if e.state == ctl.EPActivePending || e.state == ctl.EPCompletionPending {
			e.setState(ctl.EPConnected)
			e.local, e.remote = e.qp.Addrs()
			s.emit(e.conn, shm.EVE{Kind: shm.EventConnection, EP: e.h, Event: ctl.EvEstablished})
		}
	case rnic.Disconnected, rnic.Broken:
		if e.flushing {
			e.flushing = false
			return
		}
		if e.state == ctl.EPDisconnected || e.state == ctl.EPUnconnected {
			return
		}
		// digest 003 rule 11: a disconnect the consumer asked for,
		// graceful or abrupt, ends in DISCONNECTED, whatever the
		// connection's own end was. So does the peer's abrupt
		// disconnect, a TCP reset (digest 003 §2: a "DISCONNECTED
		// upcall"; libdaplofa over iw_cm reports it so, and DAT
		// programs such as dapltest wait for it). BROKEN is for a
		// connection that broke while CONNECTED: loss, a Terminate, a
		// protocol error.
		ev2 := ctl.EvDisconnected
		if ev.Kind == rnic.Broken && e.state != ctl.EPDisconnectPending && !peerReset(ev.Err) {
			ev2 = ctl.EvBroken
		}
		if e.state == ctl.EPConnected && !e.freeing {
			// (Freeing a connected EP is its consumer's abort.)
			s.logEnded(e, ev)
		}
		e.setState(ctl.EPDisconnected)
		s.emit(e.conn, shm.EVE{Kind: shm.EventConnection, EP: e.h, Event: ev2, Cause: terminateCause(ev.Err)})
		if e.freeing {
			s.dropEP(e)
		}
	}
}

// logEnded logs a connection that ended without its consumer asking: a
// peer's disconnect at Info, a reset or a break at Warn, with the cause;
// a few a second, so that a peer daemon going away with ten thousand
// connections costs a few lines.
func (s *session) logEnded(e *ep, ev *rnic.ConnEvent) {
	ok, quiet := s.srv.ended.allow(8)
	if !ok {
		return
	}
	level := slog.LevelInfo
	if ev.Kind == rnic.Broken {
		level = slog.LevelWarn
	}
	s.srv.log.Log(context.Background(), level, "connection ended", "session", s.id, "ep", e.h, "local", e.local, "remote", e.remote,
		"how", ev.Kind.String(), "err", ev.Err, "since_last_logged", quiet)
}

// terminateCause is the EVE.Cause of a connection that ended with a
// Terminate, sent or received (an MPA negotiation the peer cannot meet, a
// protocol error), or 0.
func terminateCause(err error) uint32 {
	var te ddp.TerminateError
	if errors.As(err, &te) {
		return shm.PackCause(te)
	}
	return 0
}

// peerReset: the connection ended with the peer's reset (on the kernel
// datapath a write may meet it first, as EPIPE).
func peerReset(err error) bool {
	return errors.Is(err, tcp.ErrReset) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// applyRequest turns a request at a PSP into a CR for the client.
func (s *session) applyRequest(p *psp, req *rnic.ConnRequest) {
	if s.objects[p.h] != p {
		_ = req.Reject(nil) // the PSP was freed meanwhile
		return
	}
	s.offerRequest(&cr{req: req, psp: p}, p.evd, p.rsp, p.provider)
}

// offerRequest gives the client the CR c on evd: for reserved, the EP an
// RSP or SSP reserved for it (which must still be RESERVED), or with
// provider an EP the provider makes, with no PZ and no QP, in
// TENTATIVE_CONNECTION_PENDING (DAT_PSP_PROVIDER_FLAG, digest 003 §2); a
// request that cannot be given is rejected. s.mu held.
func (s *session) offerRequest(c *cr, evd *evd, reserved *ep, provider bool) {
	req := c.req
	switch {
	case reserved != nil:
		if reserved.state != ctl.EPReserved || s.objects[reserved.h] != reserved {
			_ = req.Reject(nil)
			return
		}
		c.ep = reserved
		c.ep.setState(ctl.EPPassivePending)
	case provider:
		e := &ep{state: ctl.EPTentativePending}
		h, err := s.add(e)
		if err != nil {
			_ = req.Reject(nil)
			return
		}
		e.h = h
		c.ep = e
	}
	h, err := s.add(c)
	if err != nil {
		_ = req.Reject(nil)
		return
	}
	c.h = h
	eve := shm.EVE{Kind: shm.EventCR, Handle: h}
	if c.ep != nil {
		eve.EP = c.ep.h
	}
	s.emit(evd, eve)
}
