package daemon

import (
	"errors"
	"fmt"

	"github.com/softrnic/softrnic/completion"
	"github.com/softrnic/softrnic/ctl"
	"github.com/softrnic/softrnic/ddp"
	"github.com/softrnic/softrnic/internal/shm"
	"github.com/softrnic/softrnic/qp"
	"github.com/softrnic/softrnic/rnic"
	"github.com/softrnic/softrnic/xdpnet"
)

// batch bounds the work taken from one ring per step, so one busy EP does
// not starve the others.
const batch = 64

// poll is the session's data path. It steps while there is work; when there
// is none it raises the need-wakeup flags and arms the CQs, steps once more
// (work that raced in is not missed), and sleeps until woken. The watchdog
// watches it: busy before each round, idle while it sleeps (a loop asleep
// on its channel has nothing to do, however long).
func (s *session) poll() {
	defer s.loops.Done()
	beat := s.srv.watch.watch(fmt.Sprintf("session %d poll loop (pid %d)", s.id, s.cred.Pid))
	defer s.srv.watch.unwatch(beat)
	for {
		beat.busy()
		if s.step() {
			continue
		}
		s.setSleeping(true)
		if s.step() {
			s.setSleeping(false)
			continue
		}
		beat.idle()
		select {
		case <-s.wake:
		case <-s.done:
			return
		}
		beat.busy()
		s.setSleeping(false)
	}
}

func (s *session) doorbellLoop() {
	defer s.loops.Done()
	for {
		if err := shm.Wait(s.doorbell); err != nil {
			return
		}
		s.kick()
	}
}

func (s *session) setSleeping(sleeping bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var flag uint32
	if sleeping {
		flag = shm.NeedWakeup
	}
	eps, evds := s.dataPath()
	for _, o := range eps {
		if o.sq != nil && o.src == nil { // a polled EP's flags are its poller's
			o.sq.SetFlags(flag)
			o.rq.SetFlags(flag)
		}
	}
	for _, o := range evds {
		if sleeping && o.cq != nil && o.src == nil { // a polled EVD's poller arms its CQ
			o.cq.Arm(false)
		}
	}
}

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
	if sq == e.sq.Consumed() && rq == e.rq.Consumed() {
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
	progress, left := r.s.takeRQ(e, false)
	if !left {
		var sent bool
		sent, left = r.s.takeSQ(e, false)
		progress = progress || sent
	}
	e.ringMu.Unlock()
	if left {
		r.handOff()
	}
	return progress
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

// handOff asks the session to drain the rings.
func (r *ringSource) handOff() {
	r.e.handOff.Store(true)
	r.s.kick()
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
		r.s.kick()
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

// step does one round of work and reports whether there was any.
func (s *session) step() bool {
	s.evMu.Lock()
	events := s.pending
	s.pending = nil
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
	eps, evds := s.dataPath()
	for _, o := range eps {
		if o.sq != nil && o.qp != nil && (o.src == nil || o.handOff.Swap(false)) {
			// Receives first, all of them: a Send the client posted
			// after a receive may make the peer send to it at once.
			progress = s.drainRQ(o) || progress
			progress = s.drainSQ(o) || progress
		}
	}
	for _, o := range evds {
		progress = s.forward(o) || progress
	}
	for _, e := range evds {
		if e.produced {
			e.produced = false
			if e.ring.SwapFlags(0) == shm.Armed {
				_ = shm.Signal(e.notify)
			}
		}
	}
	return progress
}

// violation ends a session whose client corrupted shared state.
func (s *session) violation(what string, err error) {
	s.srv.log.Warn("client corrupted shared memory, closing session", "session", s.id, "what", what, "err", err)
	s.conn.Close()
	s.closing = true
}

// toSendWR validates a copied ring entry. The ring's operation codes are
// qp.SendOp's; the SGL is built in sgl, the EP's scratch array (the engine
// copies it), so posting allocates nothing.
func toSendWR(e *shm.SQE, sgl []qp.SGE) (qp.SendWR, error) {
	if e.Op > uint8(qp.OpImmediate) || int(e.NSGE) > min(shm.RingSGE, len(sgl)) || e.Flags&^uint8(qp.Signaled|qp.Solicited|qp.Fence) != 0 {
		return qp.SendWR{}, qp.ErrInvalidWR
	}
	wr := qp.SendWR{ID: e.ID, Op: qp.SendOp(e.Op), Flags: qp.Flags(e.Flags), RemoteSTag: e.RemoteSTag, RemoteTO: e.RemoteTO,
		InvalidateSTag: e.InvalidateSTag, Compare: e.Compare, Swap: e.Swap, Add: e.Compare, Immediate: e.Immediate}
	wr.SGL = copySGL(sgl[:e.NSGE], e.SGL[:])
	return wr, nil
}

// toRecvWR validates a copied receive-ring entry, building its SGL in sgl
// as toSendWR does.
func toRecvWR(e *shm.RQE, sgl []qp.SGE) (qp.RecvWR, error) {
	if int(e.NSGE) > min(shm.RQSGE, len(sgl)) {
		return qp.RecvWR{}, qp.ErrInvalidWR
	}
	return qp.RecvWR{ID: e.ID, SGL: copySGL(sgl[:e.NSGE], e.SGL[:])}, nil
}

// copySGL fills dst from the ring entry's SGEs and returns it.
func copySGL(dst []qp.SGE, src []shm.SGE) []qp.SGE {
	for i := range dst {
		dst[i] = qp.SGE{LKey: src[i].LKey, Addr: src[i].Addr, Length: src[i].Length}
	}
	return dst
}

// drainRings moves everything waiting in an EP's rings into the engine, as
// far as its queues take it; s.mu held.
func (s *session) drainRings(e *ep) {
	if e.sq == nil || e.qp == nil {
		return
	}
	// Bounded: a client that keeps posting cannot hold the session here.
	for i := 0; i < 1024 && (s.drainRQ(e) || s.drainSQ(e)); i++ {
	}
}

// drainSQ and drainRQ are the session's: s.mu held, and a request the
// engine refuses gets its event.
func (s *session) drainSQ(e *ep) bool { return s.drain(e, s.takeSQ) }
func (s *session) drainRQ(e *ep) bool { return s.drain(e, s.takeRQ) }

// drain runs take under the EP's ring lock; what it leaves for want of
// event room a polled EP keeps handed over.
func (s *session) drain(e *ep, take func(*ep, bool) (progress, left bool)) bool {
	e.ringMu.Lock()
	defer e.ringMu.Unlock()
	progress, left := take(e, true)
	if left && e.src != nil {
		e.handOff.Store(true)
	}
	return progress
}

// takeSQ moves send work requests from the ring into the engine, receives
// first; e.ringMu held. With report (the session, s.mu also held) a
// request the engine refuses gets an event, a corrupt ring ends the
// session, and left says requests wait for event room; without (the
// poller) a refused request or corrupt ring stays in the ring and left
// says the session must see to it.
func (s *session) takeSQ(e *ep, report bool) (progress, left bool) {
	for n := 0; n < batch; n++ {
		if report && e.req.backlogFull() {
			return progress, true
		}
		slot, err := e.sq.Peek()
		if err != nil {
			if report {
				s.violation("send ring", err)
			}
			return progress, true
		}
		if slot == nil {
			break
		}
		// A receive the client posted before this Send may have
		// reached its ring after takeRQ looked: take it first, or the
		// peer's answer to the Send could find no buffer.
		if _, l := s.takeRQ(e, report); l {
			return progress, true
		}
		sqe := shm.DecodeSQE(slot)
		wr, err := toSendWR(&sqe, e.sgl[:])
		if err == nil {
			err = e.qp.PostSend(&wr)
			if errors.Is(err, qp.ErrQueueFull) {
				break // back-pressure: the entry stays until completions free room
			}
		}
		if err != nil {
			if !report {
				return progress, true
			}
			s.emit(e.req, shm.EVE{Kind: shm.EventDTO, Status: uint8(postStatus(err)), Opcode: uint8(completion.OpSend), EP: e.h, ID: sqe.ID})
		}
		e.sq.Release()
		progress = true
	}
	return progress, false
}

// takeRQ is takeSQ for the receive ring.
func (s *session) takeRQ(e *ep, report bool) (progress, left bool) {
	for n := uint32(0); n < e.rq.Entries(); n++ {
		if report && e.recv.backlogFull() {
			return progress, true
		}
		slot, err := e.rq.Peek()
		if err != nil {
			if report {
				s.violation("receive ring", err)
			}
			return progress, true
		}
		if slot == nil {
			break
		}
		rqe := shm.DecodeRQE(slot)
		wr, err := toRecvWR(&rqe, e.sgl[:])
		if err == nil {
			err = e.qp.PostRecv(&wr)
			if errors.Is(err, qp.ErrQueueFull) {
				break
			}
		}
		if err != nil {
			if !report {
				return progress, true
			}
			s.emit(e.recv, shm.EVE{Kind: shm.EventDTO, Status: uint8(postStatus(err)), Opcode: uint8(completion.OpRecv), EP: e.h, ID: rqe.ID})
		}
		e.rq.Release()
		progress = true
	}
	return progress, false
}

// takeQueuedRecvs is the QP's BeforeReceive: the receives the client has
// put in the EP's ring go into the engine before it takes what arrived.
// A PostRecv returns once its entry is in the ring, and the session or
// poller takes it later; a Send that the peer made because of something
// that followed the PostRecv (a message on another EP, another process)
// could otherwise arrive first, find no buffer and end the connection
// with a Terminate. The entry was in the ring before the Send was made,
// so before it arrived: taking the ring here closes that window. It runs
// with no lock held, on the QP's receive loop or, polled (the xdp
// datapath), on its poller, which only tries the ring lock: a failure
// means the session is draining, receives first. What the engine refuses
// stays in the ring for the session, which is woken to report it.
func (s *session) takeQueuedRecvs(e *ep, polled bool) {
	if e.rq.Produced() == e.rq.Consumed() {
		return
	}
	if polled {
		if !e.ringMu.TryLock() {
			return
		}
	} else {
		e.ringMu.Lock()
	}
	_, left := s.takeRQ(e, false)
	e.ringMu.Unlock()
	if left {
		e.handOff.Store(true)
		s.kick()
	}
}

func postStatus(err error) completion.Status {
	switch {
	case errors.Is(err, qp.ErrProtection):
		return completion.LocalProtectionError
	case errors.Is(err, qp.ErrState):
		return completion.FlushError
	}
	return completion.LocalQPOperationError
}

// forward moves an EVD's backlog and then completions from its CQ into
// its ring, as many as the ring takes; the rest wait. A polled EVD is
// the poller's unless handed over: the session gives it back once
// everything is forwarded.
func (s *session) forward(e *evd) bool {
	if e.src != nil && !e.handOff.Load() {
		return false
	}
	e.ringMu.Lock()
	defer e.ringMu.Unlock()
	progress := s.flushBacklog(e)
	if e.cq == nil || len(e.backlog) > 0 {
		return progress
	}
	moved, _, err := e.forwardLocked(s.epOf)
	if err != nil {
		s.violation("event ring", err)
		return false
	}
	if moved {
		e.produced = true
	}
	if e.src != nil && e.cq.Len() == 0 {
		e.handOff.Store(false)
		e.src.pl.Wake() // it arms the CQ before it sleeps again
	}
	return progress || moved
}

// forwardLocked moves completions from the CQ into the ring, at most a
// batch; full says completions wait for room (the client is asked to ring
// the doorbell when it takes an event). e.ringMu held.
func (e *evd) forwardLocked(epOf func(qpn uint32) uint32) (moved, full bool, err error) {
	var c [1]completion.Completion
	for n := 0; n < batch; n++ {
		// One CQ lock per completion, Poll's. Len is asked only when the
		// ring is full, so that the client is asked for room only while
		// completions wait for it (else it would ring the doorbell for
		// every event it takes).
		slot, err := e.ring.Reserve()
		if slot == nil && err == nil && e.cq.Len() > 0 {
			if slot, err = e.askRoom(); slot == nil && err == nil {
				return moved, true, nil
			}
		}
		if err != nil {
			return moved, false, err
		}
		if slot == nil || e.cq.Poll(c[:]) == 0 {
			break
		}
		eve := shm.EVE{Kind: shm.EventDTO, Status: uint8(c[0].Status), Opcode: uint8(c[0].Opcode), ID: c[0].ID,
			ByteLen: c[0].ByteLen, Invalidated: c[0].Invalidated, Immediate: c[0].Immediate, EP: epOf(c[0].QPN)}
		if c[0].Solicited {
			eve.Flags |= shm.EVESolicited
		}
		if c[0].HasInvalidated {
			eve.Flags |= shm.EVEInvalidated
		}
		var te ddp.TerminateError
		if errors.As(c[0].Err, &te) {
			eve.Cause = uint32(te.Layer)<<16 | uint32(te.Type)<<8 | uint32(te.Code) | 1<<24
		}
		eve.Encode(slot)
		e.ring.Commit()
		moved = true
	}
	return moved, false, nil
}

// flushBacklog sends events that found the ring full; they go first.
// e.ringMu held.
func (s *session) flushBacklog(e *evd) bool {
	q := e.backlog
	progress := false
	for len(q) > 0 {
		slot, err := e.reserve()
		if err != nil || slot == nil {
			break
		}
		q[0].Encode(slot)
		e.ring.Commit()
		e.produced = true
		q = q[1:]
		progress = true
	}
	e.backlog = q
	return progress
}

// emit puts an event into an EVD's ring, or its backlog when full; s.mu
// held. A nil EVD drops it (DAT lets an EP have no EVD of a kind).
func (s *session) emit(e *evd, eve shm.EVE) {
	if e == nil {
		return
	}
	e.ringMu.Lock()
	defer e.ringMu.Unlock()
	if len(e.backlog) == 0 {
		if slot, err := e.reserve(); err == nil && slot != nil {
			eve.Encode(slot)
			e.ring.Commit()
			e.produced = true
			return
		}
	}
	e.backlog = append(e.backlog, eve)
}

// apply carries out a pending event; s.mu held.
func (s *session) apply(pe *pendingEvent) {
	switch {
	case pe.req != nil:
		s.applyRequest(pe.psp, pe.req)
	case pe.connectErr != nil:
		e := pe.ep
		if s.objects[e.h] != e {
			return
		}
		e.state = ctl.EPDisconnected
		var rej *rnic.RejectedError
		if errors.As(pe.connectErr, &rej) {
			e.peerPD = rej.PrivateData
		}
		// digest 003 §7.6: one terminal event, receives flushed.
		e.flushing = true
		e.qp.Disconnect(false)
		s.emit(e.conn, shm.EVE{Kind: shm.EventConnection, EP: e.h, Event: connectEvent(pe.connectErr)})
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
			e.state = ctl.EPConnected
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
		// connection's own end was; BROKEN is for a connection that
		// broke (reset, loss, protocol error) while CONNECTED.
		ev2 := ctl.EvDisconnected
		if ev.Kind == rnic.Broken && e.state != ctl.EPDisconnectPending {
			ev2 = ctl.EvBroken
		}
		e.state = ctl.EPDisconnected
		s.emit(e.conn, shm.EVE{Kind: shm.EventConnection, EP: e.h, Event: ev2})
		if e.freeing {
			s.dropEP(e)
		}
	}
}

// applyRequest turns a request at a PSP into a CR for the client.
func (s *session) applyRequest(p *psp, req *rnic.ConnRequest) {
	if s.objects[p.h] != p {
		_ = req.Reject(nil) // the PSP was freed meanwhile
		return
	}
	c := &cr{req: req, psp: p}
	switch {
	case p.rsp != nil:
		if p.rsp.state != ctl.EPReserved {
			_ = req.Reject(nil)
			return
		}
		c.ep = p.rsp
		c.ep.state = ctl.EPPassivePending
	case p.provider:
		// DAT_PSP_PROVIDER_FLAG: an EP with no PZ and no QP, in
		// TENTATIVE_CONNECTION_PENDING (digest 003 §2).
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
	s.emit(p.evd, eve)
}
