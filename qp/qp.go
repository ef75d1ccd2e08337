// Package qp is the queue pair engine: RFC 5040 states, send-queue
// processing into FPDUs, receive placement into memory regions, the RDMA
// Read and atomic responder, Terminate and flush.
//
// The engine is a state machine with no goroutines, no clock and no system
// calls but the copies to and from process-backed regions (MR.Proc). Its
// owner (a poller, or the kernel-TCP glue in package rnic) drives it and
// serialises every call:
//
//	PostSend, PostRecv        the consumer's work requests
//	Receive(stream octets)    in-order bytes from the LLP, placed at once
//	Transmit(buf) n           FPDUs to hand to the LLP, as many as fit
//	Sent(total)               the LLP accepted that many octets
//	Disconnect, LLPClosed     the close paths of digest 004 §6
//
// Completions go to the send and receive CQs; connection-level happenings
// (a Terminate sent or received, the end of the connection) go to the
// Events callback, exactly one terminal event per QP.
package qp

import (
	"errors"
	"fmt"
	"sync"

	"github.com/softrnic/softrnic/completion"
	"github.com/softrnic/softrnic/ddp"
	"github.com/softrnic/softrnic/mpa"
)

// State is the RFC 5040 QP state (with the transitions of digest 004 §6).
type State uint8

// States.
const (
	Idle State = iota
	RTS
	Closing
	Terminate
	Error
)

func (s State) String() string {
	return [...]string{"IDLE", "RTS", "CLOSING", "TERMINATE", "ERROR"}[s]
}

// Limits.
const (
	// MaxDepth bounds a work queue's depth (the rings' indices are 32
	// bits).
	MaxDepth      = 1 << 24
	MaxSGE        = 8
	MaxInline     = 256
	DefaultInline = 64
)

// EventKind classifies connection events.
type EventKind uint8

// Events.
const (
	// TerminateSent: we found a protocol error, sent a Terminate and stop.
	TerminateSent EventKind = iota
	// TerminateReceived: the peer reported an error.
	TerminateReceived
	// Disconnected: the connection ended gracefully (terminal).
	Disconnected
	// Broken: the connection ended abortively or by error (terminal).
	Broken
)

func (k EventKind) String() string {
	return [...]string{"terminate-sent", "terminate-received", "disconnected", "broken"}[k]
}

// Event is a connection-level happening.
type Event struct {
	Kind EventKind
	Err  error
}

// Config describes a QP.
type Config struct {
	QPN uint32
	PD  uint32
	// SQDepth and RQDepth bound the work queues.
	SQDepth, RQDepth int
	// IRD and ORD: the most inbound and outbound RDMA Reads and atomics
	// outstanding (before negotiation; Connect applies the MPA outcome).
	IRD, ORD int
	// MaxInline bounds inline data, up to MaxInline; 0 means DefaultInline.
	MaxInline int
	// SendCQ and RecvCQ receive completions; they may be the same CQ.
	SendCQ, RecvCQ *completion.CQ
	Mem            Memory
	// Events receives connection events; it must not block.
	Events func(Event)
}

// ErrConfig reports a bad Config.
var ErrConfig = errors.New("qp: invalid configuration")

// QP is one queue pair.
type QP struct {
	cfg Config

	// LLP framing, set by Connect.
	framer *mpa.Framer
	parser *mpa.Parser
	mulpdu int
	ird    int
	ord    int

	// The work queues are rings of pointers to entries taken from a
	// pool as work is posted and given back as it completes (see
	// sqePool): an idle QP holds a pointer per slot, not an entry
	// (about 700 octets for a send) per slot of its depth.
	sq   ring[*sqe]
	txSQ int // index (from head) of the next SQ entry to transmit
	rq   ring[*rqe]

	// MSNs: the next to send per queue, and the next expected per queue.
	sendMSN, readMSN, atomicRspMSN ddp.MSN
	expSend, expRead, expAtomicRsp ddp.MSN

	// orq holds our Reads and atomics awaiting responses, in order.
	orq ring[*sqe]
	// irq holds the peer's Reads and atomics we owe responses to.
	irq ring[*irqe]

	rx rxState
	// stage gathers placements into process memory (stage.go).
	stage stage

	// txPos counts octets produced by Transmit; sentPos those the LLP
	// accepted.
	txPos, sentPos uint64

	term    *ddp.TerminateFields // a Terminate waiting to go out
	termBuf []byte

	// The flags, together: a QP is held for each connection.
	state State
	// pushed: a completion was pushed since TakePushed.
	pushed  bool
	preferQ bool // alternate between responses and the SQ, by message
	// txMid: the queue whose message is part sent; its next FPDU goes
	// first: a message's FPDUs go out back to back, as siw expects.
	txMid txQueue
	// holdTx: a responder waiting for the initiator's first FPDU.
	holdTx bool
	// rtr: the ready-to-receive message still to send (peer-to-peer).
	rtr mpa.RTR
	// rtrRead: our zero-length Read RTR awaits its empty response.
	rtrRead  bool
	termDone bool
	ended    bool // the connection is over: no more posts until Reset
	told     bool // the terminal event was given
	// quietEnd: the peer's end of the connection flushes no receive
	// while nothing of ours is outstanding (KeepRecvsAtPeerEnd);
	// keptRecvs: it ended so, and the receives posted (none, perhaps)
	// stay posted, and more are taken.
	quietEnd, keptRecvs bool
}

// New creates a QP in Idle. Receives may be posted before Connect.
func New(cfg Config) (*QP, error) {
	switch {
	case cfg.SQDepth < 1 || cfg.RQDepth < 1 || cfg.SQDepth > MaxDepth || cfg.RQDepth > MaxDepth:
		return nil, fmt.Errorf("%w: queue depths %d/%d", ErrConfig, cfg.SQDepth, cfg.RQDepth)
	case cfg.IRD < 0 || cfg.ORD < 0 || cfg.IRD > mpa.MaxIRDORD || cfg.ORD > mpa.MaxIRDORD:
		return nil, fmt.Errorf("%w: IRD %d ORD %d", ErrConfig, cfg.IRD, cfg.ORD)
	case cfg.SendCQ == nil || cfg.RecvCQ == nil || cfg.Mem == nil:
		return nil, fmt.Errorf("%w: CQs and memory are required", ErrConfig)
	case cfg.MaxInline < 0 || cfg.MaxInline > MaxInline:
		return nil, fmt.Errorf("%w: inline limit %d above %d", ErrConfig, cfg.MaxInline, MaxInline)
	}
	if cfg.MaxInline == 0 {
		cfg.MaxInline = DefaultInline
	}
	q := &QP{cfg: cfg, ird: cfg.IRD, ord: cfg.ORD}
	q.sq.init(cfg.SQDepth)
	q.rq.init(cfg.RQDepth)
	q.orq.init(max(cfg.ORD, 1))
	q.irq.init(max(cfg.IRD, 1))
	q.sendMSN, q.readMSN, q.atomicRspMSN = 1, 1, 1
	q.expSend, q.expRead, q.expAtomicRsp = 1, 1, 1
	return q, nil
}

// QPN is the queue pair number.
func (q *QP) QPN() uint32 { return q.cfg.QPN }

// State is the current state.
func (q *QP) State() State { return q.state }

// IRD in force.
func (q *QP) IRD() int { return q.ird }

// MaxInline is the inline data limit.
func (q *QP) MaxInline() int { return q.cfg.MaxInline }

// ORD in force.
func (q *QP) ORD() int { return q.ord }

// txQueue names the queue a part-sent message is from.
type txQueue uint8

const (
	midNone txQueue = iota
	midResponse
	midSQ
)

// Connect moves Idle to RTS with the outcome of MPA startup and the LLP's
// effective MSS (the FPDU size). The initiator sends the negotiated RTR first
// in peer-to-peer mode; the responder sends nothing until the first FPDU
// from the initiator has arrived (RFC 5044 §7.1.2 rule 4).
func (q *QP) Connect(p mpa.Params, emss int, initiator bool) error {
	if q.state != Idle || q.ended {
		return ErrState
	}
	q.holdTx = !initiator
	if initiator && p.PeerToPeer {
		q.rtr = p.RTR
	}
	q.framer = mpa.NewFramer(p.CRC, p.MarkersTx)
	q.parser = mpa.NewParser(p.CRC, p.MarkersRx)
	q.mulpdu = mpa.MULPDU(emss, p.MarkersTx)
	if p.Enhanced && p.IRD != mpa.MaxIRDORD && p.ORD != mpa.MaxIRDORD {
		q.ird, q.ord = int(p.IRD), int(p.ORD)
		if q.ird > q.irq.cap() {
			q.irq.init(q.ird)
		}
		if q.ord > q.orq.cap() {
			q.orq.init(q.ord)
		}
	}
	q.state = RTS
	return nil
}

// Entries of the work queues, pooled (see QP.sq): taken when a request is
// posted (or a peer's Read or atomic arrives), zeroed and put back when it
// completes, so that no pointer to a region outlives the request.
var (
	sqePool  = sync.Pool{New: func() any { return new(sqe) }}
	rqePool  = sync.Pool{New: func() any { return new(rqe) }}
	irqePool = sync.Pool{New: func() any { return new(irqe) }}
)

// sqe is a send-queue entry.
type sqe struct {
	wr SendWR
	// sink is the first SGE, the local target of a Read or atomic.
	sink  SGE
	nsge  int
	bufs  [MaxSGE][]byte
	mrs   [MaxSGE]*MR
	total int
	// inline copy of the data.
	inline [MaxInline]byte
	// tx progress: octets put in FPDUs, and the stream position at which
	// the last octet of this request leaves.
	sent   int
	queued bool // every FPDU produced
	endPos uint64
	// waiting for a response (Read, atomic).
	awaiting bool
	done     bool
	status   completion.Status
	err      error
	readTO   uint64 // Read: next expected sink offset
	// proc: an SGE of this Send or Write is process-backed (MR.Proc);
	// fetched: the octets of the request's data (from its start) that
	// were read into their shadows (fetchFor).
	proc    bool
	fetched int
}

// rqe is a receive-queue entry: what placement needs, and no copy of the
// request's SGL, as an idle QP's posted receives are what it holds.
type rqe struct {
	id    uint64
	nsge  int
	bufs  [MaxSGE][]byte
	mrs   [MaxSGE]*MR
	total int
	got   int // octets placed
}

// PostSend queues a send work request. Local buffers are checked and held
// now; the request completes in order with the others.
func (q *QP) PostSend(wr *SendWR) error {
	if err := q.canPost(q.sq.full(), len(wr.SGL)); err != nil {
		// The Send that finds the peer gone, as on InfiniBand, is
		// what flushes the receives its end kept.
		q.FlushKeptRecvs()
		return err
	}
	e := sqePool.Get().(*sqe)
	if err := q.prepareSend(e, wr); err != nil {
		*e = sqe{}
		sqePool.Put(e)
		return err
	}
	q.sq.add(e)
	return nil
}

// prepareSend fills a send entry from wr; on failure it holds no region.
func (q *QP) prepareSend(e *sqe, wr *SendWR) error {
	*e = sqe{wr: *wr}
	e.wr.SGL, e.wr.InlineData = nil, nil
	e.nsge = len(wr.SGL)
	if e.nsge > 0 {
		e.sink = wr.SGL[0]
	}
	var need Access
	switch wr.Op {
	case OpSend, OpSendInvalidate, OpWrite, OpImmediate, OpLocalInvalidate:
	case OpRead:
		need = LocalWrite
		if e.nsge != 1 || wr.Flags&Inline != 0 {
			return fmt.Errorf("%w: a Read takes exactly one SGE", ErrInvalidWR)
		}
	case OpFetchAdd, OpCmpSwap:
		need = LocalWrite
		if e.nsge != 1 || e.sink.Length != 8 || wr.RemoteTO%8 != 0 {
			return fmt.Errorf("%w: an atomic takes one 8-octet SGE and an 8-aligned remote offset", ErrInvalidWR)
		}
	default:
		return fmt.Errorf("%w: operation %v", ErrInvalidWR, wr.Op)
	}
	if wr.Flags&Inline != 0 {
		if len(wr.InlineData) > q.cfg.MaxInline {
			return ErrInlineLimit
		}
		e.total = copy(e.inline[:], wr.InlineData)
		e.bufs[0] = e.inline[:e.total]
		e.nsge = 1
	} else if err := q.resolve(wr.SGL, e.bufs[:], e.mrs[:], need, &e.total); err != nil {
		return err
	}
	if wr.Op == OpSend || wr.Op == OpSendInvalidate || wr.Op == OpWrite {
		for _, m := range e.mrs[:e.nsge] {
			e.proc = e.proc || procOf(m) != nil
		}
	}
	if wr.Op == OpRead || wr.Op == OpWrite {
		if e.total > 1<<31 {
			e.releaseAll()
			return fmt.Errorf("%w: %d octets", ErrInvalidWR, e.total)
		}
	}
	return nil
}

// canPost is what both queues check first: a state that takes work, room,
// and an SGL the entry can hold.
func (q *QP) canPost(full bool, nsge int) error {
	switch {
	case q.state != RTS && (q.state != Idle || q.ended):
		return ErrState
	case full:
		return ErrQueueFull
	case nsge > MaxSGE:
		return ErrTooManySGE
	}
	return nil
}

// PostRecv queues a receive buffer. It may be posted in Idle, before the
// connection exists, so that nothing the peer sends first is dropped.
func (q *QP) PostRecv(wr *RecvWR) error {
	// A QP that kept its receives at its peer's end takes more, as a
	// QP in RTS does.
	if err := q.canPost(q.rq.full(), len(wr.SGL)); err != nil && !(q.keptRecvs && errors.Is(err, ErrState)) {
		return err
	}
	e := rqePool.Get().(*rqe)
	e.id, e.nsge = wr.ID, len(wr.SGL)
	if err := q.resolve(wr.SGL, e.bufs[:], e.mrs[:], LocalWrite, &e.total); err != nil {
		*e = rqe{}
		rqePool.Put(e)
		return err
	}
	q.rq.add(e)
	return nil
}

// PostedRecvs is the number of receives posted and not yet completed.
func (q *QP) PostedRecvs() int { return q.rq.len() }

// popRecv completes the oldest receive: its holds dropped, the entry back
// in the pool.
func (q *QP) popRecv() {
	e := q.rq.get(0)
	e.releaseAll()
	*e = rqe{}
	q.rq.pop()
	rqePool.Put(e)
}

// popResponse ends the oldest response we owe (sent, or flushed).
func (q *QP) popResponse() {
	e := q.irq.get(0)
	e.release()
	*e = irqe{}
	q.irq.pop()
	irqePool.Put(e)
}

// resolve checks local SGEs against the QP's PD and holds their regions.
func (q *QP) resolve(sgl []SGE, bufs [][]byte, mrs []*MR, need Access, total *int) error {
	for i, s := range sgl {
		m := q.cfg.Mem.Lookup(s.LKey)
		var b []byte
		ok := m != nil && m.Valid() && m.PD == q.cfg.PD && m.Access&need == need
		if ok {
			b, ok = m.slice(s.Addr, uint64(s.Length))
		}
		if !ok || !m.hold() {
			for j := 0; j < i; j++ {
				mrs[j].release()
				mrs[j] = nil
			}
			return fmt.Errorf("%w: SGE %d (STag %#x, offset %#x, %d octets)", ErrProtection, i, s.LKey, s.Addr, s.Length)
		}
		bufs[i], mrs[i] = b, m
		*total += int(s.Length)
	}
	return nil
}

func (e *sqe) releaseAll() { releaseHolds(e.mrs[:], e.bufs[:]) }

// fetchAhead is how much of a process-backed request's data, or of a Read
// Response's source, is read from the process at a time, ahead of what
// goes out: one copy per 256 KiB, and a large message never holds the
// engine's owner (a poller other QPs share) for one long copy.
const fetchAhead = 256 << 10

// fetchFor makes octets [off, off+n) of the request's data, and up to
// fetchAhead more, present in the shadows of its process-backed SGEs: the
// data is read as it goes out (after any Fence), as an RNIC reads it.
func (e *sqe) fetchFor(off, n int) error {
	if off+n <= e.fetched {
		return nil
	}
	end := min(e.total, max(off+n, e.fetched+fetchAhead))
	start := 0 // of SGE i in the request's data
	for i := 0; i < e.nsge && start < end; i++ {
		b := e.bufs[i]
		lo, hi := max(e.fetched, start), min(end, start+len(b))
		if m := procOf(e.mrs[i]); m != nil && lo < hi {
			if err := m.fetch(b[lo-start : hi-start]); err != nil {
				return err
			}
		}
		start += len(b)
	}
	e.fetched = end
	return nil
}

func (e *rqe) releaseAll() { releaseHolds(e.mrs[:], e.bufs[:]) }

// releaseHolds drops a work request's holds on its regions.
func releaseHolds(mrs []*MR, bufs [][]byte) {
	for i := range mrs {
		if mrs[i] != nil {
			mrs[i].release()
			mrs[i] = nil
		}
		bufs[i] = nil
	}
}

var sendCompletionOp = [...]completion.Opcode{
	OpSend: completion.OpSend, OpSendInvalidate: completion.OpSend, OpWrite: completion.OpWrite,
	OpRead: completion.OpRead, OpFetchAdd: completion.OpFetchAdd, OpCmpSwap: completion.OpCmpSwap,
	OpLocalInvalidate: completion.OpLocalInvalidate, OpImmediate: completion.OpImmediate,
}

// retire completes send requests from the head while they are done, so
// completions appear in posting order.
func (q *QP) retire() {
	for q.sq.len() > 0 {
		e := q.sq.get(0)
		if !e.done {
			if e.queued && !e.awaiting && q.sentPos >= e.endPos {
				e.done = true
			} else {
				return
			}
		}
		if e.status != completion.Success || e.wr.Flags&Signaled != 0 {
			c := completion.Completion{ID: e.wr.ID, QPN: q.cfg.QPN, Opcode: sendCompletionOp[e.wr.Op],
				Status: e.status, Err: e.err}
			if e.status == completion.Success {
				c.ByteLen = uint32(e.total)
			}
			q.push(q.cfg.SendCQ, c)
		}
		e.releaseAll()
		*e = sqe{}
		q.sq.pop()
		sqePool.Put(e)
		if q.txSQ > 0 {
			q.txSQ--
		}
	}
}

// push delivers a completion; an overrun is fatal to the QP.
func (q *QP) push(cq *completion.CQ, c completion.Completion) {
	q.pushed = true
	if err := cq.Push(c); err != nil && !q.ended {
		q.fail(err)
	}
}

// TakePushed reports whether the engine made completions since it was
// last asked, and forgets them.
func (q *QP) TakePushed() bool {
	p := q.pushed
	q.pushed = false
	return p
}

// Sent tells the engine the LLP has accepted the stream up to total octets.
func (q *QP) Sent(total uint64) {
	if total > q.txPos {
		panic("qp: Sent beyond what Transmit produced")
	}
	q.sentPos = total
	q.retire()
	if q.term != nil && q.termDone && q.sentPos == q.txPos && q.state == Terminate {
		// RFC 5040 §6.2.1: after the Terminate, the LLP is closed.
		q.enterError(q.termCause(), Broken)
	}
}

func (q *QP) termCause() error {
	if q.term == nil {
		return nil
	}
	return q.term.Error
}

// Disconnect starts a local close. Graceful: no new requests, the posted
// ones finish, then the owner closes the LLP and reports LLPClosed.
// Abortive: the QP goes to Error at once and everything is flushed.
func (q *QP) Disconnect(graceful bool) {
	switch {
	case q.ended:
		q.FlushKeptRecvs()
	case graceful && q.state == RTS:
		q.state = Closing
	case graceful && q.state == Idle:
		q.enterError(nil, Disconnected)
	default:
		q.enterError(errors.New("qp: aborted locally"), Broken)
	}
}

// Drained reports that a closing QP has nothing left to send, so the owner
// may send its FIN.
func (q *QP) Drained() bool {
	return (q.state == Closing || q.state == Terminate) && !q.hasWork() && q.sentPos == q.txPos
}

// LLPClosed tells the engine the connection ended: err nil for an orderly
// close (FIN both ways), else a reset or loss.
func (q *QP) LLPClosed(err error) {
	if q.ended {
		return
	}
	// What an InfiniBand QP would not hear of: its peer gone while
	// nothing of ours is outstanding, and no protocol error ours.
	keep := q.quietEnd && q.term == nil && q.sq.len() == 0 && q.orq.len() == 0
	if err == nil && q.state != Terminate {
		// Our close completing, or the peer's FIN (digest 004 §6,
		// remote graceful close): what is outstanding is flushed.
		q.enterErrorKeeping(nil, Disconnected, keep)
		return
	}
	if err == nil {
		err = ddp.LLPConnectionLost
	}
	q.enterErrorKeeping(err, Broken, keep)
}

// KeepRecvsAtPeerEnd makes the QP an InfiniBand QP's likeness at its
// peer's end, for a QP connected the InfiniBand way (by QPN at RTR,
// without the RDMA-CM): there a QP does not learn that its peer's QP is
// gone until it sends, and programs written for it destroy their QP
// when they are done, without a word to the peer. So an end of the
// connection that finds nothing of ours outstanding (no request in the
// send queue, no Read awaiting its response, no Terminate of ours on its
// way) flushes no receive: they stay posted, and more may be posted,
// until a Send is posted (it fails and they are flushed after it), a
// disconnect, or Reset. Otherwise a program that polls its last
// completion together with a flushed receive (ibv_rc_pingpong takes two
// at a time) fails a run that succeeded. The terminal event is given as
// ever.
func (q *QP) KeepRecvsAtPeerEnd() { q.quietEnd = true }

// FlushKeptRecvs flushes the receives the peer's end kept
// (KeepRecvsAtPeerEnd), if any: at a Send, a disconnect, Reset, and the
// owner's move to Error of a QP whose connection is over already (verbs'
// ibv_modify_qp to ERR, which on InfiniBand flushes what is posted;
// programs drain their QP so before destroying it).
func (q *QP) FlushKeptRecvs() {
	if !q.keptRecvs {
		return
	}
	q.keptRecvs = false
	q.flushRecvs(ddp.LLPConnectionLost)
}

// fail is a local catastrophic error.
func (q *QP) fail(err error) { q.enterError(err, Broken) }

// enterError flushes every outstanding request and gives the terminal event
// once. An orderly close ends in Idle (digest 004 §6: "LLP Closed"), any
// other end in Error; either way the connection is over, and only Reset
// makes the QP usable again.
func (q *QP) enterError(err error, kind EventKind) { q.enterErrorKeeping(err, kind, false) }

// enterErrorKeeping is enterError, the receives left posted if keep.
func (q *QP) enterErrorKeeping(err error, kind EventKind, keep bool) {
	q.state = Error
	q.ended = true
	q.rx.drop()
	q.dropStage()
	for q.irq.len() > 0 {
		q.popResponse()
	}
	for q.orq.len() > 0 {
		q.orq.pop()
	}
	for i := 0; i < q.sq.len(); i++ {
		e := q.sq.get(i)
		if !e.done {
			e.done = true
			e.awaiting = false
			if e.status == completion.Success {
				e.status = completion.FlushError
				e.err = err
			}
		}
	}
	q.retire()
	if keep {
		// none posted included: more may be, as in RTS
		q.keptRecvs = true
	} else {
		q.flushRecvs(err)
	}
	if !q.told {
		q.told = true
		q.event(Event{Kind: kind, Err: err})
	}
	if kind == Disconnected {
		q.state = Idle
	}
}

// flushRecvs completes every posted receive flushed.
func (q *QP) flushRecvs(err error) {
	for q.rq.len() > 0 {
		q.pushed = true
		_ = q.cfg.RecvCQ.Push(completion.Completion{ID: q.rq.get(0).id, QPN: q.cfg.QPN, Opcode: completion.OpRecv,
			Status: completion.FlushError, Err: err})
		q.popRecv()
	}
}

// Reset returns a QP whose connection ended to a fresh Idle, so that it
// can connect again (DAT ep_reset). Receives may be posted after it.
func (q *QP) Reset() error {
	if !q.ended {
		return ErrState
	}
	q.FlushKeptRecvs()
	*q = QP{cfg: q.cfg, ird: q.cfg.IRD, ord: q.cfg.ORD, sq: q.sq, rq: q.rq, orq: q.orq, irq: q.irq}
	q.sendMSN, q.readMSN, q.atomicRspMSN = 1, 1, 1
	q.expSend, q.expRead, q.expAtomicRsp = 1, 1, 1
	return nil
}

// Ended reports that the QP's connection is over (Reset makes it usable).
func (q *QP) Ended() bool { return q.ended }

func (q *QP) event(e Event) {
	if q.cfg.Events != nil {
		q.cfg.Events(e)
	}
}

// ring is a fixed-capacity FIFO. Its indices are 32 bits (depths are far
// below that): four rings sit in every QP.
type ring[T any] struct {
	buf     []T
	head, n int32
}

func (r *ring[T]) init(n int) {
	old := *r
	r.buf = make([]T, n)
	r.head, r.n = 0, 0
	for i := 0; i < old.len(); i++ {
		r.buf[i] = old.get(i)
		r.n++
	}
}
func (r *ring[T]) cap() int    { return len(r.buf) }
func (r *ring[T]) len() int    { return int(r.n) }
func (r *ring[T]) full() bool  { return int(r.n) == len(r.buf) }
func (r *ring[T]) get(i int) T { return r.buf[(int(r.head)+i)%len(r.buf)] }
func (r *ring[T]) add(v T)     { r.buf[(int(r.head)+int(r.n))%len(r.buf)] = v; r.n++ }
func (r *ring[T]) pop() {
	var zero T
	r.buf[r.head] = zero
	r.head = int32((int(r.head) + 1) % len(r.buf))
	r.n--
}

// Waiting reports whether the QP waits on the wire: its Reads or atomics
// await responses, it owes responses, or posted sends are not complete.
func (q *QP) Waiting() bool {
	return (q.state == RTS || q.state == Closing) && (q.orq.len() > 0 || q.irq.len() > 0 || q.sq.len() > 0)
}

// Diag describes the QP's queues for a stall report.
func (q *QP) Diag() string {
	return fmt.Sprintf("qp %d %v sq=%d untransmitted=%d rq=%d orq=%d irq=%d ird=%d ord=%d tx=%d sent=%d hold=%v rtr=%v term=%v msn send=%d read=%d expected send=%d read=%d",
		q.cfg.QPN, q.state, q.sq.len(), q.sq.len()-q.txSQ, q.rq.len(), q.orq.len(), q.irq.len(), q.ird, q.ord,
		q.txPos, q.sentPos, q.holdTx, q.rtr, q.term != nil && !q.termDone,
		q.sendMSN, q.readMSN, q.expSend, q.expRead)
}
