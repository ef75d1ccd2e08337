package qp

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/softrnic/softrnic/completion"
	"github.com/softrnic/softrnic/ddp"
	"github.com/softrnic/softrnic/mpa"
)

type rxMode uint8

const (
	rxHeader   rxMode = iota // collecting the DDP header and fixed body
	rxTagged                 // placing into dst
	rxUntagged               // placing into the head receive buffer
	rxDone                   // header handled, no payload expected
)

// rxState is where the receive path stands inside the current DDP segment.
// Only the header and fixed body are ever copied; payload goes straight
// from the LLP's bytes into its target.
type rxState struct {
	hdr  [maxHeader]byte
	have int
	need int
	ulen int
	mode rxMode
	hlen int
	dst  []byte
	mr   *MR
	// proc: dst is in the shadow of this process-backed region, whose
	// process receives the octets (MR.Proc).
	proc *MR
	mo   int
	// stopped: a Terminate was decided; further input is discarded.
	stopped bool
	// rtr: the segment is the response to our Read RTR, nothing to finish.
	rtr bool
}

func (r *rxState) drop() {
	if r.mr != nil {
		r.mr.release()
		r.mr = nil
	}
	r.dst, r.proc = nil, nil
	r.stopped = true
}

// Receive takes in-order octets of the LLP stream. Payload is placed as it
// arrives; completions are pushed when messages end. Protocol errors are
// handled inside (a Terminate is queued); Receive itself only fails on
// misuse.
func (q *QP) Receive(b []byte) {
	for len(b) > 0 && !q.rx.stopped && (q.state == RTS || q.state == Closing) {
		n, ev, err := q.parser.Next(b)
		b = b[n:]
		if err != nil {
			var te ddp.TerminateError
			if !errors.As(err, &te) {
				te = ddp.LLPLocalCatastrophic
			}
			q.terminate(te)
			return
		}
		if ev.Kind == mpa.Data {
			q.rxData(ev)
		}
	}
}

func (q *QP) rxData(ev mpa.Event) {
	r := &q.rx
	data := ev.Data
	if ev.Offset == 0 {
		if r.mr != nil {
			r.mr.release()
		}
		*r = rxState{hdr: r.hdr, need: ddp.ControlLen, ulen: ev.ULPDULen}
	}
	for len(data) > 0 && r.mode == rxHeader {
		k := copy(r.hdr[r.have:r.need], data)
		r.have += k
		data = data[k:]
		if r.have < r.need {
			break
		}
		if !q.rxHeaderStep() {
			return
		}
	}
	if len(data) > 0 {
		q.place(data)
		if r.stopped {
			return
		}
	}
	if ev.End {
		q.holdTx = false
		if r.mode == rxHeader {
			// The ULPDU ended before its header did.
			q.terminate(ddp.DDPLocalCatastrophic)
			return
		}
		q.rxEnd()
	}
}

// rxHeaderStep advances once r.have == r.need; false stops the segment.
func (q *QP) rxHeaderStep() bool {
	r := &q.rx
	h := ddp.Header(r.hdr[:r.have])
	switch {
	case r.have == ddp.ControlLen:
		r.hlen = h.Len()
		r.need = r.hlen
		if r.ulen < r.hlen {
			q.terminate(ddp.DDPLocalCatastrophic)
			return false
		}
		return true
	case r.have == r.hlen:
		// RFC 5041 §7.1 then RFC 5040 §7: versions, opcode, queue.
		if err := ddp.CheckHeader(h); err != nil {
			q.terminate(err)
			return false
		}
		info := h.Opcode().Info()
		switch {
		case h.Opcode() == ddp.OpTerminate:
			r.need = min(r.ulen, maxHeader)
		case info.BodyLen > 0:
			if r.ulen != r.hlen+info.BodyLen {
				q.terminate(ddp.RDMAPOperationUnspecified)
				return false
			}
			r.need = r.hlen + info.BodyLen
		}
		if r.need > r.have {
			return true
		}
	}
	return q.startSegment()
}

// payloadLen is the payload of the current segment.
func (r *rxState) payloadLen() int { return r.ulen - r.need }

// startSegment validates the complete header and body and picks the target.
func (q *QP) startSegment() bool {
	r := &q.rx
	h := ddp.Header(r.hdr[:r.hlen])
	op := h.Opcode()
	plen := uint64(r.payloadLen())
	switch op {
	case ddp.OpWrite:
		t := ddp.Tagged(h)
		if plen == 0 {
			// RFC 5041 §7.1 validates non-zero-length segments only;
			// a zero-length Write is also the peer-to-peer RTR.
			r.mode = rxDone
			break
		}
		m, dst, err := placeTarget(q.cfg.Mem, q.cfg.PD, t.STag(), t.TO(), plen, RemoteWrite)
		if err != nil {
			q.terminate(err)
			return false
		}
		r.mr, r.dst, r.mode, r.proc = m, dst, rxTagged, procOf(m)
	case ddp.OpReadResponse:
		t := ddp.Tagged(h)
		if q.rtrRead && plen == 0 && t.STag() == RTRSTag {
			// The answer to our zero-length Read RTR.
			q.rtrRead = false
			r.mode, r.rtr = rxDone, true
			break
		}
		if q.orq.len() == 0 || q.orq.get(0).wr.Op != OpRead {
			q.terminate(ddp.RDMAPUnexpectedOpcode)
			return false
		}
		e := q.orq.get(0)
		sink := e.sink
		if t.STag() != sink.LKey {
			q.terminate(ddp.DDPTaggedInvalidSTag)
			return false
		}
		// In order, inside the sink: RFC 5040 §5.2 responses come in
		// order, so the next one starts where the last ended.
		if t.TO() != e.readTO || t.TO()+plen > sink.Addr+uint64(sink.Length) || t.TO()+plen < t.TO() {
			q.terminate(ddp.DDPTaggedBaseOrBounds)
			return false
		}
		off := t.TO() - sink.Addr
		r.dst, r.mode, r.proc = e.bufs[0][off:off+plen], rxTagged, procOf(e.mrs[0])
		e.readTO += plen
	case ddp.OpSend, ddp.OpSendInvalidate, ddp.OpSendSE, ddp.OpSendSEInvalidate:
		u := ddp.Untagged(h)
		if err := q.checkUntagged(u, &q.expSend); err != nil {
			q.terminate(err)
			return false
		}
		e := q.rq.get(0)
		mo := int(u.MO())
		if mo != e.got {
			q.terminate(ddp.DDPUntaggedInvalidMO)
			return false
		}
		if mo+int(plen) > e.total {
			q.terminate(ddp.DDPUntaggedTooLong)
			return false
		}
		r.mo, r.mode = mo, rxUntagged
	case ddp.OpImmediateData, ddp.OpImmediateDataSE:
		if err := q.checkUntagged(ddp.Untagged(h), &q.expSend); err != nil {
			q.terminate(err)
			return false
		}
		r.mode = rxDone
	case ddp.OpReadRequest, ddp.OpAtomicRequest:
		if err := q.rxRequest(op); err != nil {
			q.terminate(err)
			return false
		}
		r.mode = rxDone
	case ddp.OpAtomicResponse:
		u := ddp.Untagged(h)
		if u.MSN() != q.expAtomicRsp || q.orq.len() == 0 || !q.orq.get(0).isAtomic() {
			q.terminate(ddp.DDPUntaggedMSNRange)
			return false
		}
		r.mode = rxDone
	case ddp.OpTerminate:
		r.mode = rxDone
	}
	return true
}

func (e *sqe) isAtomic() bool { return e.wr.Op == OpFetchAdd || e.wr.Op == OpCmpSwap }

// checkUntagged checks the MSN of a message for queue 0 against the posted
// receives (RFC 5041 §7.1 untagged checks).
func (q *QP) checkUntagged(u ddp.Untagged, exp *ddp.MSN) error {
	if q.rq.len() == 0 {
		return ddp.DDPUntaggedNoBuffer
	}
	if u.MSN() != *exp {
		if u.MSN().InWindow(*exp, uint32(q.rq.len())) {
			// A later message before this one ended: out of order.
			return ddp.DDPUntaggedInvalidMO
		}
		return ddp.DDPUntaggedMSNRange
	}
	return nil
}

// rxRequest queues an inbound Read or atomic request after RDMAP's checks.
func (q *QP) rxRequest(op ddp.Opcode) error {
	r := &q.rx
	u := ddp.Untagged(r.hdr[:r.hlen])
	if !u.Header().Last() || u.MO() != 0 {
		return ddp.DDPUntaggedInvalidMO
	}
	if u.MSN() != q.expRead {
		return ddp.DDPUntaggedMSNRange
	}
	if q.irq.len() >= q.ird || q.irq.full() {
		// More than IRD outstanding (RFC 5040 §6.1): the stream is lost.
		return ddp.RDMAPCatastrophicLocalStream
	}
	body := r.hdr[r.hlen:r.need]
	e := irqePool.Get().(*irqe)
	if err := q.prepareRequest(e, op, body); err != nil {
		*e = irqe{}
		irqePool.Put(e)
		return err
	}
	q.irq.add(e)
	return nil
}

// prepareRequest fills a response entry from an inbound Read or atomic
// request's body; on failure it holds no region.
func (q *QP) prepareRequest(e *irqe, op ddp.Opcode, body []byte) error {
	if op == ddp.OpReadRequest {
		rr := ddp.ReadRequest(body)
		*e = irqe{sinkSTag: rr.SinkSTag(), sinkTO: rr.SinkTO(), size: int(rr.Size())}
		// A zero-length Read (the RTR among them) reads nothing and
		// checks nothing; the empty response goes back in order.
		if rr.Size() > 0 {
			m, src, err := sourceTarget(q.cfg.Mem, q.cfg.PD, rr.SrcSTag(), rr.SrcTO(), uint64(rr.Size()), RemoteRead)
			if err != nil {
				return err
			}
			e.src, e.mr = src, m
		}
	} else {
		f := ddp.AtomicRequest(body).Fields()
		if f.Op != ddp.AtomicFetchAdd && f.Op != ddp.AtomicCmpSwap {
			return ddp.RDMAPUnexpectedOpcode
		}
		if f.RemoteTO%8 != 0 {
			// RFC 7306 §5: a misaligned target is an operation error.
			return ddp.RDMAPCatastrophicLocalStream
		}
		m, target, err := sourceTarget(q.cfg.Mem, q.cfg.PD, f.RemoteSTag, f.RemoteTO, 8, RemoteAtomic)
		if err != nil {
			return err
		}
		*e = irqe{atomic: true, src: target, mr: m, req: f}
	}
	return nil
}

// place copies payload octets to their target.
func (q *QP) place(data []byte) {
	r := &q.rx
	switch r.mode {
	case rxTagged:
		if r.proc != nil {
			n := min(len(r.dst), len(data))
			if err := q.stagePlace(r.proc, r.dst[:n], data[:n]); err != nil {
				q.placeFailed(err)
				return
			}
			r.dst = r.dst[n:]
			break
		}
		n := copy(r.dst, data)
		r.dst = r.dst[n:]
	case rxUntagged:
		e := q.rq.get(0)
		off, n := r.mo, len(data)
		for i := 0; i < e.nsge && len(data) > 0; i++ {
			b := e.bufs[i]
			if off >= len(b) {
				off -= len(b)
				continue
			}
			var k int
			if m := procOf(e.mrs[i]); m != nil {
				k = min(len(b)-off, len(data))
				if err := q.stagePlace(m, b[off:off+k], data[:k]); err != nil {
					q.placeFailed(err)
					return
				}
			} else {
				k = copy(b[off:], data)
			}
			data = data[k:]
			off = 0
		}
		r.mo += n // startSegment checked that it all fits
		e.got = r.mo
	default:
		// Segments without payload that carry some anyway.
		q.terminate(ddp.RDMAPOperationUnspecified)
	}
}

// placeFailed ends the segment whose octets could not be written to the
// process behind their region (MR.Proc): the memory was unmapped since it
// was registered, or the process is gone. The fault is ours, not the
// peer's: its segment passed every check of RFC 5041 §7.1 and RFC 5040 §7,
// and the tagged buffer errors all say the peer erred (STag, bounds, PD),
// so the Terminate is DDP's Local Catastrophic Error (RFC 5041 §7.2, Layer
// DDP, Type 0), which Linux siw also sends when a copy into user memory
// fails. The local request the octets were for, a receive or a Read,
// completes with a local protection error; the others flush.
func (q *QP) placeFailed(err error) {
	var se *stageError
	op := ddp.Header(q.rx.hdr[:q.rx.hlen]).Opcode()
	if errors.As(err, &se) {
		op, err = se.op, se.err // gathered octets of that message's
	}
	err = fmt.Errorf("%w: %w", ErrProtection, err)
	// The request the octets were for, if there is one (the RTR's empty
	// Read Response has none).
	switch op {
	case ddp.OpReadResponse:
		if q.orq.len() > 0 && !q.rx.rtr {
			e := q.orq.get(0)
			e.status, e.err = completion.LocalProtectionError, err
		}
	case ddp.OpSend, ddp.OpSendInvalidate, ddp.OpSendSE, ddp.OpSendSEInvalidate:
		if q.rq.len() > 0 {
			id := q.rq.get(0).id
			q.popRecv()
			q.push(q.cfg.RecvCQ, completion.Completion{ID: id, QPN: q.cfg.QPN, Opcode: completion.OpRecv,
				Status: completion.LocalProtectionError, Err: err})
		}
	}
	q.terminate(ddp.DDPLocalCatastrophic)
}

// rxEnd finishes a segment whose octets (and CRC) all arrived.
func (q *QP) rxEnd() {
	r := &q.rx
	h := ddp.Header(r.hdr[:r.hlen])
	if h.Last() {
		// The message's octets reach the process before its
		// completion and before the next message is taken in.
		if err := q.flushStage(); err != nil {
			q.placeFailed(err)
			return
		}
	}
	if r.mr != nil {
		r.mr.release()
		r.mr = nil
	}
	r.proc = nil
	last := h.Last()
	switch op := h.Opcode(); op {
	case ddp.OpReadResponse:
		if r.rtr {
			return
		}
		e := q.orq.get(0)
		if last {
			if e.readTO != e.sink.Addr+uint64(e.sink.Length) {
				q.terminate(ddp.DDPTaggedBaseOrBounds)
				return
			}
			e.awaiting = false
			e.done = true
			q.orq.pop()
			q.retire()
		}
	case ddp.OpSend, ddp.OpSendInvalidate, ddp.OpSendSE, ddp.OpSendSEInvalidate:
		e := q.rq.get(0)
		e.got = r.mo
		if !last {
			return
		}
		c := completion.Completion{ID: e.id, QPN: q.cfg.QPN, Opcode: completion.OpRecv, ByteLen: uint32(e.got),
			Solicited: op == ddp.OpSendSE || op == ddp.OpSendSEInvalidate}
		if op == ddp.OpSendInvalidate || op == ddp.OpSendSEInvalidate {
			stag := ddp.Untagged(h).InvalidateSTag()
			// RFC 5040 §5.3: the STag is invalidated before the
			// completion is visible.
			m := q.cfg.Mem.Lookup(stag)
			if m == nil || m.PD != q.cfg.PD {
				q.terminate(ddp.RDMAPProtectionCannotInv)
				return
			}
			m.Invalidate()
			c.Invalidated, c.HasInvalidated = stag, true
		}
		q.popRecv()
		q.expSend++
		q.push(q.cfg.RecvCQ, c)
	case ddp.OpImmediateData, ddp.OpImmediateDataSE:
		e := q.rq.get(0)
		c := completion.Completion{ID: e.id, QPN: q.cfg.QPN, Opcode: completion.OpRecvImmediate,
			Solicited: op == ddp.OpImmediateDataSE}
		copy(c.Immediate[:], r.hdr[r.hlen:r.need])
		q.popRecv()
		q.expSend++
		q.push(q.cfg.RecvCQ, c)
	case ddp.OpReadRequest, ddp.OpAtomicRequest:
		q.expRead++
	case ddp.OpAtomicResponse:
		e := q.orq.get(0)
		rsp := ddp.AtomicResponse(r.hdr[r.hlen:r.need])
		if m := procOf(e.mrs[0]); m != nil {
			// From the request's own octets (its inline copy, which
			// an atomic does not use), not the shadow.
			binary.NativeEndian.PutUint64(e.inline[:8], rsp.Value())
			if err := m.store(e.bufs[0], e.inline[:8]); err != nil {
				// As placeFailed, but RDMAP places the result
				// (RFC 7306 §5): its Local Catastrophic Error
				// (RFC 5040 §4.8, Type 0).
				e.status, e.err = completion.LocalProtectionError, fmt.Errorf("%w: %w", ErrProtection, err)
				q.terminate(ddp.RDMAPLocalCatastrophic)
				return
			}
		} else {
			binary.NativeEndian.PutUint64(e.bufs[0], rsp.Value())
		}
		e.awaiting = false
		e.done = true
		q.orq.pop()
		q.expAtomicRsp++
		q.retire()
	case ddp.OpTerminate:
		q.rxTerminate(ddp.Terminate(r.hdr[r.hlen:r.need]))
	}
}

// PeerTerminateError is the error of a QP whose peer sent a Terminate.
type PeerTerminateError struct{ Cause ddp.TerminateError }

func (e *PeerTerminateError) Error() string { return fmt.Sprintf("qp: peer terminated: %v", e.Cause) }

// Unwrap gives the cause.
func (e *PeerTerminateError) Unwrap() error { return e.Cause }

func (q *QP) rxTerminate(t ddp.Terminate) {
	cause := ddp.RDMAPOperationUnspecified
	if t.IsValid() {
		cause = t.Cause()
	}
	err := &PeerTerminateError{Cause: cause}
	// The oldest Read or atomic, if any, is what the peer refused.
	if q.orq.len() > 0 {
		e := q.orq.get(0)
		e.status = statusFor(cause)
		e.err = err
	}
	q.event(Event{Kind: TerminateReceived, Err: err})
	q.enterError(err, Broken)
}

func statusFor(c ddp.TerminateError) completion.Status {
	switch {
	case c.Layer == ddp.LayerRDMAP && c.Type == 1, c.Layer == ddp.LayerDDP && c.Type == 1:
		return completion.RemoteAccessError
	case c.Layer == ddp.LayerRDMAP:
		return completion.RemoteOperationError
	default:
		return completion.RemoteInvalidRequest
	}
}

// terminate decides a Terminate for cause: the headers of the segment at
// fault go with it (RFC 5040 §4.8, Figure 10), the QP stops receiving, and
// after the Terminate is sent it goes to Error.
func (q *QP) terminate(cause error) { q.terminateWith(cause, true) }

// terminateLocal is terminate for an error the transmit side finds, in a
// request of ours or a response we owe: the segment the receive side is in
// has nothing to do with it, so no header goes with the Terminate (RFC 5040
// §4.8 lets the D and R flags say none is there).
func (q *QP) terminateLocal(cause error) { q.terminateWith(cause, false) }

func (q *QP) terminateWith(cause error, fromRx bool) {
	if q.term != nil || q.ended {
		return
	}
	var te ddp.TerminateError
	if !errors.As(cause, &te) {
		te = ddp.RDMAPLocalCatastrophic
	}
	r := &q.rx
	// hdr: the receive side's segment is the one at fault.
	hdr := fromRx && r.hlen > 0 && r.have >= r.hlen
	f := &ddp.TerminateFields{Error: te}
	if te.Layer != ddp.LayerLLP && hdr {
		f.DDPHeader = append([]byte(nil), r.hdr[:r.hlen]...)
		f.SegmentLenValid = true
		f.SegmentLen = uint16(r.ulen)
		h := ddp.Header(r.hdr[:r.hlen])
		if te.Layer == ddp.LayerRDMAP && te.Type == 1 && h.Opcode() == ddp.OpReadRequest && r.have >= r.hlen+ddp.ReadRequestLen {
			f.RDMAPHeader = append([]byte(nil), r.hdr[r.hlen:r.hlen+ddp.ReadRequestLen]...)
		}
	}
	q.term = f
	q.rx.drop()
	q.dropStage()
	q.state = Terminate
	// A Read or atomic whose response broke the protocol fails with that.
	if fromRx && r.hlen > 0 && q.orq.len() > 0 && (ddp.Header(r.hdr[:r.hlen]).Opcode() == ddp.OpReadResponse ||
		ddp.Header(r.hdr[:r.hlen]).Opcode() == ddp.OpAtomicResponse) {
		e := q.orq.get(0)
		if e.status == completion.Success {
			e.status = completion.BadResponse
			e.err = te
		}
	}
	q.event(Event{Kind: TerminateSent, Err: te})
}
