package daemon

import (
	"errors"

	"github.com/softrnic/softrnic/completion"
	"github.com/softrnic/softrnic/ddp"
	"github.com/softrnic/softrnic/internal/shm"
	"github.com/softrnic/softrnic/qp"
)

// toSendWR validates a copied ring entry and converts its shm codes to the
// engine's (ringcodes.go); the SGL is built in sgl, the EP's scratch array
// (the engine copies it), so posting allocates nothing.
func toSendWR(e *shm.SQE, sgl []qp.SGE) (qp.SendWR, error) {
	if e.Op >= shm.NumSQOps || int(e.NSGE) > min(shm.RingSGE, len(sgl)) || e.Flags&^shm.WRFlagsValid != 0 {
		return qp.SendWR{}, qp.ErrInvalidWR
	}
	wr := qp.SendWR{ID: e.ID, Op: sendOps[e.Op], Flags: toQPFlags(e.Flags), RemoteSTag: e.RemoteSTag, RemoteTO: e.RemoteTO,
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
// event room keeps the rings handed over to the session.
func (s *session) drain(e *ep, take func(*ep, bool) (progress, left bool)) bool {
	e.ringMu.Lock()
	defer e.ringMu.Unlock()
	progress, left := take(e, true)
	if left {
		s.handOver(&e.handOff, e)
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
	// The batch goes to the wire once, after the last post.
	e.qp.BeginPosts()
	defer e.qp.EndPosts()
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
			s.emit(e.req, shm.EVE{Kind: shm.EventDTO, Status: uint8(postStatus(err)), Opcode: shm.DTOSend, EP: e.h, ID: sqe.ID})
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
			s.emit(e.recv, shm.EVE{Kind: shm.EventDTO, Status: uint8(postStatus(err)), Opcode: shm.DTORecv, EP: e.h, ID: rqe.ID})
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
		s.handOver(&e.handOff, e)
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

// forward moves a handed-over EVD's backlog and then completions from its
// CQ into its ring, as many as the ring takes; the rest wait. Once
// everything is forwarded the session gives the EVD back to its owner (a
// poller's source, or on the kernel datapath the goroutines that complete
// and pump it). s.mu held.
func (s *session) forward(e *evd) bool {
	e.ringMu.Lock()
	progress := s.flushBacklog(e)
	if len(e.backlog) > 0 {
		e.ringMu.Unlock()
		return progress
	}
	if e.cq != nil {
		moved, _, err := e.forwardLocked(s.epOf)
		if err != nil {
			e.ringMu.Unlock()
			s.violation("event ring", err)
			return false
		}
		if moved {
			s.noteProduced(e)
		}
		progress = progress || moved
		if e.cq.Len() > 0 {
			e.ringMu.Unlock()
			return progress
		}
	}
	e.handOff.Store(false)
	e.ringMu.Unlock()
	switch {
	case e.src != nil:
		e.src.pl.Wake() // it arms the CQ before it sleeps again
	case e.cq != nil:
		e.pump(s) // what was completed while the session held it
	}
	return progress
}

// noteProduced marks an EVD the session produced into, for the client to
// be signalled at the end of the step; s.mu held.
func (s *session) noteProduced(e *evd) {
	if !e.produced {
		e.produced = true
		s.produced = append(s.produced, e)
	}
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
		eve := shm.EVE{Kind: shm.EventDTO, Status: uint8(c[0].Status), Opcode: toDTOOpcode(c[0].Opcode), ID: c[0].ID,
			ByteLen: c[0].ByteLen, Invalidated: c[0].Invalidated, Immediate: c[0].Immediate, EP: epOf(c[0].QPN)}
		if c[0].Solicited {
			eve.Flags |= shm.EVESolicited
		}
		if c[0].HasInvalidated {
			eve.Flags |= shm.EVEInvalidated
		}
		var te ddp.TerminateError
		if errors.As(c[0].Err, &te) {
			eve.Cause = shm.PackCause(te)
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
		s.noteProduced(e)
		q = q[1:]
		progress = true
	}
	e.backlog = q
	return progress
}

// emit puts an event into an EVD's ring, or its backlog when full, which
// hands the EVD to the session until the backlog is gone; s.mu held. A nil
// EVD drops it (DAT lets an EP have no EVD of a kind).
func (s *session) emit(e *evd, eve shm.EVE) {
	if e == nil {
		return
	}
	e.ringMu.Lock()
	defer e.unlockRing(s)
	if len(e.backlog) == 0 {
		if slot, err := e.reserve(); err == nil && slot != nil {
			eve.Encode(slot)
			e.ring.Commit()
			s.noteProduced(e)
			return
		}
	}
	e.backlog = append(e.backlog, eve)
	s.handOver(&e.handOff, e)
}

// unlockRing releases the ring lock the session took, and forwards what a
// pump left to it meanwhile (evd.pump).
func (e *evd) unlockRing(s *session) {
	e.ringMu.Unlock()
	if e.again.Load() {
		e.pump(s)
	}
}
