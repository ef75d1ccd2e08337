package rnic

// FuzzEngineConn drives one connection of the accelerated datapath through
// the code a poller runs for it — tcp.Stack, the connection's engineConn,
// mpaConn (MPA startup, then the QP engine), qp.QP, the CQs and the
// device's registered memory — against a scripted peer that does whatever
// the fuzz input says, at every phase: the TCP handshake, MPA startup, the
// established connection and the close.
//
// The input: four octets of setup (efInitiator and the other mode bits; the
// peer's TCP options; our IRD/ORD and whether the peer's sequence numbers
// wrap; the length of our consumer's private data, which follows), then
// operations, one octet each (modulo efOps) followed by their arguments,
// until the input ends. Reads past the end give zeros.
//
// The peer (efPeer) is a raw TCP endpoint of the harness's own: it builds
// segments with the header package and keeps just enough state (its
// sequence numbers, what it received of ours, our window) to send in-window
// data when the input asks for well-formed traffic; it can send any segment
// too. Its data is raw octets, MPA Requests or Replies built by package mpa
// and then made to lie (flags, revision, PD_Length, truncation), or
// DDP/RDMAP messages framed by mpa.Framer with the negotiated CRC and
// markers (or corrupted), aimed at our regions.
//
// Our side is a real tcp.Stack driven the way xdpnet's loop drives it
// (Input; Output until it returns 0; Advance when a timer is due), a device
// QP, and its engineConn: made as connectEngine makes it (our side
// connects) or by engineListener itself (our side listens). There is no
// xdpnet.Poller, whose sockets need root: the engineConns get a zero
// Poller, whose Async only queues, and the harness does on its loop what
// the poller would do with what was queued (serve after a kick; the Reject
// rejectEngine queues; the listener's Request timer), and what the consumer
// does around calls that need a running poller (connectEngine's setup and
// its failure paths, the function acceptEngine's Move runs, Listener.Close).
// Those lines are marked "as … does" and must follow the code they copy;
// a poller behind an interface would let the harness call that code instead.
//
// After every step it checks:
//   - no octet of the memory arena changed outside what the peer may write:
//     the region registered with remote write (until the peer invalidates
//     it), and the parts of a local-write region our posted receives, Read
//     sinks and atomic results name. Regions are carved out of one buffer
//     with guard zones between them and keep the buffer's capacity, so a
//     slice that reaches past its region shows here;
//   - what our side sent after MPA startup parses as FPDUs with the
//     negotiated CRC and markers, each a DDP segment a receiver accepts;
//   - completions name a posted work request, once, on its CQ;
//   - connection events come in a legal order: Established first, one
//     terminal event, nothing after it.
//
// When the input ends, a QP that runs on a connection the peer closed must
// have ended; then the consumer's timeouts fire (the Connect gives up, the
// listener's Request timer, an unanswered request is rejected), an
// established QP disconnects, and simulated time runs: every connection
// must have left the Stack within efSilence, a QP that ran must have ended
// with one terminal event, and every receive and signalled send must have
// completed.
//
// Each iteration runs under a watchdog: one that has not returned within
// efWatchdog (a deadlock on the QP's mutex, an endless loop in Output or
// Fill) panics with every goroutine's stack. TestEngineFuzzSeeds runs the
// hostile peers of efCases through the same harness without -fuzz.

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/softrnic/softrnic/completion"
	"github.com/softrnic/softrnic/ddp"
	"github.com/softrnic/softrnic/header"
	"github.com/softrnic/softrnic/mpa"
	"github.com/softrnic/softrnic/qp"
	"github.com/softrnic/softrnic/tcp"
	"github.com/softrnic/softrnic/xdpnet"
)

var (
	efOurAddr  = netip.MustParseAddr("192.0.2.1")
	efPeerAddr = netip.MustParseAddr("192.0.2.2")
)

const (
	efListenPort = 4791  // the port of whichever side listens
	efPeerPort   = 40000 // the peer's port when it connects
	// efWatchdog bounds one iteration in real time.
	efWatchdog = 10 * time.Second
	// efSilence is the simulated time the connection gets to end once the
	// peer has gone quiet and the consumer has given up.
	efSilence = 2 * time.Hour
	// efMaxSegments bounds the segments one pump exchanges; efMaxTimers
	// the timer firings of one advance.
	efMaxSegments = 20000
	efMaxTimers   = 100000
	efStreamCap   = 64 << 10
	efGuard       = 64
)

// Operations, one input octet each (modulo efOps), then their arguments.
const (
	efHandshake  = iota // the peer's next handshake segment
	efMPA               // an MPA Request or Reply, perhaps lying
	efRaw               // raw octets on the peer's stream
	efFPDU              // a framed DDP/RDMAP message
	efTime              // time passes
	efAck               // the peer acknowledges, with a new window
	efFIN               // the peer's FIN after its data
	efRST               // the peer resets
	efSegment           // an arbitrary TCP segment
	efRetransmit        // the peer sends its unacknowledged data again
	efPostSend          // the consumer posts a send-queue work request
	efPostRecv          // the consumer posts a receive
	efDisconnect        // the consumer disconnects
	efConsumer          // the consumer answers a request, or a device timer fires
	efOps
)

var efOpNames = [efOps]string{"handshake", "mpa", "raw", "fpdu", "time", "ack", "fin", "rst", "segment",
	"retransmit", "post-send", "post-recv", "disconnect", "consumer"}

// Bits of the first input octet.
const (
	efInitiator  = 1 << iota // our side connects; else it listens
	efNoCRC                  // our QP does not ask for CRC
	efMarkers                // our QP asks for markers
	efPeerToPeer             // our QP asks for, or accepts, peer-to-peer
	efRev1                   // our QP speaks MPA revision 1
	efAutoAck                // the peer acknowledges what it receives at once
	efGraceful               // the last disconnect is graceful
	efEagerRecv              // BeforeReceive posts receives, as the daemon's does
)

var efDurations = [16]time.Duration{time.Millisecond, 5 * time.Millisecond, 20 * time.Millisecond,
	40 * time.Millisecond, 100 * time.Millisecond, 200 * time.Millisecond, 500 * time.Millisecond, time.Second,
	3 * time.Second, 10 * time.Second, 30 * time.Second, time.Minute, 2 * time.Minute, 5 * time.Minute,
	15 * time.Minute, time.Hour}

var efMSS = [16]uint16{1460, 536, 88, 1200, 1448, 64, 1000, 9000, 1460, 200, 576, 1380, 128, 300, 1460, 1}

// efInput reads the fuzz input; past its end every read gives zeros.
type efInput struct {
	b   []byte
	pos int
}

func (r *efInput) more() bool { return r.pos < len(r.b) }

func (r *efInput) u8() byte {
	if r.pos >= len(r.b) {
		return 0
	}
	r.pos++
	return r.b[r.pos-1]
}

func (r *efInput) u16() uint16 { return uint16(r.u8())<<8 | uint16(r.u8()) }
func (r *efInput) u32() uint32 { return uint32(r.u16())<<16 | uint32(r.u16()) }
func (r *efInput) u64() uint64 { return uint64(r.u32())<<32 | uint64(r.u32()) }

// take returns n octets: the input's, then a pattern once it ends.
func (r *efInput) take(n int) []byte {
	b := make([]byte, n)
	k := copy(b, r.b[min(r.pos, len(r.b)):])
	r.pos += k
	for i := k; i < n; i++ {
		b[i] = byte(i*7 + 1)
	}
	return b
}

// Regions of the arena.
const (
	efRW      = iota // remote write, read and atomics: the peer may write it
	efSink           // local write: our receives, Read sinks, atomic results
	efSrc            // remote read only: our Sends' and Writes' source
	efForeign        // all rights, in another PD
	efDead           // all rights, deregistered
	efLocal          // local write, never posted
	efRegions
)

type efRegion struct {
	name   string
	n      int
	base   uint64
	other  bool // in another PD
	access qp.Access
	off    int // in the arena
	mr     *MR
}

func efLayout() []efRegion {
	all := qp.LocalWrite | qp.RemoteWrite | qp.RemoteRead | qp.RemoteAtomic
	return []efRegion{
		efRW:      {name: "rw", n: 1024, base: 0x10000, access: all},
		efSink:    {name: "sink", n: 1024, base: 0x20000, access: qp.LocalWrite},
		efSrc:     {name: "src", n: 1024, base: 0x30000, access: qp.RemoteRead},
		efForeign: {name: "foreign", n: 512, base: 0x10000, other: true, access: all},
		efDead:    {name: "dead", n: 512, base: 0x10000, access: all},
		efLocal:   {name: "local", n: 256, base: 0x40000, access: qp.LocalWrite},
	}
}

// efWR is a work request the consumer posted and has not seen complete.
type efWR struct {
	recv, signaled bool
	total          int
}

// efOutcome is what the consumer saw, for the table tests.
type efOutcome struct {
	Established bool
	StartErr    error // our side connected and startup failed
	AcceptErr   error // the last Accept's error
	Requests    int   // connection requests the listener queued
	Events      []ConnEvent
	ConnErr     error // how our TCP connection ended
	Trace       []string
}

type efHarness struct {
	mode      byte
	initiator bool
	stack     *tcp.Stack
	now       tcp.Time
	buf       []byte
	pl        *xdpnet.Poller // never runs: see the file comment
	peer      efPeer

	dev     *Device
	pd, pd2 *PD
	q       *QP
	scq     *completion.CQ
	rcq     *completion.CQ
	cfgPD   []byte // our consumer's private data

	// Our side connects: ec and the Connect's outcome.
	ec         *engineConn
	conn       *tcp.Conn
	resultSeen bool
	startErr   error
	// Our side listens.
	lis       *Listener
	tl        *tcp.Listener
	lisDone   bool
	crs       []*ConnRequest
	accepted  *engineConn
	acceptErr error
	lastConn  *tcp.Conn

	established bool // Established was delivered
	eager       int  // receives BeforeReceive posted
	started     bool // the QP has been connected (RTS)
	finAt       tcp.Time
	finFire     func() // the close timer started at our FIN
	finFired    bool

	// evMu guards events: OnEvent may run on a timer's goroutine (the
	// close timer engineConn.Fill starts).
	evMu   sync.Mutex
	events []ConnEvent

	regions  []efRegion
	arena    []byte
	shadow   []byte
	may      []bool // octets the peer may have changed
	rwFrozen bool
	lastRead qp.SGE // the sink of our latest Read

	nextID      uint64
	outstanding map[uint64]efWR
	cqOut       []completion.Completion

	trace []string
}

func (h *efHarness) tracef(format string, args ...any) {
	if len(h.trace) >= 400 {
		h.trace = h.trace[200:]
	}
	h.trace = append(h.trace, fmt.Sprintf("t=%v ", time.Duration(h.now-tcp.Time(time.Second)))+fmt.Sprintf(format, args...))
}

func newEfHarness(r *efInput) (*efHarness, error) {
	mode, tcpb, irdord, pdlen := r.u8(), r.u8(), r.u8(), r.u8()
	h := &efHarness{mode: mode, initiator: mode&efInitiator != 0, now: tcp.Time(time.Second),
		buf: make([]byte, 4096), pl: new(xdpnet.Poller), outstanding: map[uint64]efWR{}}
	var err error
	h.stack, err = tcp.NewStack(tcp.Options{Secret: [16]byte{0x5f}, SendBuffer: 16 << 10, ReceiveBuffer: 16 << 10})
	if err != nil {
		return nil, err
	}
	h.dev = Open()
	if h.pd, err = h.dev.AllocPD(); err != nil {
		return nil, err
	}
	if h.pd2, err = h.dev.AllocPD(); err != nil {
		return nil, err
	}
	if err := h.setupMemory(); err != nil {
		return nil, err
	}
	if h.scq, err = h.dev.CreateCQ(64, 0); err != nil {
		return nil, err
	}
	if h.rcq, err = h.dev.CreateCQ(64, 0); err != nil {
		return nil, err
	}
	rev := uint8(0)
	if mode&efRev1 != 0 {
		rev = 1
	}
	h.q, err = h.dev.CreateQP(h.pd, QPAttr{SQDepth: 8, RQDepth: 8, IRD: int(irdord & 7), ORD: int(irdord >> 3 & 7),
		SendCQ: h.scq, RecvCQ: h.rcq, NoCRC: mode&efNoCRC != 0, Markers: mode&efMarkers != 0, MPARevision: rev,
		PeerToPeer: mode&efPeerToPeer != 0, OnEvent: h.onEvent})
	if err != nil {
		return nil, err
	}
	if mode&efEagerRecv != 0 {
		h.q.attr.BeforeReceive = h.beforeReceive
	}
	h.q.closeTimer = func(fire func()) {
		if h.finFire == nil {
			h.finAt, h.finFire = h.now, fire
		}
	}
	h.cfgPD = r.take(int(pdlen % 40))

	p := &h.peer
	p.h = h
	p.ws = [4]int{-1, 0, 7, 14}[tcpb&3]
	p.sack, p.ts = tcpb&4 != 0, tcpb&8 != 0
	p.mss = efMSS[tcpb>>4]
	p.wnd = 0xffff
	if p.ws > 0 {
		p.wnd = min(0xffff<<p.ws, 1<<20)
	}
	p.iss = 1_000_000
	if irdord&0x40 != 0 {
		p.iss = 0xffffff00 // the peer's sequence numbers wrap soon
	}
	p.autoAck = mode&efAutoAck != 0
	p.ourWS = -1
	p.msn = [4]ddp.MSN{1, 1, 1, 1}

	if h.initiator {
		// As connectEngine does, up to the poller's Connect.
		q := h.q
		q.mu.Lock()
		ec := q.activeEngineConn(h.pl, q.mpaConfig(h.cfgPD))
		q.unlock()
		h.ec = ec
		p.port = efListenPort
		h.conn, err = h.stack.Connect(h.now, efOurAddr, 0, netip.AddrPortFrom(efPeerAddr, efListenPort), ec)
		if err != nil {
			return nil, err
		}
		h.lastConn = h.conn
	} else {
		// As listenEngine does, with xdpnet's Listen on this Stack.
		h.lis = &Listener{dev: h.dev, opts: ListenOptions{Backlog: 2, RequestTimeout: 3 * time.Second},
			reqs: make(chan *ConnRequest, 2), done: make(chan struct{}), port: efListenPort, p: h.pl}
		el := &engineListener{l: h.lis}
		if h.tl, err = h.stack.Listen(efOurAddr, efListenPort, el); err != nil {
			return nil, err
		}
		el.Listening(h.tl)
		p.port, p.ourPort = efPeerPort, efListenPort
	}
	return h, h.settle()
}

func (h *efHarness) setupMemory() error {
	h.regions = efLayout()
	off := efGuard
	for i := range h.regions {
		h.regions[i].off = off
		off += h.regions[i].n + efGuard
	}
	h.arena = make([]byte, off)
	for i := range h.arena {
		h.arena[i] = byte(i*131+7) ^ 0x5a
	}
	h.shadow = append([]byte(nil), h.arena...)
	h.may = make([]bool, len(h.arena))
	for i := range h.regions {
		g := &h.regions[i]
		pd := h.pd
		if g.other {
			pd = h.pd2
		}
		// Not capped: the region's slice keeps the arena's capacity, as
		// a region of a client's mapped memory does.
		mr, err := h.dev.RegisterMR(pd, h.arena[g.off:g.off+g.n], g.base, g.access)
		if err != nil {
			return err
		}
		g.mr = mr
	}
	if err := h.regions[efDead].mr.Deregister(); err != nil {
		return err
	}
	h.allow(efRW, 0, h.regions[efRW].n)
	return nil
}

// allow lets the peer write n octets at off in region i.
func (h *efHarness) allow(i, off, n int) {
	g := &h.regions[i]
	off = max(off, 0)
	end := min(off+n, g.n)
	for k := off; k < end; k++ {
		h.may[g.off+k] = true
	}
}

func (h *efHarness) onEvent(ev ConnEvent) {
	h.evMu.Lock()
	h.events = append(h.events, ev)
	h.evMu.Unlock()
}

// beforeReceive posts a receive, as the daemon's hook posts what its
// client queued; on the poller, with the QP unlocked.
func (h *efHarness) beforeReceive() {
	if h.eager >= 16 {
		return
	}
	h.eager++
	g := h.regions[efSink]
	off := 64 * (h.eager % 16)
	wr := &qp.RecvWR{SGL: []qp.SGE{{LKey: g.mr.STag, Addr: g.base + uint64(off), Length: 64}}}
	wr.ID = h.newID(efWR{recv: true, total: 64})
	if err := h.q.PostRecv(wr); err != nil {
		delete(h.outstanding, wr.ID)
		return
	}
	h.allow(efSink, off, 64)
}

// llp is our connection's mpaConn once the QP has one.
func (h *efHarness) llp() *mpaConn {
	if h.initiator {
		return h.ec.llp
	}
	if h.accepted != nil {
		return h.accepted.llp
	}
	return nil
}

// activeEC is the engineConn the QP runs on, if any.
func (h *efHarness) activeEC() *engineConn {
	if h.initiator {
		return h.ec
	}
	return h.accepted
}

func (h *efHarness) passiveID() tcp.FourTuple {
	return tcp.FourTuple{LocalAddr: efOurAddr, RemoteAddr: efPeerAddr, LocalPort: efListenPort, RemotePort: efPeerPort}
}

func (h *efHarness) run(r *efInput) error {
	for r.more() {
		at := r.pos
		op := int(r.u8()) % efOps
		h.tracef("op %s @%d", efOpNames[op], at)
		if err := h.op(op, r); err != nil {
			return err
		}
		if err := h.settle(); err != nil {
			return err
		}
	}
	return h.finish()
}

// settle lets the connection run to quiet after a step, wakes the
// consumer, and checks the invariants.
func (h *efHarness) settle() error {
	if err := h.pump(); err != nil {
		return err
	}
	h.consumerWakes()
	if err := h.pump(); err != nil {
		return err
	}
	return h.check()
}

// pump runs the Stack's output and the peer's answers until both are
// quiet, as the poller's loop does with frames.
func (h *efHarness) pump() error {
	for segs := 0; ; segs++ {
		if segs > efMaxSegments {
			return fmt.Errorf("output does not quiesce: %d segments exchanged in one step", segs)
		}
		n, src, dst := h.stack.Output(h.now, h.buf)
		if n == 0 {
			if h.peer.transmit() {
				continue
			}
			return nil
		}
		if src != efOurAddr || dst != efPeerAddr {
			return fmt.Errorf("Output gave a segment from %v to %v", src, dst)
		}
		if err := h.peer.receive(h.buf[:n]); err != nil {
			return err
		}
	}
}

// advanceTo lets time pass to target, firing each timer when it is due
// (the Stack's, and the close timer engineConn.Fill starts, whose
// real-time AfterFunc never fires within an iteration).
func (h *efHarness) advanceTo(target tcp.Time) error {
	for i := 0; ; i++ {
		if i > efMaxTimers {
			return fmt.Errorf("timers keep firing: %d due before %v", i, time.Duration(target-h.now))
		}
		next, ok := h.stack.NextTimer()
		fin := h.finFire != nil && !h.finFired
		finDue := h.finAt.Add(closeTimeout)
		if fin && (!ok || finDue < next) {
			next, ok = finDue, true
		}
		if !ok || next > target {
			break
		}
		h.now = max(h.now, next)
		if fin && h.now >= finDue {
			h.finFired = true
			h.tracef("close timer fires")
			h.finFire()
			h.serve()
		}
		h.stack.Advance(h.now)
		if err := h.settle(); err != nil {
			return err
		}
	}
	h.now = max(h.now, target)
	h.stack.Advance(h.now)
	return h.settle()
}

// serve does what the poller does with the serve a kick queued.
func (h *efHarness) serve() {
	ecs := []*engineConn{h.ec, h.accepted}
	for _, cr := range h.crs {
		ecs = append(ecs, cr.ec)
	}
	for _, ec := range ecs {
		if ec != nil && ec.queued.Load() {
			ec.serve()
		}
	}
}

// consumerWakes is the consumer's goroutine after a step: the Connect
// returns, a connection request arrives.
func (h *efHarness) consumerWakes() {
	if h.initiator && !h.resultSeen {
		select {
		case err := <-h.ec.result:
			h.resultSeen = true
			h.tracef("connect returns: %v", err)
			if err != nil {
				// As connectEngine does when the startup failed.
				h.startErr = err
				h.q.letGo(h.ec)
			}
		default:
		}
	}
	if !h.initiator {
		for {
			select {
			case cr := <-h.lis.reqs:
				h.crs = append(h.crs, cr)
				h.tracef("connection request")
				continue
			default:
			}
			break
		}
		if c := h.stack.Lookup(h.passiveID()); c != nil {
			h.lastConn = c
		}
	}
}

func (h *efHarness) op(op int, r *efInput) error {
	p := &h.peer
	switch op {
	case efHandshake:
		p.handshake()
	case efMPA:
		p.sendData(h.mpaFrame(r))
	case efRaw:
		n := int(r.u8())
		if n&0x80 != 0 {
			n = (n & 0x7f) * 16
		}
		p.sendData(r.take(n))
	case efFPDU:
		p.sendData(h.fpdu(r))
	case efTime:
		return h.advanceTo(h.now.Add(efDurations[r.u8()%16]))
	case efAck:
		b := r.u8()
		switch b & 3 {
		case 0:
			p.wnd = 0
		case 1:
			p.wnd = int(b>>2) * 64
		case 2:
			p.wnd = 0xffff
			if p.ws > 0 {
				p.wnd = min(0xffff<<p.ws, 1<<20)
			}
		}
		p.ackOwed = true
	case efFIN:
		p.finQueued = true
	case efRST:
		b := r.u8()
		seq := p.sndSeq()
		if b&1 != 0 {
			seq += uint32(int32(int8(r.u8())) * 1000)
		}
		flags := uint8(header.TCPFlagRST)
		if b&2 != 0 {
			flags |= header.TCPFlagACK
		}
		p.inject(p.segment(flags, seq, p.rcvNxt, nil))
	case efSegment:
		p.arbitrary(r)
	case efRetransmit:
		if !p.synAcked && p.synSent {
			p.handshake()
		}
		p.nxt = 0
		p.finSent = false
	case efPostSend:
		h.postSend(r)
	case efPostRecv:
		h.postRecv(r)
	case efDisconnect:
		graceful := r.u8()&1 == 0
		h.tracef("disconnect graceful=%v", graceful)
		h.q.Disconnect(graceful)
		h.serve()
	case efConsumer:
		h.consumer(r)
	}
	return nil
}

// consumer acts on its connection request, or one of the device's
// timers fires.
func (h *efHarness) consumer(r *efInput) {
	b := r.u8()
	switch b % 6 {
	case 0:
		if !h.initiator {
			h.accept(r.take(int(b>>3) % 24))
		}
	case 1:
		if !h.initiator {
			if cr := h.firstUnanswered(); cr != nil {
				h.reject(cr, r.take(int(b>>3)%24))
			}
		}
	case 2:
		h.timeoutsFire()
	case 3:
		// The nudge timer connectEngine starts.
		if h.established {
			h.q.nudgeIfSilent()
			h.serve()
		}
	case 4:
		// Listener.Close, as closeEngine and Close do.
		if !h.initiator && !h.lisDone {
			h.lisDone = true
			close(h.lis.done)
			h.tl.Close()
			for _, cr := range h.crs {
				h.reject(cr, nil)
			}
		}
	case 5:
		// The close timer started at our FIN fires early.
		if h.finFire != nil && !h.finFired {
			h.finFired = true
			h.finFire()
			h.serve()
		}
	}
}

func (h *efHarness) firstUnanswered() *ConnRequest {
	for _, cr := range h.crs {
		cr.mu.Lock()
		answered := cr.answered
		cr.mu.Unlock()
		if !answered {
			return cr
		}
	}
	return nil
}

// reject is ConnRequest.Reject with the function rejectEngine queues run
// on the loop.
func (h *efHarness) reject(cr *ConnRequest, private []byte) {
	if cr.answer() {
		h.tracef("reject")
		cr.ec.llp.Reject(private)
	}
}

// accept is ConnRequest.Accept: acceptEngine with the function its Move
// runs on the loop (the connection stays on this poller).
func (h *efHarness) accept(private []byte) {
	cr := h.firstUnanswered()
	if cr == nil {
		return
	}
	q := h.q
	release, err := cr.take(q) // as Accept does
	if err != nil {
		h.acceptErr = err
		return
	}
	defer release()
	cfg := q.mpaConfig(private)
	ec := cr.ec
	c := h.stack.Lookup(ec.id)
	switch {
	case c == nil:
		err = xdpnet.ErrGone
	default:
		err = ec.adopt(q, cfg, c, cr.gone.Load())
	}
	h.tracef("accept: %v", err)
	h.acceptErr = err
	if err == nil {
		h.accepted = ec
	}
}

// timeoutsFire is the consumer's and the device's timeouts: the Connect
// gives up (connectEngine's ctx), a connection whose Request has not come
// is reset (engineListener's timer), an unanswered request is rejected
// (ConnRequest's timer).
func (h *efHarness) timeoutsFire() {
	if h.initiator && !h.resultSeen {
		h.tracef("connect times out")
		h.resultSeen = true
		h.startErr = ErrTimedOut
		h.conn.Abort()
		h.q.letGo(h.ec)
	}
	if h.initiator {
		return
	}
	if c := h.stack.Lookup(h.passiveID()); c != nil {
		requested := false
		for _, cr := range h.crs {
			requested = requested || cr.ec.conn == c
		}
		if !requested {
			h.tracef("request timer resets")
			c.Abort()
		}
	}
	for _, cr := range h.crs {
		h.reject(cr, nil)
	}
}

// finish is the end of the input: the peer goes quiet, the consumer gives
// up or disconnects, and time runs until the connection is gone.
func (h *efHarness) finish() error {
	h.tracef("finish")
	if ec := h.activeEC(); h.started && ec != nil && ec.conn != nil {
		// The peer's FIN reached the QP: RFC 5040 / digest 004 §6, a
		// remote graceful close ends it; it must not wait in RTS on a
		// half-closed connection.
		switch st := ec.conn.State(); st {
		case tcp.StateCloseWait, tcp.StateLastAck, tcp.StateClosing, tcp.StateTimeWait, tcp.StateClosed:
			if !h.q.Ended() {
				return fmt.Errorf("our connection is %v (the peer closed it) but the QP is still %v", st, h.q.State())
			}
		}
	}
	h.timeoutsFire()
	if h.established {
		h.q.Disconnect(h.mode&efGraceful != 0)
		h.serve()
	}
	if err := h.settle(); err != nil {
		return err
	}
	if err := h.advanceTo(h.now.Add(efSilence)); err != nil {
		return err
	}
	if n := h.stack.Conns(); n > 0 {
		st := "?"
		if c := h.lastConn; c != nil {
			st = c.State().String()
		}
		return fmt.Errorf("%d connection(s) still in the Stack %v after the peer went quiet and the consumer gave up (ours: %s)",
			n, efSilence, st)
	}
	ended, state := h.q.Ended(), h.q.State()
	h.evMu.Lock()
	terminal := 0
	for _, ev := range h.events {
		if ev.Kind == Disconnected || ev.Kind == Broken {
			terminal++
		}
	}
	h.evMu.Unlock()
	if h.started {
		if !ended {
			return fmt.Errorf("the connection is gone but the QP has not ended (state %v)", state)
		}
		if terminal != 1 {
			return fmt.Errorf("the QP ran and ended with %d terminal events", terminal)
		}
		for id, w := range h.outstanding {
			if w.recv || w.signaled {
				return fmt.Errorf("work request %d (receive %v) never completed", id, w.recv)
			}
		}
	}
	return nil
}

// check is run after every step.
func (h *efHarness) check() error {
	if llp := h.llp(); llp != nil && llp.Ready() {
		h.started = true
	}
	// Memory: a region the peer invalidated is no longer its to write.
	if rw := h.regions[efRW]; !h.rwFrozen && !rw.mr.Valid() {
		h.rwFrozen = true
		for k := rw.off; k < rw.off+rw.n; k++ {
			h.may[k] = false
		}
		copy(h.shadow[rw.off:rw.off+rw.n], h.arena[rw.off:rw.off+rw.n])
	}
	for i := range h.arena {
		if h.arena[i] != h.shadow[i] && !h.may[i] {
			return fmt.Errorf("octet %d of the arena (%s) changed: %#02x, was %#02x", i, h.where(i), h.arena[i], h.shadow[i])
		}
	}
	if err := h.checkOurs(); err != nil {
		return err
	}
	// Completions.
	for _, cq := range []*completion.CQ{h.scq, h.rcq} {
		if cq.Overrun() {
			return errors.New("a CQ overran")
		}
		for {
			if cap(h.cqOut) == 0 {
				h.cqOut = make([]completion.Completion, 16)
			}
			n := cq.Poll(h.cqOut)
			if n == 0 {
				break
			}
			for _, c := range h.cqOut[:n] {
				w, ok := h.outstanding[c.ID]
				if !ok {
					return fmt.Errorf("completion %+v for no outstanding work request", c)
				}
				if w.recv != (cq == h.rcq) {
					return fmt.Errorf("completion %+v on the wrong queue", c)
				}
				if w.recv && c.Status == completion.Success && int(c.ByteLen) > w.total {
					return fmt.Errorf("receive completion %+v longer than the %d octets posted", c, w.total)
				}
				delete(h.outstanding, c.ID)
				h.tracef("completion %d %v %v %d %v", c.ID, c.Opcode, c.Status, c.ByteLen, c.Err)
			}
		}
	}
	// Events.
	h.evMu.Lock()
	defer h.evMu.Unlock()
	terminal := false
	for i, ev := range h.events {
		switch {
		case terminal:
			return fmt.Errorf("event %v after the terminal event: %v", ev.Kind, h.eventKinds())
		case ev.Kind == Established && i > 0:
			return fmt.Errorf("Established is not the first event: %v", h.eventKinds())
		case ev.Kind == Established:
			h.established = true
		case ev.Kind == Disconnected || ev.Kind == Broken:
			terminal = true
		}
	}
	return nil
}

// checkOurs checks what our side sent after its startup frame: whole
// FPDUs with the negotiated CRC and markers, each a DDP segment a receiver
// takes, whatever the peer did.
func (h *efHarness) checkOurs() error {
	p := &h.peer
	llp := h.llp()
	if llp == nil || !llp.Ready() {
		return nil
	}
	if p.ours == nil {
		_, n, err := mpa.ParseFrame(p.stream, !h.initiator)
		if errors.Is(err, mpa.ErrShortFrame) {
			return nil // still on its way (a closed window)
		}
		if err != nil {
			return fmt.Errorf("our MPA startup frame does not parse: %v", err)
		}
		p.ours, p.fed = mpa.NewAssembler(llp.Params.CRC, llp.Params.MarkersTx), n
	}
	if len(p.stream) == p.fed {
		return nil
	}
	ulpdus, err := p.ours.Feed(p.stream[p.fed:], nil)
	p.fed = len(p.stream)
	if err != nil {
		return fmt.Errorf("our FPDU stream is malformed: %v", err)
	}
	for _, u := range ulpdus {
		if _, err := ddp.ParseSegment(u); err != nil {
			return fmt.Errorf("we sent a DDP segment a receiver rejects (%v): % x", err, u[:min(len(u), 48)])
		}
	}
	return nil
}

func (h *efHarness) eventKinds() []string {
	var s []string
	for _, ev := range h.events {
		s = append(s, ev.Kind.String())
	}
	return s
}

func (h *efHarness) where(i int) string {
	for _, g := range h.regions {
		if i >= g.off && i < g.off+g.n {
			return fmt.Sprintf("region %s offset %d", g.name, i-g.off)
		}
	}
	return "guard zone"
}

// pickSTag chooses an STag and the tagged offset its region starts at.
func (h *efHarness) pickSTag(r *efInput) (uint32, uint64) {
	c := r.u8()
	switch k := int(c % 10); {
	case k < efRegions:
		g := h.regions[k]
		return g.mr.STag, g.base
	case k == 6:
		return h.lastRead.LKey, h.lastRead.Addr
	case k == 7:
		return qp.RTRSTag, 0
	case k == 8:
		return 0, 0
	default:
		return r.u32(), r.u64()
	}
}

func (h *efHarness) pickTO(r *efInput, base uint64) uint64 {
	return base + uint64(int64(int16(r.u16())))
}

// mpaFrame is the peer's MPA startup frame: a Reply to our Request when we
// connected, else a Request; then the lies the input asks for.
func (h *efHarness) mpaFrame(r *efInput) []byte {
	ctl, rtrb := r.u8(), r.u8()
	ird, ord := efIRDORD(r.u8()), efIRDORD(r.u8())
	pd := r.take(int(r.u8() % 80))
	cfg := mpa.Config{CRC: ctl&0x02 != 0, Markers: ctl&0x04 != 0, IRD: ird, ORD: ord,
		PeerToPeer: ctl&0x08 != 0, RTR: mpa.RTR(rtrb & 7), PrivateData: pd}
	if ctl&0x10 != 0 {
		cfg.Revision = 1
	}
	var f mpa.Frame
	if h.initiator {
		req, _, err := mpa.ParseFrame(h.peer.stream, false)
		if err != nil {
			req = mpa.Frame{Revision: 2, Enhanced: true, CRC: true, IRD: 8, ORD: 8}
		}
		if ctl&0x01 != 0 {
			f, _ = cfg.Reject(&req)
		} else {
			f, _, _ = cfg.Accept(&req)
		}
	} else {
		f, _ = cfg.Request()
	}
	if rtrb&0x08 != 0 {
		f.RTR = mpa.RTR(rtrb >> 4 & 7)
	}
	if rtrb&0x80 != 0 {
		f.PeerToPeer = !f.PeerToPeer
	}
	wire, err := f.Append(nil)
	if err != nil {
		f.Revision = min(max(f.Revision, 1), 2)
		if f.Revision < 2 {
			f.Enhanced = false
		}
		f.IRD, f.ORD = f.IRD&mpa.MaxIRDORD, f.ORD&mpa.MaxIRDORD
		if len(f.PrivateData) > mpa.MaxPrivateData-mpa.EnhancedLen {
			f.PrivateData = f.PrivateData[:mpa.MaxPrivateData-mpa.EnhancedLen]
		}
		if wire, err = f.Append(nil); err != nil {
			panic(fmt.Sprintf("enginefuzz: cannot build an MPA frame from %+v: %v", f, err))
		}
	}
	if ctl&0x20 != 0 {
		wire[16] ^= r.u8() // M, C, R, S and the reserved bits
	}
	if ctl&0x40 != 0 {
		wire[17] = r.u8() // revision
	}
	if ctl&0x80 != 0 {
		binary.BigEndian.PutUint16(wire[18:], r.u16()) // PD_Length
	}
	if k := r.u8(); k != 0 {
		wire = wire[:int(k)%len(wire)]
	}
	h.tracef("mpa frame %d octets: %+v", len(wire), f)
	return wire
}

func efIRDORD(b byte) uint16 {
	if b == 0xff {
		return mpa.MaxIRDORD
	}
	return uint16(b % 20)
}

// fpdu is a DDP/RDMAP message from the peer, framed with the negotiated
// CRC and markers once our side knows them.
func (h *efHarness) fpdu(r *efInput) []byte {
	p := &h.peer
	if !p.framed {
		if llp := h.llp(); llp != nil && llp.Ready() {
			p.framer = mpa.NewFramer(llp.Params.CRC, llp.Params.MarkersRx)
			p.framed = true
		} else if p.framer == nil {
			p.framer = mpa.NewFramer(true, false)
		}
	}
	b0, b1 := r.u8(), r.u8()
	op := ddp.Opcode(b0 & 0x0f)
	info := op.Info()
	tagged := info.Tagged != (b0&0x10 != 0)
	last := b0&0x20 == 0
	wild := b0&0x40 != 0
	var hdr []byte
	if tagged {
		hdr = make([]byte, ddp.TaggedHeaderLen)
		stag, base := h.pickSTag(r)
		ddp.Tagged(hdr).Encode(&ddp.TaggedFields{Last: last, Opcode: op, STag: stag, TO: h.pickTO(r, base)})
	} else {
		hdr = make([]byte, ddp.UntaggedHeaderLen)
		qn := info.QN
		msn := p.msn[qn&3]
		if wild {
			qn = uint32(r.u8() % 6)
			msn += ddp.MSN(int8(r.u8()))
		}
		mo := p.mo[qn&3]
		if b1&0x40 != 0 {
			mo = uint32(r.u16())
		}
		var inv uint32
		if info.Invalidate {
			inv, _ = h.pickSTag(r)
		}
		ddp.Untagged(hdr).Encode(&ddp.UntaggedFields{Last: last, Opcode: op, InvalidateSTag: inv, QN: qn, MSN: msn, MO: mo})
	}
	if wild {
		hdr[0] ^= r.u8() & 0x3f // reserved bits and DDP version
		hdr[1] ^= r.u8() & 0xf0 // RDMAP version and reserved bits
	}
	var body []byte
	switch op {
	case ddp.OpReadRequest:
		body = make([]byte, ddp.ReadRequestLen)
		src, base := h.pickSTag(r)
		ddp.ReadRequest(body).Encode(&ddp.ReadRequestFields{SinkSTag: r.u32(), SinkTO: uint64(r.u32()),
			Size: uint32(r.u16()), SrcSTag: src, SrcTO: h.pickTO(r, base)})
	case ddp.OpAtomicRequest:
		body = make([]byte, ddp.AtomicRequestLen)
		stag, base := h.pickSTag(r)
		to := h.pickTO(r, base)
		if b1&0x20 == 0 {
			to &^= 7
		}
		ddp.AtomicRequest(body).Encode(&ddp.AtomicRequestFields{Op: ddp.AtomicOp(r.u8() % 3), RequestID: r.u32(),
			RemoteSTag: stag, RemoteTO: to, AddSwapData: r.u64(), AddSwapMask: r.u64(), CompareData: r.u64(), CompareMask: r.u64()})
	case ddp.OpAtomicResponse:
		body = make([]byte, ddp.AtomicResponseLen)
		ddp.AtomicResponse(body).Encode(r.u32(), r.u64())
	case ddp.OpImmediateData, ddp.OpImmediateDataSE:
		body = r.take(ddp.ImmediateDataLen)
	case ddp.OpTerminate:
		body = r.take(int(r.u8() % 48))
	}
	if wild && len(body) > 0 {
		body = body[:int(r.u8())%len(body)]
	}
	var payload []byte
	if info.Payload || b1&0x10 != 0 {
		n := int(r.u8())
		if b1&0x80 != 0 {
			n *= 16
		}
		payload = r.take(n)
	}
	if !tagged {
		if last {
			p.msn[info.QN&3]++
			p.mo[info.QN&3] = 0
		} else {
			p.mo[info.QN&3] += uint32(len(payload))
		}
	}
	ulpdu := append(hdr, body...)
	wire := p.framer.Append(nil, ulpdu, payload)
	if b1&0x01 != 0 {
		i := int(r.u16()) % len(wire)
		wire[i] ^= r.u8() | 1
	}
	h.tracef("fpdu %v tagged=%v last=%v wild=%v %d octets", op, tagged, last, wild, len(wire))
	return wire
}

func (h *efHarness) newID(w efWR) uint64 {
	h.nextID++
	h.outstanding[h.nextID] = w
	return h.nextID
}

func (h *efHarness) postSend(r *efInput) {
	b, fl := r.u8(), r.u8()
	op := qp.SendOp(b % 8)
	off, n := int(r.u16()%1100), int(r.u16()%1100)
	wr := &qp.SendWR{Op: op}
	if fl&1 == 0 {
		wr.Flags |= qp.Signaled
	}
	if fl&2 != 0 {
		wr.Flags |= qp.Solicited
	}
	if fl&4 != 0 {
		wr.Flags |= qp.Fence
	}
	region := efSrc
	switch op {
	case qp.OpRead:
		region = efSink
	case qp.OpFetchAdd, qp.OpCmpSwap:
		region, off, n = efSink, off&^7, 8
	}
	g := h.regions[region]
	wr.SGL = []qp.SGE{{LKey: g.mr.STag, Addr: g.base + uint64(off), Length: uint32(n)}}
	if fl&8 != 0 && region == efSrc {
		wr.Flags |= qp.Inline
		wr.InlineData = r.take(n % 80)
	}
	if fl&16 != 0 {
		wr.SGL = append(wr.SGL, qp.SGE{LKey: g.mr.STag, Addr: g.base + uint64(r.u16()%1100), Length: uint32(r.u8())})
	}
	stag, base := h.pickSTag(r)
	wr.RemoteSTag, wr.RemoteTO = stag, h.pickTO(r, base)
	if op == qp.OpFetchAdd || op == qp.OpCmpSwap {
		wr.RemoteTO &^= 7
	}
	wr.InvalidateSTag, _ = h.pickSTag(r)
	if op == qp.OpLocalInvalidate && wr.InvalidateSTag == h.regions[efRW].mr.STag {
		// rw is frozen only when the peer invalidates it (check): a
		// local invalidate could race a placement under way.
		wr.InvalidateSTag = h.regions[efLocal].mr.STag
	}
	wr.Add, wr.Compare, wr.Swap = r.u64(), r.u64(), r.u64()
	copy(wr.Immediate[:], r.take(8))
	wr.ID = h.newID(efWR{signaled: wr.Flags&qp.Signaled != 0})
	err := h.q.PostSend(wr)
	h.tracef("post %v id %d: %v", op, wr.ID, err)
	if err != nil {
		delete(h.outstanding, wr.ID)
	} else if region == efSink {
		for _, s := range wr.SGL {
			h.allow(efSink, int(s.Addr-g.base), int(s.Length))
		}
		if op == qp.OpRead {
			h.lastRead = wr.SGL[0]
		}
	}
	h.serve()
}

func (h *efHarness) postRecv(r *efInput) {
	g := h.regions[efSink]
	k := 1 + int(r.u8()%3)
	wr := &qp.RecvWR{}
	total := 0
	for range k {
		off, n := int(r.u16()%1100), int(r.u16()%600)
		wr.SGL = append(wr.SGL, qp.SGE{LKey: g.mr.STag, Addr: g.base + uint64(off), Length: uint32(n)})
		total += n
	}
	wr.ID = h.newID(efWR{recv: true, total: total})
	err := h.q.PostRecv(wr)
	h.tracef("post receive id %d: %v", wr.ID, err)
	if err != nil {
		delete(h.outstanding, wr.ID)
		return
	}
	for _, s := range wr.SGL {
		h.allow(efSink, int(s.Addr-g.base), int(s.Length))
	}
}

// efPeer is the scripted TCP endpoint on the other side.
type efPeer struct {
	h             *efHarness
	port, ourPort uint16
	iss           uint32
	synSent       bool
	synAcked      bool   // we acknowledged its SYN
	una           int    // octets of its stream we acknowledged
	out           []byte // its stream from una on
	nxt           int    // octets of out sent
	finQueued     bool
	finSent       bool
	wnd           int // the window it advertises, in octets
	mss           uint16
	ws            int // its window scale shift, -1 for none
	sack, ts      bool
	autoAck       bool
	ackOwed       bool

	// What it knows of us.
	synSeen  bool
	ourISS   uint32
	rcvNxt   uint32
	ourMSS   int
	ourWS    int
	ourTS    bool
	tsRecent uint32
	ourWnd   int
	finSeen  bool
	rstSeen  bool
	stream   []byte // our stream as it arrived, its first efStreamCap octets
	// ours checks our FPDUs, from fed octets of stream on.
	ours *mpa.Assembler
	fed  int

	framer *mpa.Framer
	framed bool // framer set from the negotiated parameters
	msn    [4]ddp.MSN
	mo     [4]uint32
}

func (p *efPeer) seqAt(k int) uint32 { return p.iss + 1 + uint32(p.una+k) }

// sndSeq is where the peer's next new segment starts.
func (p *efPeer) sndSeq() uint32 {
	s := p.seqAt(p.nxt)
	if p.finSent {
		s++
	}
	return s
}

func (p *efPeer) tsVal() uint32 { return uint32(p.h.now/tcp.Time(time.Millisecond)) + 12345 }

func (p *efPeer) segment(flags uint8, seq, ack uint32, payload []byte) []byte {
	syn := flags&header.TCPFlagSYN != 0
	var o header.TCPOptions
	if syn {
		o.MSS, o.HasMSS = p.mss, true
		if p.ws >= 0 {
			o.WindowScale, o.HasWindowScale = uint8(p.ws), true
		}
		o.SACKPermitted = p.sack
	}
	if p.ts && (syn || p.ourTS) {
		o.HasTimestamp, o.TSVal, o.TSEcr = true, p.tsVal(), p.tsRecent
	}
	olen := header.TCPOptionsLen(&o)
	b := make([]byte, header.TCPMinLen+olen+len(payload))
	header.EncodeTCPOptions(b[header.TCPMinLen:], &o)
	header.TCP(b).Encode(&header.TCPFields{SrcPort: p.port, DstPort: p.ourPort, Seq: seq, Ack: ack, Flags: flags,
		Window: p.window(syn), OptionsLen: olen})
	copy(b[header.TCPMinLen+olen:], payload)
	header.TCP(b).SetChecksum(efPeerAddr, efOurAddr)
	return b
}

// window is the Window field of the peer's segments.
func (p *efPeer) window(syn bool) uint16 {
	win := p.wnd
	if !syn && p.ws >= 0 && p.ourWS >= 0 {
		win >>= p.ws
	}
	return uint16(min(win, 0xffff))
}

func (p *efPeer) inject(b []byte) {
	p.h.stack.Input(p.h.now, efPeerAddr, efOurAddr, b)
}

// handshake sends the peer's next handshake segment.
func (p *efPeer) handshake() {
	ack := uint8(header.TCPFlagACK)
	if p.h.initiator {
		// We sent the SYN; the peer answers it.
		if !p.synSeen {
			return
		}
		if !p.synAcked {
			p.synSent = true
			p.inject(p.segment(header.TCPFlagSYN|ack, p.iss, p.rcvNxt, nil))
			return
		}
		p.inject(p.segment(ack, p.sndSeq(), p.rcvNxt, nil))
		return
	}
	if !p.synSeen {
		p.synSent = true
		p.inject(p.segment(header.TCPFlagSYN, p.iss, 0, nil))
		return
	}
	p.inject(p.segment(ack, p.sndSeq(), p.rcvNxt, nil))
}

// sendData queues octets on the peer's stream.
func (p *efPeer) sendData(b []byte) {
	if p.finSent || p.finQueued {
		return
	}
	p.out = append(p.out, b...)
}

// transmit sends what the peer's stream, its FIN and its ACK policy call
// for, within our window; it reports whether it sent anything.
func (p *efPeer) transmit() bool {
	const ack, psh, fin = header.TCPFlagACK, header.TCPFlagPSH, header.TCPFlagFIN
	sent := false
	if p.synSent && p.synSeen && !p.rstSeen {
		for p.nxt < len(p.out) {
			room := p.ourWnd - p.nxt
			if room <= 0 {
				break
			}
			k := min(len(p.out)-p.nxt, room, max(p.ourMSS, 1))
			p.inject(p.segment(ack|psh, p.seqAt(p.nxt), p.rcvNxt, p.out[p.nxt:p.nxt+k]))
			p.nxt += k
			sent = true
		}
		if p.finQueued && !p.finSent && p.nxt == len(p.out) {
			p.inject(p.segment(fin|ack, p.seqAt(p.nxt), p.rcvNxt, nil))
			p.finSent = true
			sent = true
		}
	}
	if p.ackOwed {
		p.ackOwed = false
		if !sent && p.synSeen {
			p.inject(p.segment(ack, p.sndSeq(), p.rcvNxt, nil))
			sent = true
		}
	}
	return sent
}

// receive takes a segment our Stack sent.
func (p *efPeer) receive(b []byte) error {
	t := header.TCP(b)
	if !t.IsValid(len(b)) {
		return fmt.Errorf("our Stack sent a malformed TCP segment (% x)", b[:min(len(b), 60)])
	}
	if !t.IsChecksumValid(efOurAddr, efPeerAddr) {
		return errors.New("our Stack sent a segment with a wrong checksum")
	}
	flags, seq, payload := t.Flags(), t.Seq(), t.Payload()
	var o header.TCPOptions
	header.ParseTCPOptions(t.Options(), &o)
	if o.HasTimestamp {
		p.tsRecent = o.TSVal
	}
	if flags&header.TCPFlagRST != 0 {
		p.rstSeen = true
		return nil
	}
	syn := flags&header.TCPFlagSYN != 0
	if syn && !p.synSeen {
		p.synSeen = true
		p.ourISS, p.rcvNxt = seq, seq+1
		p.ourPort = t.SrcPort()
		p.ourMSS = 536
		if o.HasMSS {
			p.ourMSS = int(o.MSS)
		}
		if o.HasWindowScale {
			p.ourWS = int(o.WindowScale)
		}
		p.ourTS = o.HasTimestamp
	}
	if !p.synSeen {
		return nil
	}
	if flags&header.TCPFlagACK != 0 && p.synSent {
		p.acked(t.Ack())
	}
	p.ourWnd = int(t.Window())
	if !syn && p.ws >= 0 && p.ourWS >= 0 {
		p.ourWnd <<= p.ourWS
	}
	fin := flags&header.TCPFlagFIN != 0
	if len(payload) == 0 && !fin {
		return nil
	}
	start := seq
	if syn {
		start++
	}
	if off := int(int32(p.rcvNxt - start)); off >= 0 && off < len(payload) {
		fresh := payload[off:]
		if room := efStreamCap - len(p.stream); room > 0 {
			p.stream = append(p.stream, fresh[:min(room, len(fresh))]...)
		}
		p.rcvNxt += uint32(len(fresh))
	}
	if fin && start+uint32(len(payload)) == p.rcvNxt && !p.finSeen {
		p.rcvNxt++
		p.finSeen = true
	}
	if p.autoAck {
		p.ackOwed = true
	}
	return nil
}

// acked takes our acknowledgement of the peer's stream.
func (p *efPeer) acked(ack uint32) {
	off := int(int32(ack - (p.iss + 1)))
	if off < 0 {
		return
	}
	p.synAcked = true
	off = min(off, p.una+p.nxt)
	if drop := off - p.una; drop > 0 {
		p.out = p.out[drop:]
		p.nxt -= drop
		p.una = off
	}
}

// arbitrary sends a segment whose every field comes from the input,
// around the peer's sequence numbers.
func (p *efPeer) arbitrary(r *efInput) {
	flags := r.u8()
	seqOff, ackOff := int16(r.u16()), int16(r.u16())
	win := r.u16()
	opts := r.take(int(r.u8()) % (header.TCPMaxOptionsLen + 1))
	payload := r.take(int(r.u8()))
	padded := (len(opts) + 3) &^ 3
	b := make([]byte, header.TCPMinLen+padded+len(payload))
	copy(b[header.TCPMinLen:], opts)
	header.TCP(b).Encode(&header.TCPFields{SrcPort: p.port, DstPort: p.ourPort, Seq: p.sndSeq() + uint32(int32(seqOff)),
		Ack: p.rcvNxt + uint32(int32(ackOff)), Flags: flags, Window: win, OptionsLen: padded})
	copy(b[header.TCPMinLen+padded:], payload)
	header.TCP(b).SetChecksum(efPeerAddr, efOurAddr)
	p.inject(b)
}

// efRun runs one script; the outcome is what the consumer saw.
func efRun(data []byte) (*efOutcome, error) {
	r := &efInput{b: data}
	h, err := newEfHarness(r)
	if err != nil {
		return nil, fmt.Errorf("setup: %w", err)
	}
	err = h.run(r)
	o := &efOutcome{Established: h.established, StartErr: h.startErr, AcceptErr: h.acceptErr, Requests: len(h.crs)}
	if h.lastConn != nil {
		o.ConnErr = h.lastConn.Err()
	}
	h.evMu.Lock()
	o.Events = append(o.Events, h.events...)
	h.evMu.Unlock()
	o.Trace = h.trace
	if err != nil {
		tail := h.trace[max(0, len(h.trace)-60):]
		return o, fmt.Errorf("%w\nevents %v\nlast steps:\n  %s", err, o.Events, strings.Join(tail, "\n  "))
	}
	return o, nil
}

// efRunWatched is efRun under the watchdog.
func efRunWatched(data []byte) (*efOutcome, error) {
	type result struct {
		o   *efOutcome
		err error
	}
	done := make(chan result, 1)
	go func() {
		o, err := efRun(data)
		done <- result{o, err}
	}()
	t := time.NewTimer(efWatchdog)
	defer t.Stop()
	select {
	case res := <-done:
		return res.o, res.err
	case <-t.C:
		buf := make([]byte, 8<<20)
		buf = buf[:runtime.Stack(buf, true)]
		panic(fmt.Sprintf("enginefuzz: an iteration has not returned after %v: a deadlock or an endless loop "+
			"(input %q)\n\n%s", efWatchdog, data, buf))
	}
}

func FuzzEngineConn(f *testing.F) {
	for _, c := range efCases() {
		f.Add([]byte(c.script))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if _, err := efRunWatched(data); err != nil {
			t.Fatal(err)
		}
	})
}

// efScript builds inputs for the table below.
type efScript []byte

func efNew(mode, tcpb, irdord byte) efScript { return efScript{mode, tcpb, irdord, 0} }

func (s efScript) op(op int, args ...byte) efScript {
	return append(append(s, byte(op)), args...)
}

func (s efScript) handshake() efScript { return s.op(efHandshake) }

// mpa sends a startup frame: ctl and rtrb as mpaFrame reads them, IRD and
// ORD 8, the private data, then tail: the patches ctl asks for and the
// truncation octet (none: no patch, no truncation).
func (s efScript) mpa(ctl, rtrb byte, pd string, tail ...byte) efScript {
	s = s.op(efMPA, ctl, rtrb, 8, 8, byte(len(pd)))
	s = append(s, pd...)
	if len(tail) == 0 {
		tail = []byte{0}
	}
	return append(s, tail...)
}

func (s efScript) raw(b string) efScript {
	if len(b) > 127 {
		panic("efScript.raw: too long")
	}
	return append(s.op(efRaw, byte(len(b))), b...)
}

func (s efScript) wait(i byte) efScript { return s.op(efTime, i) }

// write sends an RDMA Write of n octets to region at offset off.
func (s efScript) write(region, off, n byte) efScript {
	return append(s.op(efFPDU, byte(ddp.OpWrite), 0, region, 0, off), append([]byte{n}, bytes.Repeat([]byte{0xee}, int(n))...)...)
}

// send sends a one-segment Send of n octets, MSN in order.
func (s efScript) send(n byte) efScript {
	return append(s.op(efFPDU, byte(ddp.OpSend), 0, n), bytes.Repeat([]byte{0xdd}, int(n))...)
}

// readReq asks for n octets of region at offset 0.
func (s efScript) readReq(region byte, n uint16) efScript {
	return s.op(efFPDU, byte(ddp.OpReadRequest), 0, region, 0, 0, 0x12, 0x34, 0, 0, 0, 0, byte(n>>8), byte(n), 0, 0)
}

// sendMore is the first segment of a Send of several (L clear).
func (s efScript) sendMore(n byte) efScript {
	return append(s.op(efFPDU, byte(ddp.OpSend)|0x20, 0, n), bytes.Repeat([]byte{0xdc}, int(n))...)
}

// sendInv sends a Send with Invalidate of region's STag.
func (s efScript) sendInv(region, n byte) efScript {
	return append(s.op(efFPDU, byte(ddp.OpSendInvalidate), 0, region, n), bytes.Repeat([]byte{0xdb}, int(n))...)
}

// atomic asks for a FetchAdd (op 0) or CmpSwap (2) on region at offset
// off.
func (s efScript) atomic(op, region, off byte) efScript {
	s = s.op(efFPDU, byte(ddp.OpAtomicRequest), 0, region, 0, off, op, 0, 0, 0, 7)
	s = append(s, 0, 0, 0, 0, 0, 0, 0, 5) // add or swap
	s = append(s, make([]byte, 8)...)     // mask
	s = append(s, make([]byte, 8)...)     // compare
	return append(s, bytes.Repeat([]byte{0xff}, 8)...)
}

// readResponse answers our latest Read with n octets at offset off of its
// sink, the last segment if last.
func (s efScript) readResponse(off, n byte, last bool) efScript {
	b0 := byte(ddp.OpReadResponse)
	if !last {
		b0 |= 0x20
	}
	return append(s.op(efFPDU, b0, 0, 6, 0, off, n), bytes.Repeat([]byte{0xda}, int(n))...)
}

// atomicResponse answers our oldest atomic.
func (s efScript) atomicResponse() efScript {
	return s.op(efFPDU, byte(ddp.OpAtomicResponse), 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 42)
}

// immediate sends Immediate Data.
func (s efScript) immediate() efScript {
	return s.op(efFPDU, byte(ddp.OpImmediateData), 0, 1, 2, 3, 4, 5, 6, 7, 8)
}

// rtrWrite is the zero-length Write a peer-to-peer initiator sends first.
func (s efScript) rtrWrite() efScript { return s.op(efFPDU, byte(ddp.OpWrite), 0, 7, 0, 0, 0) }

// terminate sends a Terminate reporting e.
func (s efScript) terminate(e ddp.TerminateError) efScript {
	f := ddp.TerminateFields{Error: e}
	body := make([]byte, f.Len())
	ddp.Terminate(body).Encode(&f)
	return append(s.op(efFPDU, byte(ddp.OpTerminate), 0, byte(len(body))), body...)
}

func (s efScript) postRecv(off, n uint16) efScript {
	return s.op(efPostRecv, 0, byte(off>>8), byte(off), byte(n>>8), byte(n))
}

// postSend posts a signalled send-queue request of op for n octets of the
// source (the sink for a Read) at offset 0, at region's offset 0 remotely.
func (s efScript) postSend(op qp.SendOp, n uint16, region byte) efScript {
	s = s.op(efPostSend, byte(op), 0, 0, 0, byte(n>>8), byte(n), region, 0, 0, efSrc)
	return append(s, make([]byte, 32)...)
}

// Options of the peer's TCP (the second octet): window scale 7, SACK and
// timestamps, MSS 1460.
const efTCPFull = 2 | 4 | 8

type efCase struct {
	name   string
	script efScript
	want   func(o *efOutcome) error
}

func efWantStartErr(is error) func(o *efOutcome) error {
	return func(o *efOutcome) error {
		if o.Established {
			return errors.New("the connection was established")
		}
		if o.StartErr == nil || (is != nil && !errors.Is(o.StartErr, is)) {
			return fmt.Errorf("Connect failed with %v, want %v", o.StartErr, is)
		}
		return nil
	}
}

func efWantEstablished(o *efOutcome) error {
	if !o.Established {
		return fmt.Errorf("not established (Connect: %v, Accept: %v)", o.StartErr, o.AcceptErr)
	}
	return nil
}

func efWantNotEstablished(o *efOutcome) error {
	if o.Established {
		return errors.New("the connection was established")
	}
	return nil
}

// efCases are hostile peers from issue 14, as scripts; the fuzz target
// starts from them too.
func efCases() []efCase {
	ini := byte(efInitiator | efAutoAck)
	resp := byte(efAutoAck)
	accept := []byte{0}
	return []efCase{
		{"initiator/non-iWARP answer", efNew(ini, efTCPFull, 0x12).handshake().
			raw("HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"), efWantStartErr(mpa.ErrBadKey)},
		{"initiator/random bytes", efNew(ini, 0, 0x12).handshake().
			raw("\x00\x17\x9a\x01\xff\xfe\x10\x20\x30MPA ID Rep Frame\x40\x02\x00\x00"), efWantStartErr(nil)},
		{"initiator/truncated Reply then silence", efNew(ini, efTCPFull, 0x12).handshake().
			mpa(0, 0, "pd", 11).wait(10), efWantStartErr(ErrTimedOut)},
		{"initiator/RST mid-Reply", efNew(ini, efTCPFull, 0x12).handshake().
			mpa(0, 0, "", 13).op(efRST, 0), efWantStartErr(ddp.LLPConnectionLost)},
		{"initiator/FIN before Reply", efNew(ini, efTCPFull, 0x12).handshake().op(efFIN).wait(8),
			func(o *efOutcome) error {
				// As on the kernel datapath, at once: not when the
				// Connect gives up.
				if o.Established || o.StartErr == nil || errors.Is(o.StartErr, ErrTimedOut) {
					return fmt.Errorf("Connect: %v, want a failure before its timeout", o.StartErr)
				}
				return nil
			}},
		{"initiator/Reject with private data", efNew(ini, efTCPFull, 0x12).handshake().
			mpa(0x01, 0, "go away, I am busy"), func(o *efOutcome) error {
			var rej *RejectedError
			if !errors.As(o.StartErr, &rej) || string(rej.PrivateData) != "go away, I am busy" {
				return fmt.Errorf("Connect failed with %v, want a RejectedError with the private data", o.StartErr)
			}
			return nil
		}},
		{"initiator/PD_Length beyond what follows", efNew(ini, efTCPFull, 0x12).handshake().
			mpa(0x80, 0, "0123456789", 0x01, 0xf0, 0).wait(10).op(efFIN), efWantStartErr(nil)},
		{"initiator/PD_Length above 512", efNew(ini, efTCPFull, 0x12).handshake().
			mpa(0x80, 0, "0123456789", 0x03, 0x00, 0), efWantStartErr(ddp.LLPInvalidFrame)},
		{"initiator/markers and CRC not offered", efNew(ini|efNoCRC, efTCPFull, 0x12).handshake().
			mpa(0x20, 0, "", 0xc0, 0).write(efRW, 0, 40).send(8), nil},
		{"initiator/p2p Reply without A", efNew(ini|efPeerToPeer, efTCPFull, 0x12).handshake().
			mpa(0x08, 0x80, ""), efWantStartErr(ddp.LLPNoMatchingRTR)},
		{"initiator/p2p Reply without RTR bits", efNew(ini|efPeerToPeer, efTCPFull, 0x12).handshake().
			mpa(0x08, 0x08, ""), efWantStartErr(ddp.LLPNoMatchingRTR)},
		{"initiator/revision 3", efNew(ini, efTCPFull, 0x12).handshake().
			mpa(0x40, 0, "", 3, 0), efWantStartErr(nil)},
		{"initiator/hostile FPDUs after establishment", efNew(ini, efTCPFull, 0x12).handshake().mpa(0, 0, "ok").
			postRecv(0, 100).write(efRW, 0, 64).write(efSrc, 0, 16).send(30), efWantEstablished},
		{"initiator/our Terminate, then the peer ACKs our FIN and stays silent", efNew(ini|efGraceful, efTCPFull, 0x12).
			handshake().mpa(0, 0, "").write(efSrc, 0, 16), efWantEstablished},
		{"initiator/Write into another PD", efNew(ini, efTCPFull, 0x12).handshake().mpa(0, 0, "").
			write(efForeign, 0, 32), efWantEstablished},
		{"initiator/Write to a deregistered region", efNew(ini, efTCPFull, 0x12).handshake().mpa(0, 0, "").
			write(efDead, 0, 32), efWantEstablished},
		{"initiator/Send with no receive posted", efNew(ini, efTCPFull, 0x12).handshake().mpa(0, 0, "").
			send(40), efWantEstablished},
		{"initiator/Read Request of a remote-read region", efNew(ini, efTCPFull, 0x12).handshake().mpa(0, 0, "").
			readReq(efSrc, 512).readReq(efRW, 2000).readReq(efSink, 8), efWantEstablished},
		{"initiator/graceful close, peer ACKs our FIN and never sends its own", efNew(ini|efGraceful, efTCPFull, 0x12).
			handshake().mpa(0, 0, "").postSend(qp.OpSend, 100, 0), efWantEstablished},
		{"initiator/zero window while we send", efNew(efInitiator, efTCPFull, 0x12).handshake().op(efAck, 2).
			mpa(0, 0, "").op(efAck, 0).postSend(qp.OpWrite, 1000, efRW).postSend(qp.OpSend, 1000, 0).
			wait(12).wait(13), efWantEstablished},
		{"initiator/zero window before we send, then silence", efNew(efInitiator|efGraceful, efTCPFull, 0x12).
			handshake().op(efAck, 2).mpa(0, 0, "").op(efAck, 0).postSend(qp.OpSend, 100, 0), efWantEstablished},
		{"initiator/peer never ACKs", efNew(efInitiator, 0, 0x12).handshake().mpa(0, 0, "").
			postSend(qp.OpWrite, 1000, efRW).wait(14), efWantEstablished},
		{"initiator/no SYN-ACK", efNew(ini, 0, 0x12).wait(14), efWantStartErr(nil)},
		{"initiator/Sends, Writes, Reads and atomics both ways", efNew(ini|efGraceful, efTCPFull, 0x12).handshake().
			mpa(0, 0, "").postRecv(0, 200).postRecv(200, 200).send(100).sendMore(50).send(60).write(efRW, 8, 200).
			postSend(qp.OpRead, 300, efRW).readResponse(0, 200, false).readResponse(200, 100, true).
			postSend(qp.OpFetchAdd, 8, efRW).atomicResponse().atomic(0, efRW, 16).atomic(2, efRW, 24).
			readReq(efSrc, 300).postRecv(400, 100).immediate().postSend(qp.OpSend, 500, 0).postSend(qp.OpWrite, 700, efRW).
			op(efFIN), efWantEstablished},
		{"initiator/Send with Invalidate of rw, then a Write to it", efNew(ini, efTCPFull, 0x12).handshake().
			mpa(0, 0, "").postRecv(0, 100).sendInv(efRW, 10).write(efRW, 0, 10), efWantEstablished},
		{"initiator/peer Terminates", efNew(ini, efTCPFull, 0x12).handshake().mpa(0, 0, "").
			postSend(qp.OpSend, 10, 0).terminate(ddp.RDMAPAccessRights), efWantEstablished},
		{"initiator/markers both ways", efNew(ini|efMarkers|efGraceful, efTCPFull, 0x12).handshake().
			mpa(0x04, 0, "").postRecv(0, 1000).write(efRW, 0, 250).send(250).write(efRW, 0, 250).
			postSend(qp.OpSend, 900, 0).op(efFIN), efWantEstablished},
		{"initiator/no CRC, revision 1", efNew(ini|efNoCRC|efRev1|efGraceful, 0x10, 0x12).handshake().
			mpa(0x10, 0, "").write(efRW, 0, 100).op(efFIN), efWantEstablished},
		{"initiator/peer-to-peer", efNew(ini|efPeerToPeer|efGraceful, efTCPFull, 0x12).handshake().
			mpa(0x08, byte(mpa.RTRWrite), "").rtrWrite().postSend(qp.OpWrite, 100, efRW).write(efRW, 0, 9).
			op(efConsumer, 3).op(efFIN), efWantEstablished},
		{"initiator/graceful close answered", efNew(ini|efGraceful, efTCPFull, 0x12).handshake().mpa(0, 0, "").
			postSend(qp.OpWrite, 100, efRW).op(efConsumer, 3).op(efDisconnect, 0).op(efFIN), efWantEstablished},
		{"initiator/eager receives", efNew(ini|efEagerRecv, efTCPFull, 0x12).handshake().mpa(0, 0, "").
			send(60).send(64).send(65), efWantEstablished},
		{"initiator/a small MSS and sequence numbers that wrap", efNew(ini, 0x50, 0x52).handshake().mpa(0, 0, "").
			postRecv(0, 1000).op(efRaw, 0x80|40).send(200).send(200).postSend(qp.OpSend, 1000, 0), efWantEstablished},
		{"responder/Request with garbage", efNew(resp, efTCPFull, 0x12).handshake().handshake().
			raw("MPA ID Req Frame\xff\xff\xff\xff"), func(o *efOutcome) error {
			if o.Requests != 0 || o.Established {
				return fmt.Errorf("a bad Request made %d connection requests", o.Requests)
			}
			return nil
		}},
		{"responder/RST mid-Request", efNew(resp, efTCPFull, 0x12).handshake().handshake().
			mpa(0x02, 0, "", 9).op(efRST, 0), efWantNotEstablished},
		{"responder/FIN after Request", efNew(resp, efTCPFull, 0x12).handshake().handshake().
			mpa(0x02, 0, "hi").op(efFIN).op(efConsumer, accept...), nil},
		{"responder/reject with private data", efNew(resp, efTCPFull, 0x12).handshake().handshake().
			mpa(0x02, 0, "hi").op(efConsumer, 1|3<<3, 'n', 'o', '!'), efWantNotEstablished},
		{"responder/FPDUs before the Reply", efNew(resp, efTCPFull, 0x12).handshake().handshake().
			mpa(0x02, 0, "").write(efRW, 0, 32).op(efConsumer, accept...).send(8), efWantEstablished},
		{"responder/accept then hostile FPDUs", efNew(resp, efTCPFull, 0x12).handshake().handshake().
			mpa(0x02, 0, "").postRecv(0, 64).op(efConsumer, accept...).send(64).write(efRW, 4, 100).
			readReq(efSrc, 100).write(efSink, 0, 4), efWantEstablished},
		{"responder/peer-to-peer", efNew(resp|efPeerToPeer|efGraceful, efTCPFull, 0x12).handshake().handshake().
			mpa(0x0a, byte(mpa.RTRWrite), "").postRecv(0, 100).op(efConsumer, accept...).rtrWrite().send(50).
			readReq(efRW, 64).atomic(0, efRW, 0).op(efFIN), efWantEstablished},
		{"responder/peer-to-peer without RTR", efNew(resp|efPeerToPeer, efTCPFull, 0x12).handshake().handshake().
			mpa(0x0a, 0x02, "").op(efConsumer, accept...).send(8), efWantEstablished},
		{"responder/request never answered", efNew(resp, efTCPFull, 0x12).handshake().handshake().
			mpa(0x02, 0, "").wait(14), efWantNotEstablished},
		{"responder/no Request", efNew(resp, efTCPFull, 0x12).handshake().handshake().wait(14),
			efWantNotEstablished},
		{"responder/listener closed with a request waiting", efNew(resp, efTCPFull, 0x12).handshake().handshake().
			mpa(0x02, 0, "").op(efConsumer, 4), efWantNotEstablished},
	}
}

// TestEngineFuzzSeeds runs the hostile peers of efCases through the fuzz
// harness: every invariant of FuzzEngineConn, and what the consumer must
// see.
func TestEngineFuzzSeeds(t *testing.T) {
	for _, c := range efCases() {
		t.Run(c.name, func(t *testing.T) {
			o, err := efRunWatched(c.script)
			if err != nil {
				t.Fatal(err)
			}
			if testing.Verbose() {
				t.Logf("events %v\n  %s", o.Events, strings.Join(o.Trace, "\n  "))
			}
			if c.want != nil {
				if err := c.want(o); err != nil {
					t.Fatalf("%v (events %v, connection %v)", err, o.Events, o.ConnErr)
				}
			}
		})
	}
}
