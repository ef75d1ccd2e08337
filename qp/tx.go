package qp

import (
	"fmt"

	"github.com/softrnic/softrnic/completion"
	"github.com/softrnic/softrnic/ddp"
	"github.com/softrnic/softrnic/mpa"
)

// maxHeader holds the largest DDP header plus fixed RDMAP body.
const maxHeader = ddp.UntaggedHeaderLen + ddp.AtomicRequestLen

// irqe is an inbound Read or atomic request we owe a response to.
type irqe struct {
	atomic   bool
	sinkSTag uint32
	sinkTO   uint64
	size     int
	sent     int
	src      []byte
	mr       *MR
	// fetched: the octets of a process-backed source read into its
	// shadow, fetchAhead at a time as the response is served.
	fetched int
	// atomics; word carries a process-backed target's value.
	req  ddp.AtomicRequestFields
	word [8]byte
}

func (e *irqe) release() {
	if e.mr != nil {
		e.mr.release()
		e.mr = nil
	}
	e.src = nil
}

// hasWork reports whether Transmit would produce anything.
func (q *QP) hasWork() bool {
	if q.term != nil {
		return !q.termDone
	}
	if q.state != RTS && q.state != Closing || q.holdTx {
		return false
	}
	return q.rtr != 0 || q.irq.len() > 0 || q.sqReady()
}

// Pending reports whether Transmit has FPDUs to produce.
func (q *QP) Pending() bool { return q.hasWork() }

// sqReady reports whether the next send request can go now.
func (q *QP) sqReady() bool {
	if q.txSQ >= q.sq.len() {
		return false
	}
	e := q.sq.get(q.txSQ)
	if e.wr.Flags&Fence != 0 && e.sent == 0 && q.orq.len() > 0 {
		return false
	}
	// Our Read RTR is a Read the peer counts against its IRD until it
	// has answered: it takes one of ORD's places until then.
	outstanding := q.orq.len()
	if q.rtrRead {
		outstanding++
	}
	if (e.wr.Op == OpRead || e.wr.Op == OpFetchAdd || e.wr.Op == OpCmpSwap) && outstanding >= max(q.ord, 0) {
		return false
	}
	return true
}

// Transmit fills buf with whole FPDUs (as many as fit in len(buf), from
// index 0; nothing past len) and returns their length. The owner hands
// them to the LLP and reports Sent.
func (q *QP) Transmit(buf []byte) int {
	out := buf[:0:len(buf)]
	for {
		var ok bool
		if q.term != nil {
			// Nothing follows a Terminate (RFC 5040 §6.2.1).
			if !q.termDone {
				out, _ = q.txTerminate(out)
			}
			break
		}
		if q.state != RTS && q.state != Closing || q.holdTx {
			break
		}
		if q.rtr != 0 {
			if out, ok = q.txRTR(out); !ok {
				break
			}
			continue
		}
		// Responses and the SQ take turns by message, never by FPDU: a
		// message's FPDUs go out back to back (Linux siw rejects a Read
		// Response interleaved with a Write: "packet intersection").
		resp, sq := q.irq.len() > 0, q.sqReady()
		if q.txMid == midResponse && !resp || q.txMid == midSQ && !sq {
			q.txMid = midNone // its queue was flushed
		}
		switch {
		case q.txMid == midResponse:
			out, ok = q.txResponse(out)
		case q.txMid == midSQ:
			out, ok = q.txSend(out)
		case resp && (!sq || q.preferQ):
			out, ok = q.txResponse(out)
		case sq:
			out, ok = q.txSend(out)
		}
		if q.txMid == midNone {
			q.preferQ = !q.preferQ
		}
		if !ok {
			break
		}
	}
	q.txPos += uint64(len(out))
	return len(out)
}

// fpdu frames one ULPDU into out if it fits.
func (q *QP) fpdu(out, hdr, payload []byte) ([]byte, bool) {
	if q.framer.WireLen(len(hdr)+len(payload)) > cap(out)-len(out) {
		return out, false
	}
	return q.framer.Append(out, hdr, payload), true
}

// chunk returns the next run of a request's data: at most max octets, within
// one SGE.
func chunk(bufs [][]byte, nsge, off, limit int) []byte {
	for i := 0; i < nsge; i++ {
		if off < len(bufs[i]) {
			b := bufs[i][off:]
			return b[:min(len(b), limit)]
		}
		off -= len(bufs[i])
	}
	return nil
}

func (q *QP) txSend(out []byte) ([]byte, bool) {
	e := q.sq.get(q.txSQ)
	var hdr [maxHeader]byte
	var ok bool
	switch e.wr.Op {
	case OpSend, OpSendInvalidate:
		op := ddp.OpSend
		if e.wr.Op == OpSendInvalidate {
			op = ddp.OpSendInvalidate
		}
		if e.wr.Flags&Solicited != 0 {
			op += ddp.OpSendSE - ddp.OpSend
		}
		p := chunk(e.bufs[:], e.nsge, e.sent, q.mulpdu-ddp.UntaggedHeaderLen)
		if e.proc {
			if err := e.fetchFor(e.sent, len(p)); err != nil {
				q.failLocal(e, len(out), err)
				return out, true
			}
		}
		last := e.sent+len(p) == e.total
		ddp.Untagged(hdr[:]).Encode(&ddp.UntaggedFields{Last: last, Opcode: op, InvalidateSTag: e.wr.InvalidateSTag,
			QN: ddp.QNSend, MSN: q.sendMSN, MO: uint32(e.sent)})
		if out, ok = q.fpdu(out, hdr[:ddp.UntaggedHeaderLen], p); !ok {
			return out, false
		}
		e.sent += len(p)
		q.txMid = midSQ
		if last {
			q.sendMSN++
			q.queued(e, len(out))
			q.txMid = midNone
		}
	case OpImmediate:
		op := ddp.OpImmediateData
		if e.wr.Flags&Solicited != 0 {
			op = ddp.OpImmediateDataSE
		}
		ddp.Untagged(hdr[:]).Encode(&ddp.UntaggedFields{Last: true, Opcode: op, QN: ddp.QNSend, MSN: q.sendMSN})
		copy(hdr[ddp.UntaggedHeaderLen:], e.wr.Immediate[:])
		if out, ok = q.fpdu(out, hdr[:ddp.UntaggedHeaderLen+ddp.ImmediateDataLen], nil); !ok {
			return out, false
		}
		q.sendMSN++
		q.queued(e, len(out))
	case OpWrite:
		p := chunk(e.bufs[:], e.nsge, e.sent, q.mulpdu-ddp.TaggedHeaderLen)
		if e.proc {
			if err := e.fetchFor(e.sent, len(p)); err != nil {
				q.failLocal(e, len(out), err)
				return out, true
			}
		}
		last := e.sent+len(p) == e.total
		ddp.Tagged(hdr[:]).Encode(&ddp.TaggedFields{Last: last, Opcode: ddp.OpWrite, STag: e.wr.RemoteSTag,
			TO: e.wr.RemoteTO + uint64(e.sent)})
		if out, ok = q.fpdu(out, hdr[:ddp.TaggedHeaderLen], p); !ok {
			return out, false
		}
		e.sent += len(p)
		q.txMid = midSQ
		if last {
			q.queued(e, len(out))
			q.txMid = midNone
		}
	case OpRead:
		ddp.Untagged(hdr[:]).Encode(&ddp.UntaggedFields{Last: true, Opcode: ddp.OpReadRequest, QN: ddp.QNReadRequest, MSN: q.readMSN})
		ddp.ReadRequest(hdr[ddp.UntaggedHeaderLen:]).Encode(&ddp.ReadRequestFields{
			SinkSTag: e.sink.LKey, SinkTO: e.sink.Addr, Size: uint32(e.total),
			SrcSTag: e.wr.RemoteSTag, SrcTO: e.wr.RemoteTO})
		if out, ok = q.fpdu(out, hdr[:ddp.UntaggedHeaderLen+ddp.ReadRequestLen], nil); !ok {
			return out, false
		}
		q.readMSN++
		e.awaiting = true
		e.readTO = e.sink.Addr
		q.orq.add(e)
		q.queued(e, len(out))
	case OpFetchAdd, OpCmpSwap:
		f := ddp.AtomicRequestFields{RequestID: uint32(q.readMSN), RemoteSTag: e.wr.RemoteSTag, RemoteTO: e.wr.RemoteTO,
			CompareMask: ^uint64(0)}
		if e.wr.Op == OpFetchAdd {
			f.Op, f.AddSwapData = ddp.AtomicFetchAdd, e.wr.Add
		} else {
			f.Op, f.AddSwapData, f.AddSwapMask, f.CompareData = ddp.AtomicCmpSwap, e.wr.Swap, ^uint64(0), e.wr.Compare
		}
		ddp.Untagged(hdr[:]).Encode(&ddp.UntaggedFields{Last: true, Opcode: ddp.OpAtomicRequest, QN: ddp.QNReadRequest, MSN: q.readMSN})
		ddp.AtomicRequest(hdr[ddp.UntaggedHeaderLen:]).Encode(&f)
		if out, ok = q.fpdu(out, hdr[:ddp.UntaggedHeaderLen+ddp.AtomicRequestLen], nil); !ok {
			return out, false
		}
		q.readMSN++
		e.awaiting = true
		q.orq.add(e)
		q.queued(e, len(out))
	case OpLocalInvalidate:
		m := q.cfg.Mem.Lookup(e.wr.InvalidateSTag)
		if m == nil || m.PD != q.cfg.PD {
			e.status = completion.LocalProtectionError
			e.err = ErrProtection
		} else {
			m.Invalidate()
		}
		q.queued(e, len(out))
	}
	return out, true
}

// failLocal ends a Send or Write whose process-backed memory could not be
// read (unmapped since it was registered, or the process gone) as it went
// out: it completes in order with a local protection error (the peer saw
// none of it, or the start of a message that never ends), and the
// QP terminates with an RDMAP Local Catastrophic Error (RFC 5040 §4.8,
// Type 0), as RDMAC Verbs §8.3.2 asks of a request that fails locally (Linux
// siw quotes it and does the same): the requests after it flush instead of
// going out, such as the Immediate or the Send that would tell the peer the
// data is there.
func (q *QP) failLocal(e *sqe, after int, err error) {
	e.status = completion.LocalProtectionError
	e.err = fmt.Errorf("%w: %w", ErrProtection, err)
	q.queued(e, after)
	q.terminateLocal(ddp.RDMAPLocalCatastrophic)
}

// queued marks a send request wholly framed; it completes once the LLP has
// taken its last octet (or, for Reads and atomics, when the response comes).
func (q *QP) queued(e *sqe, after int) {
	e.queued = true
	e.endPos = q.txPos + uint64(after)
	q.txSQ++
}

func (q *QP) txResponse(out []byte) ([]byte, bool) {
	e := q.irq.get(0)
	var hdr [maxHeader]byte
	var ok bool
	if e.atomic {
		const rspLen = ddp.UntaggedHeaderLen + ddp.AtomicResponseLen
		// Check room first: an atomic is executed exactly once.
		if q.framer.WireLen(rspLen) > cap(out)-len(out) {
			return out, false
		}
		var orig uint64
		var err error
		if m := procOf(e.mr); m != nil {
			if orig, err = executeProcAtomic(m, e.src, &e.word, &e.req); err != nil {
				q.remoteSourceFailed()
				return out, true
			}
		} else if orig, err = executeAtomic(e.src, &e.req); err != nil {
			q.terminate(err)
			return out, true
		}
		ddp.Untagged(hdr[:]).Encode(&ddp.UntaggedFields{Last: true, Opcode: ddp.OpAtomicResponse, QN: ddp.QNAtomicResponse, MSN: q.atomicRspMSN})
		ddp.AtomicResponse(hdr[ddp.UntaggedHeaderLen:]).Encode(e.req.RequestID, orig)
		out, _ = q.fpdu(out, hdr[:rspLen], nil)
		q.atomicRspMSN++
		q.popResponse()
		return out, true
	}
	p := e.src[e.sent:]
	p = p[:min(len(p), q.mulpdu-ddp.TaggedHeaderLen)]
	if m := procOf(e.mr); m != nil && e.sent+len(p) > e.fetched {
		// Read as it is served, after the requests before it (an
		// atomic on the same octets).
		end := min(e.size, max(e.sent+len(p), e.fetched+fetchAhead))
		if err := m.fetch(e.src[e.fetched:end]); err != nil {
			q.remoteSourceFailed()
			return out, true
		}
		e.fetched = end
	}
	last := e.sent+len(p) == e.size
	ddp.Tagged(hdr[:]).Encode(&ddp.TaggedFields{Last: last, Opcode: ddp.OpReadResponse, STag: e.sinkSTag, TO: e.sinkTO + uint64(e.sent)})
	if out, ok = q.fpdu(out, hdr[:ddp.TaggedHeaderLen], p); !ok {
		return out, false
	}
	e.sent += len(p)
	q.txMid = midResponse
	if last {
		q.popResponse()
		q.txMid = midNone
	}
	return out, true
}

// remoteSourceFailed terminates for the source of the peer's Read, or the
// target of its atomic, in a region whose process memory could not be read
// or written as the response was served (unmapped since it was registered,
// or the process gone). The peer named a region it was granted, within its
// bounds and rights, but its octets are not there: an RDMAP Remote
// Protection Error (RFC 5040 §4.8, Type 1) with the Unspecified code, as no
// other fits, so that the peer's Read or atomic completes as a remote
// access error. No header goes with it: the request arrived earlier
// (terminateLocal).
func (q *QP) remoteSourceFailed() { q.terminateLocal(ddp.RDMAPProtectionUnspecified) }

func (q *QP) txTerminate(out []byte) ([]byte, bool) {
	var hdr [ddp.UntaggedHeaderLen]byte
	ddp.Untagged(hdr[:]).Encode(&ddp.UntaggedFields{Last: true, Opcode: ddp.OpTerminate, QN: ddp.QNTerminate, MSN: 1})
	if cap(q.termBuf) < q.term.Len() {
		q.termBuf = make([]byte, q.term.Len())
	}
	body := q.termBuf[:q.term.Len()]
	ddp.Terminate(body).Encode(q.term)
	out, ok := q.fpdu(out, hdr[:], body)
	if ok {
		q.termDone = true
	}
	return out, ok
}

// Nudge queues a zero-length RDMA Write, which RFC 5041 §7.1 makes valid at
// any time and checks nothing. Its only effect is that the peer's LLP sees
// new data, which unsticks a peer that missed the arrival of earlier FPDUs
// (Linux siw races its QP's takeover of the socket against the first FPDU).
func (q *QP) Nudge() {
	if q.state == RTS && q.rtr == 0 && q.term == nil {
		q.rtr = mpa.RTRWrite
	}
}

// RTRSTag is the STag of a zero-length RTR Write or Read: any non-zero value
// serves, since zero-length tagged segments are not validated (RFC 5041
// §7.1); Linux siw uses 1 too.
const RTRSTag = 1

// txRTR sends the peer-to-peer ready-to-receive message (RFC 6581 §9.2).
func (q *QP) txRTR(out []byte) ([]byte, bool) {
	var hdr [maxHeader]byte
	var ulpdu []byte
	switch q.rtr {
	case mpa.RTRWrite:
		ddp.Tagged(hdr[:]).Encode(&ddp.TaggedFields{Last: true, Opcode: ddp.OpWrite, STag: RTRSTag})
		ulpdu = hdr[:ddp.TaggedHeaderLen]
	case mpa.RTRSend:
		ddp.Untagged(hdr[:]).Encode(&ddp.UntaggedFields{Last: true, Opcode: ddp.OpSend, QN: ddp.QNSend, MSN: q.sendMSN})
		ulpdu = hdr[:ddp.UntaggedHeaderLen]
		q.sendMSN++
	case mpa.RTRRead:
		ddp.Untagged(hdr[:]).Encode(&ddp.UntaggedFields{Last: true, Opcode: ddp.OpReadRequest, QN: ddp.QNReadRequest, MSN: q.readMSN})
		ddp.ReadRequest(hdr[ddp.UntaggedHeaderLen:]).Encode(&ddp.ReadRequestFields{SinkSTag: RTRSTag, SrcSTag: RTRSTag})
		ulpdu = hdr[:ddp.UntaggedHeaderLen+ddp.ReadRequestLen]
		q.readMSN++
		q.rtrRead = true
	}
	out, ok := q.fpdu(out, ulpdu, nil)
	if ok {
		q.rtr = 0
	}
	return out, ok
}
